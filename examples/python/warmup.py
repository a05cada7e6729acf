"""flare-package under PyTorch: a forward's warm-up.

The weights stay, and each of 12 warm-up forwards (one per batch shape, say)
allocates a 1 GiB transient and frees it. Inside ``flare_package.retention()``
nothing freed is released (queued or captured GPU work may still touch it) and the
next transient reuses the freed memory: the allocator holds 4 + 1 GiB, not 4 + 12.

    python3 examples/python/warmup.py               # PyTorch on a GPU when there is one
    python3 examples/python/warmup.py --simulated   # no PyTorch, no GPU (what CI runs)

The package is the installed one (``pip install ./python``: the library inside it)
when there is one, else the checkout's (``python/``) with ``target/release`` of the
checkout's library, after ``cargo clib``. With ``--simulated``, the
simulated driver plays the GPU and this script calls the allocator's entry points
through ctypes the way PyTorch calls them (``flare_torch_alloc`` /
``flare_torch_free``), so the same warm-up runs without PyTorch.
"""

import pathlib
import sys

try:
    import flare_package
except ImportError:  # not installed: the checkout's package
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))
    import flare_package

GIB = 1 << 30


def warmup_torch():
    """What a PyTorch program writes (a GPU and PyTorch needed)."""
    import torch

    flare_package.install()  # every CUDA tensor of the process; before any CUDA work
    weights = torch.empty(4 * GIB, dtype=torch.uint8, device="cuda")
    with flare_package.retention():  # around warm-up and graph capture
        for _shape in range(12):
            transient = torch.empty(GIB, dtype=torch.uint8, device="cuda")
            del transient  # retained; the next one reuses it
    torch.cuda.synchronize()
    return weights


def warmup_simulated():
    """The same warm-up with the simulated driver as the GPU and this script as
    PyTorch (the calls PyTorch makes through the allocator's entry points)."""
    flare_package.use_simulated()  # before any allocation
    lib = flare_package.load()
    weights = lib.flare_torch_alloc(4 * GIB, 0, None)  # size, device, stream
    with flare_package.retention(0):
        for _shape in range(12):
            transient = lib.flare_torch_alloc(GIB, 0, None)
            lib.flare_torch_free(transient, GIB, 0, None)
    return weights


def main():
    import argparse

    parser = argparse.ArgumentParser(description="A forward's warm-up on flare-package.")
    parser.add_argument(
        "--simulated", action="store_true", help="the simulated driver as the GPU (no PyTorch, no GPU)"
    )
    simulated = parser.parse_args().simulated
    if not simulated:
        try:
            import torch

            simulated = not torch.cuda.is_available()
        except ImportError:
            simulated = True
    weights = warmup_simulated() if simulated else warmup_torch()

    s = flare_package.stats(0 if simulated else None)["tensor"]  # the per-tensor pool's counters
    print(
        f"peak {s['peak_physical_bytes'] / GIB:.0f} GiB, {s['reuse_hits']} reuse hits, "
        f"{s['physical_bytes'] / GIB:.0f} GiB held after the scope"
        + (" (simulated)" if simulated else "")
    )
    if simulated:
        assert s["peak_physical_bytes"] == 5 * GIB, s
        assert s["reuse_hits"] == 11, s
        flare_package.load().flare_torch_free(weights, 4 * GIB, 0, None)
        flare_package.trim(0)  # what torch.cuda.empty_cache() does once install() ran
        assert flare_package.stats(0)["physical_bytes"] == 0
    else:
        del weights


if __name__ == "__main__":
    main()
