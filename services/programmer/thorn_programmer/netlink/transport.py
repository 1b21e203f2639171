"""`TcSocket`: prebuilt TC requests over a raw NETLINK_ROUTE socket, one or many per sendmsg.

Why not pyroute2's IPRoute for sending: its `tc()` re-encodes each call with its own tcmsg
(no flower, no RTM_*ACTION), and a bulk install wants many messages per sendmsg with the acks
matched back by sequence number. rtnetlink handles a sendmsg synchronously, message after
message, carrying on past a refused one: when `send` returns, every ack of that buffer is
already queued on the socket. So a batch is: stamp sequence numbers, send a buffer, drain
its acks, map each error to its message. NETLINK_EXT_ACK brings the kernel's reason,
NETLINK_CAP_ACK keeps error acks small (no echo of the request).
"""

from __future__ import annotations

import ctypes
import errno as errnos
import os
import socket
import struct
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType

from thorn_programmer.netlink.constants import (
    NETLINK_CAP_ACK,
    NETLINK_EXT_ACK,
    NLMSG_DONE,
    NLMSG_ERROR,
    SOL_NETLINK,
    TC_H_INGRESS,
    NlmFlag,
)
from thorn_programmer.netlink.decode import decode_action, decode_filters
from thorn_programmer.netlink.errors import TcBatchError, TcError, TcNotFoundError, parse_ack
from thorn_programmer.netlink.messages import action_dump, action_get, filter_dump
from thorn_programmer.netlink.models import ActionState, FilterState

CLONE_NEWNET = 0x40000000
NETLINK_ROUTE = 0
_SO_SNDBUFFORCE = 32
_SO_RCVBUFFORCE = 33
_NLM_F_DUMP_INTR = 0x10
_HDR = struct.Struct("=IHHII")
_SEQ = struct.Struct("=I")
_FLAGS = struct.Struct("=H")
_RECV_SIZE = 1 << 18
_U32 = 0xFFFFFFFF


def _setns(fd: int) -> None:
    # os.setns arrives in Python 3.12; the call is per thread, as wanted here.
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _buffer(sock: socket.socket, force: int, plain: int, size: int) -> None:
    # The *FORCE options pass rmem_max/wmem_max as root; otherwise take what is allowed.
    try:
        sock.setsockopt(socket.SOL_SOCKET, force, size)
    except PermissionError:
        sock.setsockopt(socket.SOL_SOCKET, plain, size)


def _new_socket(rcvbuf: int, sndbuf: int) -> socket.socket:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_ROUTE)
    try:
        sock.setsockopt(SOL_NETLINK, NETLINK_EXT_ACK, 1)
        sock.setsockopt(SOL_NETLINK, NETLINK_CAP_ACK, 1)
        _buffer(sock, _SO_RCVBUFFORCE, socket.SO_RCVBUF, rcvbuf)
        _buffer(sock, _SO_SNDBUFFORCE, socket.SO_SNDBUF, sndbuf)
        sock.bind((0, 0))
    except BaseException:
        sock.close()
        raise
    return sock


def socket_in_netns(netns: str | None, make: Callable[[], socket.socket]) -> socket.socket:
    """The socket `make` opens, opened in `netns` (a name under /run/netns or a path); a
    socket stays in the namespace it was made in. This thread returns home after."""
    if netns is None:
        return make()
    path = netns if netns.startswith("/") else f"/run/netns/{netns}"
    with open("/proc/thread-self/ns/net", "rb") as home, open(path, "rb") as target:
        _setns(target.fileno())
        try:
            return make()
        finally:
            _setns(home.fileno())


def open_socket(netns: str | None, rcvbuf: int, sndbuf: int) -> socket.socket:
    """A NETLINK_ROUTE socket in `netns` (a name under /run/netns or a path); it stays there."""
    return socket_in_netns(netns, lambda: _new_socket(rcvbuf, sndbuf))


