"""Typed netlink errors: the kernel's errno and its extack text, never a bare integer.

The kernel answers a refused request with NLMSG_ERROR: a negative errno, the request's header
(its whole body too unless NETLINK_CAP_ACK), and, with NETLINK_EXT_ACK, TLVs whose
NLMSGERR_ATTR_MSG is the human reason ("Specified filter kind not found", "Mismatch between
action and filter offload flags"). pyroute2 0.9.7 surfaces the same text when the socket is
opened with `IPRoute(ext_ack=True)`: `NetlinkError.code` is the errno and `args[1]` the
extack message (or strerror without one); `from_netlink_error` maps that too.
"""

from __future__ import annotations

import errno as errnos
import os
import struct
from dataclasses import dataclass
from typing import ClassVar

from thorn_programmer.netlink.constants import NLMSG_ERROR, NLMSG_HDR_LEN, NlmFlag

# enum nlmsgerr_attrs
NLMSGERR_ATTR_MSG = 1
NLMSGERR_ATTR_OFFS = 2

_NLMSGHDR = struct.Struct("=IHHII")


class TcError(OSError):
    """The kernel refused a TC request. `errno`, `extack` and where it came from."""

    code: ClassVar[int | None] = None

    def __init__(
        self,
        errno: int,
        extack: str | None = None,
        *,
        msg_type: int | None = None,
        seq: int | None = None,
        index: int | None = None,
        attr_offset: int | None = None,
    ) -> None:
        super().__init__(errno, os.strerror(errno))
        self.extack = extack
        self.msg_type = msg_type
        self.seq = seq
        self.index = index  # position in a batch
        self.attr_offset = attr_offset  # byte offset of the offending attribute

    def __str__(self) -> str:
        text = f"[Errno {self.errno}] {self.strerror}"
        if self.extack:
            text += f": {self.extack}"
        if self.index is not None:
            text += f" (batch message {self.index})"
        return text

    def __reduce__(self) -> tuple[object, ...]:
        return (tc_error, (self.errno, self.extack))


class TcInvalidError(TcError):
    """EINVAL: the kernel does not accept these attributes (see `extack`)."""

    code = errnos.EINVAL


class TcNotFoundError(TcError):
    """ENOENT: no such filter, action, qdisc, or the module (cls_flower...) is missing."""

    code = errnos.ENOENT


class TcExistsError(TcError):
    """EEXIST: add of a filter handle or action index that is taken."""

    code = errnos.EEXIST


class TcNotSupportedError(TcError):
    """EOPNOTSUPP: e.g. skip_sw on a device that cannot offload."""

    code = errnos.EOPNOTSUPP


_BY_ERRNO: dict[int, type[TcError]] = {
    cls.code: cls
    for cls in (TcInvalidError, TcNotFoundError, TcExistsError, TcNotSupportedError)
    if cls.code is not None
}


def tc_error(errno: int, extack: str | None = None, **context: int | None) -> TcError:
    """The typed exception for a (positive) errno; `context` as TcError's keywords."""
    return _BY_ERRNO.get(errno, TcError)(errno, extack, **context)


def from_netlink_error(exc: Exception) -> TcError:
    """Map pyroute2's NetlinkError (code, message) onto the typed hierarchy."""
    code = int(getattr(exc, "code", 0)) or errnos.EIO
    text = exc.args[1] if len(exc.args) > 1 and isinstance(exc.args[1], str) else None
    extack = text if text and text != os.strerror(code) else None
    error = tc_error(code, extack)
    error.__cause__ = exc
    return error


@dataclass(frozen=True, slots=True)
class Ack:
    """One NLMSG_ERROR message: errno 0 is a plain ack."""

    seq: int
    errno: int
    msg_type: int
    extack: str | None = None
    attr_offset: int | None = None

    def error(self, index: int | None = None) -> TcError:
        context = {"msg_type": self.msg_type, "seq": self.seq, "attr_offset": self.attr_offset}
        return tc_error(self.errno, self.extack, index=index, **context)


def parse_ack(data: bytes | bytearray | memoryview, offset: int = 0) -> Ack:
    """Decode the NLMSG_ERROR (or a dump's NLMSG_DONE) message at `offset`, header included."""
    length, mtype, flags, seq, _pid = _NLMSGHDR.unpack_from(data, offset)
    end = offset + length
    pos = offset + NLMSG_HDR_LEN
    (error,) = struct.unpack_from("=i", data, pos)
    pos += 4
    echoed_type = mtype
    if mtype == NLMSG_ERROR:
        # The request's header comes back, and its body too unless the kernel capped it.
        echoed_len, echoed_type = struct.unpack_from("=IH", data, pos)
        pos += NLMSG_HDR_LEN if flags & NlmFlag.CAPPED else (echoed_len + 3) & ~3
    extack: str | None = None
    attr_offset: int | None = None
    while flags & NlmFlag.ACK_TLVS and pos + 4 <= end:
        nla_len, nla_type = struct.unpack_from("=HH", data, pos)
        if nla_len < 4:
            break
        payload = bytes(data[pos + 4 : pos + nla_len])
        if nla_type == NLMSGERR_ATTR_MSG:
            extack = payload.rstrip(b"\0").decode(errors="replace")
        elif nla_type == NLMSGERR_ATTR_OFFS and len(payload) >= 4:
            (attr_offset,) = struct.unpack_from("=I", payload)
        pos += (nla_len + 3) & ~3
    return Ack(seq=seq, errno=-error, msg_type=echoed_type, extack=extack, attr_offset=attr_offset)


class TcDecodeError(ValueError):
    """A message is not what the decoder models (another kind, a classifier head...)."""


class TcBatchError(Exception):
    """Some messages of a batch were refused; every refusal is in `errors`, with its index."""

    def __init__(self, errors: list[TcError], total: int, *, sendmsgs: int = 0) -> None:
        self.errors = errors
        self.total = total
        self.sendmsgs = sendmsgs  # sendmsg calls made, the refused messages' included
        first = errors[0]
        super().__init__(f"{len(errors)} of {total} messages refused; first: {first}")
