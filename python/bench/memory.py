"""Memory as the child measures it: the driver's view (a sampling thread every
~5 ms reading ``torch.cuda.mem_get_info()``, device used = total - free), the
allocator's own counters (PyTorch's caching allocator, or flare_package.stats()),
and the ballast that sets the memory budget: bytes allocated straight from the
CUDA driver (``cuMemAlloc_v2`` through ctypes on libcuda.so.1, in the primary
context, the one PyTorch uses), outside every allocator, so that each allocator
sees the same free memory.

On the CPU (the smoke test) the "driver" figure is the process's resident set
(/proc/self/statm), so that the sampling and the pictures run end to end; there is
no ballast and no budget search."""

import contextlib
import ctypes
import os
import threading
import time


class DriverMemory:
    """Device memory in use on ``device`` (total - free, all processes), or the
    resident set of this process on the CPU."""

    def __init__(self, torch, device):
        self.torch = torch
        self.device = device
        self.cuda = device.type == "cuda"
        self.page = os.sysconf("SC_PAGE_SIZE")

    def used(self):
        if self.cuda:
            free, total = self.torch.cuda.mem_get_info(self.device)
            return total - free
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page

    def total(self):
        if self.cuda:
            return self.torch.cuda.mem_get_info(self.device)[1]
        return os.sysconf("SC_PHYS_PAGES") * self.page