class TcSocket:
    """Requests, dumps and batches of prebuilt TC messages (see `messages`).

    Not thread-safe: one per thread. `timeout` bounds every wait for the kernel.
    """

    def __init__(
        self,
        netns: str | None = None,
        *,
        rcvbuf: int = 8 << 20,
        sndbuf: int = 4 << 20,
        timeout: float = 30.0,
    ) -> None:
        self._sock = open_socket(netns, rcvbuf, sndbuf)
        self._sock.settimeout(timeout)
        self._seq = 0

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> TcSocket:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _reserve(self, count: int) -> int:
        first = (self._seq + 1) & _U32
        self._seq = (self._seq + count) & _U32
        return first

    def _messages(self) -> Iterator[tuple[int, int, int, bytes]]:
        """(type, flags, seq, whole message) for everything the kernel sends, forever."""
        while True:
            data = self._sock.recv(_RECV_SIZE)
            offset = 0
            while offset + 16 <= len(data):
                length, mtype, flags, seq, _pid = _HDR.unpack_from(data, offset)
                if length < 16:
                    break
                yield mtype, flags, seq, data[offset : offset + length]
                offset += (length + 3) & ~3

    def _send(self, msg: bytes) -> Iterator[tuple[int, int, bytes]]:
        """Send one message; (type, flags, message) of everything answering its sequence."""
        seq = self._reserve(1)
        data = bytearray(msg)
        _SEQ.pack_into(data, 8, seq)
        self._sock.send(data)
        return ((t, f, raw) for t, f, got, raw in self._messages() if got == seq)

    def request(self, msg: bytes) -> list[bytes]:
        """Send one acked request; return the replies before its ack (for a get)."""
        replies: list[bytes] = []
        for mtype, _flags, raw in self._send(msg):
            if mtype != NLMSG_ERROR:
                replies.append(raw)
                continue
            ack = parse_ack(raw)
            if ack.errno:
                raise ack.error()
            return replies
        raise AssertionError("unreachable: _messages never ends")

    def dump(self, msg: bytes) -> list[bytes]:
        """Send a dump request; return every message up to NLMSG_DONE."""
        parts: list[bytes] = []
        for mtype, flags, raw in self._send(msg):
            if mtype in (NLMSG_ERROR, NLMSG_DONE):
                ack = parse_ack(raw)
                if ack.errno:
                    raise ack.error()
                if mtype == NLMSG_DONE:
                    return parts
            elif flags & _NLM_F_DUMP_INTR:
                raise TcError(errnos.EINTR, "dump interrupted by a concurrent change: retry")
            else:
                parts.append(raw)
        raise AssertionError("unreachable: _messages never ends")

    def send_batch(
        self, msgs: Sequence[bytes], *, chunk_bytes: int = 1 << 16, ack_each: bool = False
    ) -> int:
        """Send prebuilt requests, many per sendmsg; return the number of sendmsg calls.

        The kernel applies every message it accepts; refused ones raise one TcBatchError at
        the end listing each refusal (typed, with extack and the message's index). With
        `ack_each=False` only the last message of each buffer asks for an ack: errors are
        acked anyway, so success costs no ack at all.
        """
        if not msgs:
            return 0
        first = self._reserve(len(msgs))
        errors: list[TcError] = []
        calls = 0
        start = 0
        while start < len(msgs):
            stop, size = start + 1, len(msgs[start])
            while stop < len(msgs) and size + len(msgs[stop]) <= chunk_bytes:
                size += len(msgs[stop])
                stop += 1
            self._sock.send(self._chunk(msgs, start, stop, first, ack_each))
            calls += 1
            self._drain(first, start, stop, errors)
            start = stop
        if errors:
            raise TcBatchError(errors, len(msgs), sendmsgs=calls)
        return calls

    @staticmethod
    def _chunk(msgs: Sequence[bytes], start: int, stop: int, first: int, ack_each: bool) -> bytes:
        buf = bytearray(b"".join(msgs[start:stop]))
        offset = 0
        for index in range(start, stop):
            _SEQ.pack_into(buf, offset + 8, (first + index) & _U32)
            if not ack_each and index != stop - 1:
                (flags,) = _FLAGS.unpack_from(buf, offset + 6)
                # Plain ints: an IntFlag complement keeps only the bits it names (APPEND...).
                _FLAGS.pack_into(buf, offset + 6, flags & ~int(NlmFlag.ACK) & 0xFFFF)
            offset += len(msgs[index])
        return bytes(buf)

    def _drain(self, first: int, start: int, stop: int, errors: list[TcError]) -> None:
        last = (first + stop - 1) & _U32
        for mtype, _flags, seq, raw in self._messages():
            if mtype != NLMSG_ERROR:
                continue
            index = (seq - first) & _U32
            if not start <= index < stop:
                continue  # not ours (a late ack of an earlier request)
            ack = parse_ack(raw)
            if ack.errno:
                errors.append(ack.error(index))
            if seq == last:
                return

    def filters(self, ifindex: int, parent: int = TC_H_INGRESS) -> list[FilterState]:
        """Every flower filter under `parent` (classifier heads and other kinds skipped)."""
        return decode_filters(self.dump(filter_dump(ifindex, parent)))

    def actions(self, kind: str) -> list[ActionState]:
        """Every standalone or bound action of `kind` in this namespace."""
        return [state for raw in self.dump(action_dump(kind)) for state in decode_action(raw)]

    def action(self, kind: str, index: int) -> ActionState:
        """One action by index; TcNotFoundError when there is none."""
        for raw in self.request(action_get(kind, index)):
            states = decode_action(raw)
            if states:
                return states[0]
        raise TcNotFoundError(errnos.ENOENT, f"no {kind} action with index {index}")
