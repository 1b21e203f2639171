"""Two tiny eBPF programs for tc's ingress hook, and the bpf(2) call that loads them.

This kernel has no netem, act_gact or matchall, so a qdisc or a `drop` action cannot lose
packets. cls_bpf in direct-action mode can: its program's return value is the verdict
(TC_ACT_SHOT drops, TC_ACT_UNSPEC lets the packet go on), with no action module at all.

- `drop_all()`: ``r0 = TC_ACT_SHOT; exit`` (a silent drop: carrier stays up);
- `drop_fraction(percent)`: ``if (u32)bpf_get_prandom_u32() < percent% of 2^32`` drop,
  else continue.

The instruction bytes are built here (pure, unit-tested); `load` hands them to the kernel
and returns a program descriptor that the tc filter keeps alive once attached.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct

__all__ = ["drop_all", "drop_fraction", "load", "threshold"]

BPF_PROG_LOAD = 5
BPF_PROG_TYPE_SCHED_CLS = 3
TC_ACT_UNSPEC = -1
TC_ACT_SHOT = 2
FUNC_GET_PRANDOM_U32 = 7
_SYSCALL_BPF = {"x86_64": 321, "aarch64": 280}

# Opcodes (linux/bpf.h): class | op | source.
_MOV64_IMM = 0x07 | 0xB0 | 0x00  # BPF_ALU64 | BPF_MOV | BPF_K
_CALL = 0x05 | 0x80  # BPF_JMP | BPF_CALL
_EXIT = 0x05 | 0x90  # BPF_JMP | BPF_EXIT
_JLT32_IMM = 0x06 | 0xA0 | 0x00  # BPF_JMP32 | BPF_JLT | BPF_K: unsigned 32-bit compare
_LICENSE = b"Apache-2.0"  # only GPL-only helpers care; bpf_get_prandom_u32 is not one
_LOG_SIZE = 4096
_ATTR_SIZE = 128  # bigger than this kernel's union bpf_attr part we fill; the rest is zero


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhI", code, (src << 4) | dst, off, imm & 0xFFFFFFFF)


def threshold(percent: float) -> int:
    """The u32 below which a random number means "drop" for `percent` (0 < percent < 100)."""
    if not 0 < percent < 100:
        raise ValueError(f"loss must be above 0 and below 100 percent, not {percent}")
    return min(round(percent / 100 * 2**32), 2**32 - 1)


def drop_all() -> bytes:
    return _insn(_MOV64_IMM, imm=TC_ACT_SHOT) + _insn(_EXIT)


def drop_fraction(percent: float) -> bytes:
    return b"".join(
        [
            _insn(_CALL, imm=FUNC_GET_PRANDOM_U32),
            _insn(_JLT32_IMM, dst=0, off=2, imm=threshold(percent)),  # to the drop below
            _insn(_MOV64_IMM, imm=TC_ACT_UNSPEC),
            _insn(_EXIT),
            _insn(_MOV64_IMM, imm=TC_ACT_SHOT),
            _insn(_EXIT),
        ]
    )


def load(program: bytes, name: str) -> int:
    """Load a sched_cls program; return its fd (close it once a filter holds the program)."""
    number = _SYSCALL_BPF.get(platform.machine())
    if number is None:
        raise OSError(f"no bpf(2) syscall number known for {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    insns = ctypes.create_string_buffer(program, len(program))
    licence = ctypes.create_string_buffer(_LICENSE)
    log = ctypes.create_string_buffer(_LOG_SIZE)
    attr = struct.pack(
        "<IIQQIIQII16s",
        BPF_PROG_TYPE_SCHED_CLS,
        len(program) // 8,
        ctypes.addressof(insns),
        ctypes.addressof(licence),
        1,  # log level: the verifier explains a refusal
        _LOG_SIZE,
        ctypes.addressof(log),
        0,  # kern_version
        0,  # prog_flags
        name.encode()[:15],
    )
    buffer = ctypes.create_string_buffer(attr, _ATTR_SIZE)
    fd = int(libc.syscall(number, BPF_PROG_LOAD, buffer, _ATTR_SIZE))
    if fd < 0:
        code = ctypes.get_errno()
        detail = log.value.decode(errors="replace").strip()
        raise OSError(code, f"loading BPF program {name}: {os.strerror(code)} {detail}".strip())
    return fd