class Sampler:
    """A thread reading the driver's used memory every ``period`` seconds into
    ``samples`` ([seconds since start, bytes over the baseline]). ``paused()``
    holds it off (around CUDA graph captures: no CUDA call from another thread may
    run while a stream is captured in global mode)."""

    def __init__(self, driver, baseline, period=0.005):
        self.driver, self.baseline, self.period = driver, baseline, period
        self.samples = []
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.t0 = time.perf_counter()
        self.thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)
        self.errors = []

    def start(self):
        self.thread.start()
        return self

    def _run(self):
        while not self.stop_event.is_set():
            with self.lock:
                try:
                    v = self.driver.used() - self.baseline
                    self.samples.append([time.perf_counter() - self.t0, v])
                except Exception as e:  # noqa: BLE001
                    self.errors.append(f"{type(e).__name__}: {e}")
                    return
            self.stop_event.wait(self.period)

    def now(self):
        return time.perf_counter() - self.t0

    def sample_now(self):
        """One sample from the calling thread (recorded like the thread's)."""
        with self.lock:
            v = self.driver.used() - self.baseline
            self.samples.append([self.now(), v])
        return v

    @contextlib.contextmanager
    def paused(self):
        with self.lock:
            yield

    def max_between(self, t0, t1):
        """The largest sample taken in [t0, t1] (seconds since start), or None."""
        best = None
        # Samples are appended in time order: scan back from the end.
        for t, v in reversed(self.samples):
            if t < t0:
                break
            if t <= t1 and (best is None or v > best):
                best = v
        return best

    def peak(self):
        return max((v for _, v in self.samples), default=0)

    def stop(self):
        self.stop_event.set()
        self.thread.join(timeout=5)

    def downsampled(self, points=4000):
        """At most ``points`` samples, each the largest of its bucket (peaks kept)."""
        s = self.samples
        if len(s) <= points:
            return [[round(t, 4), v] for t, v in s]
        k = -(-len(s) // points)
        out = []
        for i in range(0, len(s), k):
            chunk = s[i : i + k]
            t, v = max(chunk, key=lambda x: x[1])
            out.append([round(t, 4), v])
        return out


class Ballast:
    """Device memory taken straight from the CUDA driver (cuMemAlloc_v2 in the
    device's primary context), invisible to every allocator: what is left free is
    the budget. ``free()`` gives it back."""

    def __init__(self, ordinal=0):
        self.cu = ctypes.CDLL("libcuda.so.1")
        self.ptr = ctypes.c_uint64(0)
        self.size = 0
        self.ctx = ctypes.c_void_p()
        self.dev = ctypes.c_int()
        self._call("cuInit", 0)
        self._call("cuDeviceGet", ctypes.byref(self.dev), ordinal)
        self._call("cuDevicePrimaryCtxRetain", ctypes.byref(self.ctx), self.dev)

    def _call(self, name, *args):
        r = getattr(self.cu, name)(*args)
        if r != 0:
            raise RuntimeError(f"{name} failed: CUresult {r}")

    def allocate(self, size):
        self._call("cuCtxPushCurrent_v2", self.ctx)
        try:
            self._call("cuMemAlloc_v2", ctypes.byref(self.ptr), ctypes.c_size_t(size))
            self.size = size
        finally:
            self._call("cuCtxPopCurrent_v2", ctypes.byref(ctypes.c_void_p()))

    def free(self):
        if self.size:
            self._call("cuCtxPushCurrent_v2", self.ctx)
            try:
                self._call("cuMemFree_v2", self.ptr)
                self.size = 0
            finally:
                self._call("cuCtxPopCurrent_v2", ctypes.byref(ctypes.c_void_p()))

    def release(self):
        self.free()
        self.cu.cuDevicePrimaryCtxRelease_v2(self.dev)


class AllocatorView:
    """The allocator's own counters: live bytes (what tensors hold), held bytes
    (what it has from the driver) and its peak, for the allocator this process
    runs. PyTorch's allocators (default, expandable, and flare-mempool, whose
    MemPool PyTorch's caching allocator manages): memory_allocated,
    memory_reserved, max_memory_reserved. flare (install()): flare_package.stats()
    summed over the device's pools (tensor, mempool, graph pools): live_requested
    bytes, physical_bytes, and the pools' peak_physical_bytes (the sum of each
    pool's own peak: at least their joint peak)."""

    def __init__(self, torch, allocator, device):
        self.torch, self.allocator, self.device = torch, allocator, device
        self.cuda = device.type == "cuda"
        self.flare = allocator in ("flare", "flare+retention")
        self.fp = None
        if self.flare or allocator == "flare-mempool":
            import flare_package  # noqa: PLC0415

            self.fp = flare_package

    def _flare_pools(self):
        s = self.fp.stats(self.device.index or 0)
        if not s.get("created"):
            return s, []
        return s, [s["tensor"], s["mempool"]] + [g["snapshot"] for g in s["graph_pools"]]

    def live(self):
        if not self.cuda:
            return 0
        if self.flare:
            _, pools = self._flare_pools()
            return sum(p["live_requested_bytes"] for p in pools)
        return int(self.torch.cuda.memory_allocated(self.device))

    def held(self):
        if not self.cuda:
            return 0
        if self.flare:
            s, _ = self._flare_pools()
            return int(s.get("physical_bytes", 0))
        return int(self.torch.cuda.memory_reserved(self.device))

    def reset_peak(self):
        if self.cuda and not self.flare:
            self.torch.cuda.reset_peak_memory_stats(self.device)

    def peak(self):
        """{"bytes": the headline peak, "source": what it is, ...details}."""
        if not self.cuda:
            return {"bytes": None, "source": "none on the CPU"}
        if self.flare:
            s, pools = self._flare_pools()
            return {
                "bytes": sum(p["peak_physical_bytes"] for p in pools),
                "source": "flare_package.stats(): sum of the pools' peak_physical_bytes",
                "pools": {
                    "tensor": s.get("tensor", {}).get("peak_physical_bytes"),
                    "mempool": s.get("mempool", {}).get("peak_physical_bytes"),
                    "graph_pools": [g["snapshot"]["peak_physical_bytes"] for g in s.get("graph_pools", [])],
                },
            }
        out = {
            "bytes": int(self.torch.cuda.max_memory_reserved(self.device)),
            "source": "torch.cuda.max_memory_reserved",
            "max_memory_allocated": int(self.torch.cuda.max_memory_allocated(self.device)),
        }
        if self.fp is not None:
            s, _ = self._flare_pools()
            if s.get("created"):
                out["flare_mempool_peak_physical_bytes"] = s["mempool"]["peak_physical_bytes"]
                out["flare_mempool_physical_bytes"] = s["mempool"]["physical_bytes"]
        return out

    def details(self):
        """The full counters at the end (flare's stats, or PyTorch's memory_stats
        summary), for the record."""
        if not self.cuda:
            return {}
        if self.fp is not None:
            s = self.fp.stats(self.device.index or 0)
            keep = ("bytes", "count", "hits", "created", "released", "retries", "scopes_finished")
            slim = lambda snap: {k: v for k, v in snap.items() if k.endswith(keep)}  # noqa: E731
            out = {"physical_bytes": s.get("physical_bytes"), "backend": s.get("backend")}
            if s.get("created"):
                out["tensor"] = slim(s["tensor"])
                out["mempool"] = slim(s["mempool"])
                out["graph_pools"] = [{"id": g["id"], "live": g["live"], "snapshot": slim(g["snapshot"])} for g in s["graph_pools"]]
            out["hook_failures"] = self.fp.hook_failures()
            if self.flare:
                return out
            torch_side = {"flare": out}
        else:
            torch_side = {}
        st = self.torch.cuda.memory_stats(self.device)
        for k in ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free",
                  "segment.all.peak", "inactive_split_bytes.all.peak"):
            if k in st:
                torch_side[k] = st[k]
        return torch_side


def expandable_in_use(torch):
    """Whether PyTorch's caching allocator made expandable segments (its memory
    snapshot's segments say so), None when the snapshot does not tell."""
    try:
        segs = torch.cuda.memory_snapshot()
    except Exception:  # noqa: BLE001
        return None
    flags = [s.get("is_expandable") for s in segs if "is_expandable" in s]
    if not flags:
        return None
    return all(flags)
