"""The GPU fence on cgroup v2: a BPF device program (BPF_PROG_TYPE_CGROUP_DEVICE) attached to a
job's cgroup that denies the character devices of the GPUs the job was not given and allows
every other device, as systemd's DeviceAllow= and Slurm's ConstrainDevices do on v2.

The program is a few instructions, assembled here and loaded with the bpf(2) system call
through ctypes (no compiler, no libbpf): load the device type, major and minor from the
`bpf_cgroup_dev_ctx`; a character device whose (major, minor) is denied gets 0 (EPERM), any
other 1. It stays attached until the cgroup is removed. Needs root (CAP_BPF or CAP_SYS_ADMIN).
"""

from __future__ import annotations

import os
import platform
import struct
from collections.abc import Sequence

_NR_BPF = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351}.get(platform.machine())
_PROG_LOAD, _PROG_ATTACH = 5, 8
_PROG_TYPE_CGROUP_DEVICE, _ATTACH_CGROUP_DEVICE = 15, 6
_DEV_CHAR = 2  # BPF_DEVCG_DEV_CHAR
# opcodes
_LDX_W = 0x61  # r_dst = *(u32 *)(r_src + off)
_AND32_K = 0x54  # w_dst &= imm
_JNE_K = 0x55  # if r_dst != imm: pc += off
_JEQ_K = 0x15  # if r_dst == imm: pc += off
_MOV64_K = 0xB7  # r_dst = imm
_EXIT = 0x95


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def program(denied: Sequence[tuple[int, int]]) -> bytes:
    """The instructions: deny the character devices `denied` ((major, minor) pairs), allow the rest."""
    checks: list[bytes] = []
    allow_at = 5 + 2 * len(denied)
    deny_at = allow_at + 2
    for i, (major, minor) in enumerate(denied):
        pos = 5 + 2 * i
        checks.append(_insn(_JNE_K, 3, off=1, imm=major))  # another major: the next pair
        checks.append(_insn(_JEQ_K, 4, off=deny_at - (pos + 1) - 1, imm=minor))
    return b"".join([
        _insn(_LDX_W, 2, 1, 0),  # r2 = ctx->access_type
        _insn(_AND32_K, 2, imm=0xFFFF),  # the device type (the access is in the upper half)
        _insn(_JNE_K, 2, off=allow_at - 3, imm=_DEV_CHAR),  # not a character device: allow
        _insn(_LDX_W, 3, 1, 4),  # r3 = ctx->major
        _insn(_LDX_W, 4, 1, 8),  # r4 = ctx->minor
        *checks,
        _insn(_MOV64_K, 0, imm=1), _insn(_EXIT),  # allow
        _insn(_MOV64_K, 0, imm=0), _insn(_EXIT),  # deny
    ])


def _bpf(cmd: int, attr: bytes) -> int:
    import ctypes

    if _NR_BPF is None:
        raise OSError(38, f"bpf(2) on {platform.machine()} is not known here")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    buf = ctypes.create_string_buffer(attr, 128)
    result = libc.syscall(_NR_BPF, cmd, buf, 128)
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(result)


def load(denied: Sequence[tuple[int, int]]) -> int:
    """Load the program; its file descriptor (OSError when the kernel refuses)."""
    import ctypes

    code = program(denied)
    insns = ctypes.create_string_buffer(code, len(code))
    license_ = ctypes.create_string_buffer(b"GPL")
    attr = struct.pack("<IIQQ", _PROG_TYPE_CGROUP_DEVICE, len(code) // 8, ctypes.addressof(insns),
                       ctypes.addressof(license_))
    return _bpf(_PROG_LOAD, attr)


def deny_devices(cgroup_dir: str, denied: Sequence[tuple[int, int]]) -> None:
    """Attach a program denying `denied` to the v2 cgroup `cgroup_dir`."""
    prog = load(denied)
    try:
        folder = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            _bpf(_PROG_ATTACH, struct.pack("<IIII", folder, prog, _ATTACH_CGROUP_DEVICE, 0))
        finally:
            os.close(folder)
    finally:
        os.close(prog)


def supported() -> bool:
    """Can this process load a device program (root, a kernel with cgroup BPF)?"""
    try:
        os.close(load([(195, 0)]))
        return True
    except (OSError, AttributeError):
        return False
