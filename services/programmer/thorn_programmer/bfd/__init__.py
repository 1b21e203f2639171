"""BFD: the RFC 5880 control packet codec and session state machine (pure), and the runtime.

The codec and sessions have no sockets, timers or threads: the runtime (`BfdManager`, owning
the UDP 3784/4784 sockets of RFC 5881/5883) feeds packets and the clock in and carries out the
returned actions. `BfdProcess` runs a manager in a child process (same API, own GIL).
"""

from thorn_programmer.bfd.auth import AUTH_DROP_REASONS, AuthKey, AuthType, BfdAuth
from thorn_programmer.bfd.codec import (
    CONTROL_PACKET_LENGTH,
    AuthSection,
    ControlPacket,
    DecodeError,
    Diag,
    Refusal,
    State,
    decode,
)
from thorn_programmer.bfd.events import (
    DROP_REASONS,
    BfdEvent,
    Counters,
    EventQueue,
    SessionStatus,
)
from thorn_programmer.bfd.manager import BfdManager
from thorn_programmer.bfd.process import BfdProcess
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
    "AUTH_DROP_REASONS",
    "CONTROL_PACKET_LENGTH",
    "DROP_REASONS",
    "SLOW_TX_US",
    "Action",
    "AuthKey",
    "AuthSection",
    "AuthType",
    "BfdAuth",
    "BfdEvent",
    "BfdManager",
    "BfdProcess",
    "ControlPacket",
    "Counters",
    "DecodeError",
    "Diag",
    "EventQueue",
    "Refusal",
    "Send",
    "Session",
    "SessionConfig",
    "SessionStatus",
    "State",
    "StateChange",
    "decode",
    "jittered_interval_us",
]
