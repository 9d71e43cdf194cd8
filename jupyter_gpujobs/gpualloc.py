"""Hold GPU memory, for tests, demos and checks, without a framework:

    python -m jupyter_gpujobs.gpualloc 23G [--seconds 60]

- on fake GPUs (the job's environment has GPUJOBS_FAKE=1 or GPUJOBS_FAKE_GPU_USE): the process
  declares the amount to the fake backend (it runs again with GPUJOBS_FAKE_MEM_MB set, which
  the backend reads as this process's GPU memory, engine/gpus/fake.py) and holds it;
- on real GPUs: it allocates the amount on the first visible device with `cuMemAlloc` from
  the driver library (libcuda, through ctypes) and touches it, so NVML reports it as the
  process's used memory.

It prints one line once the memory is held ("gpualloc: holding 23.0 GiB on ...") and holds it
until `--seconds` pass (default: until stopped), then exits 0. It exits 1 with the driver's
message when the allocation fails (e.g. CUDA_ERROR_OUT_OF_MEMORY), 2 on a bad argument.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time

from .model import InvalidInput, parse_memory


def _fake() -> bool:
    return os.environ.get("GPUJOBS_FAKE") == "1" or "GPUJOBS_FAKE_GPU_USE" in os.environ


def _hold(seconds: float | None) -> None:
    end = None if seconds is None else time.monotonic() + seconds
    while end is None or time.monotonic() < end:
        time.sleep(0.5 if end is None else max(0.0, min(0.5, end - time.monotonic())))


def _cuda_error(lib: ctypes.CDLL, code: int) -> str:
    name = ctypes.c_char_p()
    try:
        lib.cuGetErrorName(code, ctypes.byref(name))
    except Exception:
        pass
    return name.value.decode() if name.value else f"CUDA error {code}"


def allocate_real(size: int) -> tuple[ctypes.CDLL, int]:
    """cuInit, a context on device 0 (the first of CUDA_VISIBLE_DEVICES), cuMemAlloc(size) and a
    memset that makes the pages resident. Returns (the library, the device pointer); raises
    OSError with the driver's error name."""
    lib = None
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    if lib is None:
        raise OSError("libcuda (the NVIDIA driver library) is not found on this machine")

    def check(what: str, code: int) -> None:
        if code != 0:
            raise OSError(f"{what}: {_cuda_error(lib, code)}")

    check("cuInit", lib.cuInit(0))
    device = ctypes.c_int()
    check("cuDeviceGet", lib.cuDeviceGet(ctypes.byref(device), 0))
    context = ctypes.c_void_p()
    check("cuCtxCreate", lib.cuCtxCreate_v2(ctypes.byref(context), 0, device))
    pointer = ctypes.c_uint64()
    check(f"cuMemAlloc of {size} bytes", lib.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(size)))
    check("cuMemsetD8", lib.cuMemsetD8_v2(pointer, ctypes.c_ubyte(1), ctypes.c_size_t(size)))
    check("cuCtxSynchronize", lib.cuCtxSynchronize())
    return lib, pointer.value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jupyter_gpujobs.gpualloc",
                                     description="Hold GPU memory (fake GPUs: declared; real GPUs: cuMemAlloc).")
    parser.add_argument("size", help="how much, e.g. 23G, 512M (a plain number is megabytes)")
    parser.add_argument("--seconds", type=float, default=None, help="hold it this long (default: until stopped)")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    try:
        size = parse_memory(args.size, "size")
    except InvalidInput as err:
        print(f"gpualloc: {err}", file=sys.stderr)
        return 2
    where = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if _fake():
        mb = str(max(1, size >> 20))
        if os.environ.get("GPUJOBS_FAKE_MEM_MB") != mb:
            # the fake backend reads a process's environment: run again with the amount in it
            env = {**os.environ, "GPUJOBS_FAKE_MEM_MB": mb}
            os.execve(sys.executable, [sys.executable, "-m", "jupyter_gpujobs.gpualloc", *argv], env)
        print(f"gpualloc: holding {size / 2**30:.1f} GiB on fake GPU(s) {where or '(none)'}", flush=True)
    else:
        try:
            allocate_real(size)
        except OSError as err:
            print(f"gpualloc: could not allocate {size / 2**30:.1f} GiB on GPU(s) {where or '(all)'}: {err}",
                  file=sys.stderr, flush=True)
            return 1
        print(f"gpualloc: holding {size / 2**30:.1f} GiB on GPU(s) {where or '(all)'} (pid {os.getpid()})",
              flush=True)
    try:
        _hold(args.seconds)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
