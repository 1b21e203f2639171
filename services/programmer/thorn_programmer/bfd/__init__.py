"""Pure BFD core: the RFC 5880 control packet codec and session state machine.

No sockets, timers or threads here: the runtime (a manager owning UDP 3784/4784 sockets, RFC
5881/5883) feeds packets and the clock in and carries out the returned actions.
"""

from thorn_programmer.bfd.codec import (
    CONTROL_PACKET_LENGTH,
    ControlPacket,
    DecodeError,
    Diag,
    Refusal,
    State,
    decode,
)
from thorn_programmer.bfd.session import (
    SLOW_TX_US,
    Action,
    Send,
    Session,
    SessionConfig,
    StateChange,
    jittered_interval_us,
)

__all__ = [
    "CONTROL_PACKET_LENGTH",
    "SLOW_TX_US",
    "Action",
    "ControlPacket",
    "DecodeError",
    "Diag",
    "Refusal",
    "Send",
    "Session",
    "SessionConfig",
    "State",
    "StateChange",
    "decode",
    "jittered_interval_us",
]
