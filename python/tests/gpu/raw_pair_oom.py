#!/usr/bin/env python3
"""Issue 34, item 8, on a real GPU: the bare pair, loaded as PyTorch's documentation
shows (``CUDAPluggableAllocator(path, "flare_torch_alloc", "flare_torch_free")`` and
``change_current_allocator``, no ``flare_package.install()``, so no out-of-memory
handler is set), must raise on a failed allocation instead of handing PyTorch NULL,
which PyTorch wraps in a tensor at address 0 (pytorch #133280). The library finds
PyTorch's ``c10::detail::torchCheckFail`` in the process itself.

    cargo clib
    python3 python/tests/gpu/raw_pair_oom.py [LIBRARY]

LIBRARY: the shared library (default: ``$FLARE_PACKAGE_LIB``, else the checkout's
``target/release/libflare_package.so``). Each case runs in a process of its own (the
allocator and the lookup are per process):

  raises   a request larger than the device (200 GiB) and the device filled with
           10 GiB tensors: each raises (RuntimeError or torch.OutOfMemoryError)
           naming the request, no tensor comes back; then the freed memory serves
           a 1 GiB tensor that computes right.
  null     FLARE_TORCH_OOM=null: the old behaviour on purpose, a tensor at address 0
           (never touched).

Prints one JSON line per case and a summary; exit 0 when every check passed.
Before the fix, ``raises`` fails: ``torch.empty`` returns a tensor whose
``data_ptr()`` is 0. Seen on an H100 with PyTorch 2.11.0+cu130: before, the 200 GiB
request and every 10 GiB request past the seventh returned a tensor at 0x0; after,
both raise a RuntimeError with the library's message. There the diagnostic said
that the global scope has no torchCheckFail (Python imports PyTorch ``RTLD_LOCAL``):
the library found it through ``libc10.so`` (``dlopen`` with ``RTLD_NOLOAD``).
"""

import json
import os
import pathlib
import subprocess
import sys

GIB = 1 << 30
HERE = pathlib.Path(__file__).resolve()
REPO = HERE.parents[3]
TORCH_CHECK_FAIL = "_ZN3c106detail14torchCheckFailEPKcS2_jS2_"


def library(argv):
    if len(argv) > 1:
        return pathlib.Path(argv[1]).resolve()
    env = os.environ.get("FLARE_PACKAGE_LIB")
    if env:
        return pathlib.Path(env).resolve()
    return REPO / "target" / "release" / "libflare_package.so"


def child(case, path):
    """One case in this process; returns the checks as (name, ok, detail)."""
    import ctypes

    import torch

    checks = []

    def check(name, ok, detail=""):
        checks.append((name, bool(ok), str(detail)[:400]))

    alloc = torch.cuda.memory.CUDAPluggableAllocator(str(path), "flare_torch_alloc", "flare_torch_free")
    torch.cuda.memory.change_current_allocator(alloc)
    # Where the library will find torchCheckFail: the global scope (RTLD_DEFAULT)
    # or, as Python imports PyTorch RTLD_LOCAL, only libc10.so itself.
    check("diagnostic: torchCheckFail in the global scope", True, hasattr(ctypes.CDLL(None), TORCH_CHECK_FAIL))
    x = torch.ones(1 << 20, device="cuda")
    check("a small tensor works", x.data_ptr() != 0 and float(x.sum()) == float(1 << 20), x.data_ptr())

    def attempt(size):
        """(tensor or None, exception or None) of torch.empty(size bytes)."""
        try:
            return torch.empty(size, dtype=torch.uint8, device="cuda"), None
        except Exception as e:  # noqa: BLE001
            return None, e

    if case == "null":
        t, e = attempt(200 * GIB)
        check(
            "FLARE_TORCH_OOM=null: a tensor at address 0, no exception (the old behaviour)",
            e is None and t is not None and t.data_ptr() == 0,
            e if e is not None else t.data_ptr(),
        )
        del t  # its free is flare_torch_free(NULL): nothing
        return checks

    t, e = attempt(200 * GIB)
    check(
        "too large: raises, no tensor",
        t is None and isinstance(e, RuntimeError) and f"request of {200 * GIB} bytes" in str(e),
        f"{type(e).__name__}: {e}" if e is not None else f"a tensor at {t.data_ptr():#x}",
    )
    chunks, e = [], None
    for _ in range(40):
        t, e = attempt(10 * GIB)
        if t is None:
            break
        chunks.append(t)
    at_zero = sum(1 for c in chunks if c.data_ptr() == 0)
    check("device filling: no tensor at address 0", at_zero == 0, f"{at_zero} of {len(chunks)}")
    check(
        "device full: raises, no tensor",
        e is not None and isinstance(e, RuntimeError) and f"request of {10 * GIB} bytes" in str(e),
        f"after {len(chunks)} x 10 GiB: {type(e).__name__}: {e}" if e is not None else "40 x 10 GiB fitted",
    )
    del chunks
    torch.cuda.synchronize()
    y = torch.full((GIB // 4,), 2.0, device="cuda")
    check("after: the freed memory serves 1 GiB that computes right", float(y.sum()) == 2.0 * (GIB // 4), y.data_ptr())
    return checks


def main(argv):
    if len(argv) > 2 and argv[1] == "--child":
        checks = child(argv[2], pathlib.Path(argv[3]))
        print(json.dumps({"case": argv[2], "checks": checks}))
        return 0
    path = library(argv)
    if not path.is_file():
        print(f"no library at {path}: cargo clib", file=sys.stderr)
        return 2
    failed = 0
    for case, extra in [("raises", {}), ("null", {"FLARE_TORCH_OOM": "null"})]:
        env = {k: v for k, v in os.environ.items() if k != "FLARE_TORCH_OOM"}
        env.update(extra)
        r = subprocess.run(
            [sys.executable, str(HERE), "--child", case, str(path)],
            env=env, capture_output=True, text=True, timeout=600,
        )
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
        if r.returncode != 0 or not lines:
            failed += 1
            print(json.dumps({"case": case, "error": f"exit {r.returncode}", "stderr": r.stderr[-2000:]}))
            continue
        result = json.loads(lines[-1])
        print(json.dumps(result))
        failed += sum(1 for _, ok, _ in result["checks"] if not ok)
    print(f"raw_pair_oom: {'all passed' if failed == 0 else f'{failed} failed'}")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
