"""Netlink refusals become typed errors carrying errno and the kernel's extack text."""

from __future__ import annotations

import errno
import struct

import pytest
from pyroute2.netlink.exceptions import NetlinkError

from thorn_programmer.netlink import (
    TcBatchError,
    TcError,
    TcExistsError,
    TcInvalidError,
    TcNotFoundError,
    TcNotSupportedError,
    from_netlink_error,
)
from thorn_programmer.netlink.constants import NLMSG_DONE, NLMSG_ERROR, RTM_NEWTFILTER, NlmFlag
from thorn_programmer.netlink.errors import (
    NLMSGERR_ATTR_MSG,
    NLMSGERR_ATTR_OFFS,
    parse_ack,
    tc_error,
)


def nla(kind: int, payload: bytes) -> bytes:
    return struct.pack("=HH", 4 + len(payload), kind) + payload + b"\0" * (-len(payload) & 3)


def error_message(
    code: int, *, seq: int = 5, request: bytes | None = None, tlvs: bytes = b""
) -> bytes:
    """An NLMSG_ERROR as the kernel builds it (capped unless the request is echoed)."""
    flags = NlmFlag.ACK_TLVS if tlvs else 0
    if request is None:
        echoed = struct.pack("=IHHII", 64, RTM_NEWTFILTER, 0x605, seq, 0)
        flags |= NlmFlag.CAPPED
    else:
        echoed = request
    body = struct.pack("=i", -code) + echoed + tlvs
    return struct.pack("=IHHII", 16 + len(body), NLMSG_ERROR, flags, seq, 1234) + body


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (errno.EINVAL, TcInvalidError),
        (errno.ENOENT, TcNotFoundError),
        (errno.EEXIST, TcExistsError),
        (errno.EOPNOTSUPP, TcNotSupportedError),
        (errno.EPERM, TcError),
    ],
)
def test_each_errno_has_its_type(code: int, cls: type[TcError]) -> None:
    error = tc_error(code, "why")
    assert type(error) is cls and isinstance(error, TcError) and isinstance(error, OSError)
    assert (error.errno, error.extack) == (code, "why")


def test_the_message_shows_errno_extack_and_batch_position() -> None:
    error = tc_error(errno.EEXIST, "Filter already exists", index=12)
    assert str(error) == "[Errno 17] File exists: Filter already exists (batch message 12)"


def test_a_capped_ack_with_extack_tlvs() -> None:
    tlvs = nla(NLMSGERR_ATTR_MSG, b"Mismatch between action and filter offload flags\0")
    tlvs += nla(NLMSGERR_ATTR_OFFS, struct.pack("=I", 60))
    ack = parse_ack(error_message(errno.EINVAL, tlvs=tlvs))
    assert (ack.seq, ack.errno, ack.msg_type) == (5, errno.EINVAL, RTM_NEWTFILTER)
    assert ack.extack == "Mismatch between action and filter offload flags"
    assert ack.attr_offset == 60
    error = ack.error(index=3)
    assert isinstance(error, TcInvalidError) and error.index == 3 and error.seq == 5


def test_an_uncapped_ack_skips_the_echoed_request() -> None:
    request = struct.pack("=IHHII", 24, RTM_NEWTFILTER, 0x605, 9, 0) + b"\1" * 8
    tlvs = nla(NLMSGERR_ATTR_MSG, b"Parent Qdisc doesn't exists\0")
    ack = parse_ack(error_message(errno.EINVAL, seq=9, request=request, tlvs=tlvs))
    assert ack.extack == "Parent Qdisc doesn't exists" and ack.msg_type == RTM_NEWTFILTER


def test_a_plain_ack_is_errno_zero() -> None:
    ack = parse_ack(error_message(0))
    assert ack.errno == 0 and ack.extack is None


def test_a_failed_dump_ends_with_done_and_the_reason() -> None:
    body = struct.pack("=i", -errno.EOPNOTSUPP) + nla(NLMSGERR_ATTR_MSG, b"no dump\0")
    flags = NlmFlag.MULTI | NlmFlag.ACK_TLVS
    done = struct.pack("=IHHII", 16 + len(body), NLMSG_DONE, flags, 4, 0) + body
    error = parse_ack(done).error()
    assert isinstance(error, TcNotSupportedError) and error.extack == "no dump"


def test_pyroute2_netlink_errors_map_onto_the_same_types() -> None:
    # IPRoute(ext_ack=True) puts the kernel's text in args[1]; without it, strerror.
    with_extack = from_netlink_error(NetlinkError(errno.EEXIST, "Filter already exists"))
    assert isinstance(with_extack, TcExistsError)
    assert with_extack.extack == "Filter already exists"
    without = from_netlink_error(NetlinkError(errno.ENOENT))
    assert isinstance(without, TcNotFoundError) and without.extack is None
    assert isinstance(without.__cause__, NetlinkError)


def test_a_batch_error_lists_every_refusal() -> None:
    errors = [tc_error(errno.EEXIST, index=2), tc_error(errno.EINVAL, "bad", index=5)]
    batch = TcBatchError(errors, total=10)
    assert [e.index for e in batch.errors] == [2, 5] and batch.total == 10
    assert str(batch).startswith("2 of 10 messages refused; first: [Errno 17]")
