"""flare-package as PyTorch's CUDA allocator.

Per tensor (every CUDA tensor of the process; call before any CUDA work)::

    import flare_package
    flare_package.install()

As a private pool (PyTorch's caching allocator sub-allocates our mappings)::

    pool = flare_package.mempool()          # one per device, kept alive here
    with torch.cuda.use_mem_pool(pool):
        x = torch.empty(1 << 20, device="cuda")

Also: ``retention()`` (a retention scope around warmup or capture), ``stats()``
(the pools' snapshot counters as a dict), ``trim()`` (release what is idle),
``forget_stream()`` (before destroying a stream PyTorch did not create),
``mark_step()`` and ``growth_report()`` (which live tensors keep growing, step after
step: a leak named with its rate), and
``sleep()`` / ``wake()`` / ``census()``: a device's tensor memory given back to the
device with every tensor's address kept, then mapped again (``wake(zero=True)``
zeroes what a discard sleep dropped: new memory holds stale bytes otherwise).

The package is Python (ctypes) over the shared library the Rust crate builds;
``pip install ./python`` builds it with maturin and installs it inside this package
(``flare_package/_native/lib_native.so``). ``library_path()`` says where it looks
(the ``FLARE_PACKAGE_LIB`` variable, the library installed inside this package, then
``target/release/libflare_package.so`` of the checkout this file is in) and raises
``LibraryNotFound`` naming every path it tried. The pools are
configured with ``FLARE_TORCH_*`` environment variables, read at the first
allocation (docs/pytorch-guide.md). ``FLARE_TORCH_RECORD=PATH`` records every pool's
calls as flare-trace v1, one file per pool (``PATH.dev0.tensor.trace``,
``PATH.dev0.mempool.trace``, ``PATH.dev0.graph-1.trace``, ...); ``load()``
registers an exit handler that writes what is buffered (``record_flush()``), and
``flare-replay --as-recorded FILE`` replays one with the recorded pool's
configuration.

Use ``install()``, not the bare pair. PyTorch's documentation shows
``CUDAPluggableAllocator(path, "flare_torch_alloc", "flare_torch_free")`` with
``change_current_allocator``; PyTorch then calls only those two functions, because
it calls a hook only if it was registered, and ``install()`` is what registers
them. The bare pair loses:

- ``Tensor.record_stream`` (no record_stream hook: it does nothing): a tensor freed
  on its own stream is handed out again at once on that stream while another
  stream still reads it, and the new tensor's writes corrupt what is read (seen on
  an H100 with PyTorch 2.11);
- ``torch.cuda.empty_cache()`` (no reset hook: it does nothing): freed memory stays
  cached until an out-of-memory (``trim()`` still releases it);
- CUDA graph pools (no graph-pool hooks): captures allocate from the per-tensor
  pool, and a graph's memory freed after its capture can go to eager tensors while
  replays still write into it;
- raising on a failed allocation, unless the library finds PyTorch's
  ``c10::detail::torchCheckFail`` in the process itself (it looks at the first
  failure: the global scope, then ``libc10.so`` if loaded); without it the
  allocation returns NULL, which PyTorch wraps in a tensor at address 0 (pytorch
  #133280).

The library cannot see which hooks PyTorch registered, so it cannot warn about
the bare pair, nor make up for ``record_stream``.
"""

import atexit
import contextlib
import ctypes
import json
import os
import pathlib
import warnings

__all__ = [
    "FlareError",
    "LibraryNotFound",
    "candidate_paths",
    "census",
    "forget_stream",
    "growth_report",
    "hook_failures",
    "install",
    "last_error",
    "library_path",
    "load",
    "mark_step",
    "mempool",
    "oom_handler_installed",
    "record_flush",
    "retention",
    "sleep",
    "stats",
    "trim",
    "use_simulated",
    "wake",
]

LIB_ENV = "FLARE_PACKAGE_LIB"
# The library as the crate builds it (target/release of a checkout).
LIB_NAME = "libflare_package.so"
# The library inside the installed package, relative to this directory: where
# maturin puts the cdylib of python/Cargo.toml for module-name
# "flare_package._native" (python/pyproject.toml).
PACKAGED_LIB = ("_native", "lib_native.so")
# How to build the library in a checkout (.cargo/config.toml: `cargo rustc` naming the
# crate types, which Cargo.toml leaves out).
BUILD_COMMAND = "cargo clib"
# c10::detail::torchCheckFail(const char*, const char*, uint32_t, const char*):
# throws c10::Error, which PyTorch's bindings turn into a RuntimeError.
TORCH_CHECK_FAIL = "_ZN3c106detail14torchCheckFailEPKcS2_jS2_"

_lib = None
_state = {"installed": None, "oom_handler": False, "mempools": {}, "keep": []}


class LibraryNotFound(OSError):
    """The shared library could not be found or loaded; the message lists every
    path tried and how to build it."""


class FlareError(RuntimeError):
    """A flare_* call failed: ``status`` is the status name, the message the
    library's detail (the call, the driver error, the sizes)."""

    def __init__(self, call, status, message):
        super().__init__(f"{call}: {status}: {message}")
        self.status = status


def candidate_paths():
    """The paths ``library_path()`` tries, in order: ``$FLARE_PACKAGE_LIB`` (alone
    when it is set), ``flare_package/_native/lib_native.so`` (put in the package by
    ``pip install ./python``), ``<checkout>/target/release/libflare_package.so``
    (this file is ``<checkout>/python/flare_package/__init__.py``)."""
    env = os.environ.get(LIB_ENV)
    if env:
        return [pathlib.Path(env)]
    here = pathlib.Path(__file__).resolve().parent
    return [
        here.joinpath(*PACKAGED_LIB),
        here.parent.parent / "target" / "release" / LIB_NAME,
    ]


def library_path():
    """The shared library's path (resolved). Raises ``LibraryNotFound`` naming
    every path tried when none exists."""
    tried = candidate_paths()
    for p in tried:
        if p.is_file():
            return p.resolve()
    lines = "\n".join(f"  {p}" for p in tried)
    how = (
        f"{LIB_ENV} is set: it must name the library itself"
        if os.environ.get(LIB_ENV)
        else "install the package with the library inside it (`pip install ./python` "
        f"in the checkout), build it in the checkout (`{BUILD_COMMAND}`), or set "
        f"{LIB_ENV}=/path/to/{LIB_NAME}"
    )
    raise LibraryNotFound(f"flare_package: no shared library found; tried:\n{lines}\n{how}")


def _sig(lib, name, restype, *argtypes):
    try:
        f = getattr(lib, name)
    except AttributeError as e:
        raise LibraryNotFound(
            f"flare_package: {lib._name} has no function {name}: it is not "
            f"{LIB_NAME}, or one older than this package (rebuild it with "
            f"`{BUILD_COMMAND}`, or reinstall the package)"
        ) from e
    f.restype = restype
    f.argtypes = list(argtypes)


def load():
    """Loads the shared library once (``ctypes.CDLL``) and returns it, with the
    argument types of the functions this package calls set."""
    global _lib
    if _lib is not None:
        return _lib
    path = library_path()
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        raise LibraryNotFound(f"flare_package: {path} exists but cannot be loaded: {e}") from e
    vp, i, u32, u64, sz = (
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_uint32,
        ctypes.c_uint64,
        ctypes.c_size_t,
    )
    st = ctypes.c_int  # FlareStatus
    _sig(lib, "flare_torch_alloc", vp, sz, i, vp)
    _sig(lib, "flare_torch_free", None, vp, sz, i, vp)
    _sig(lib, "flare_torch_pool_alloc", vp, sz, i, vp)
    _sig(lib, "flare_torch_pool_free", None, vp, sz, i, vp)
    _sig(lib, "flare_torch_record_stream", None, vp, vp)
    _sig(lib, "flare_torch_forget_stream", st, vp)
    _sig(lib, "flare_torch_reset", None)
    _sig(lib, "flare_torch_record_flush", None)
    _sig(lib, "flare_torch_begin_allocate_to_pool", None, i, u64, u64, vp)
    _sig(lib, "flare_torch_end_allocate_to_pool", None, i, u64, u64)
    _sig(lib, "flare_torch_release_pool", None, i, u64, u64)
    _sig(lib, "flare_torch_hook_failures", u64)
    _sig(lib, "flare_torch_set_oom_handler", None, vp)
    _sig(lib, "flare_torch_use_simulated", st, u64, u32)
    _sig(lib, "flare_torch_stats", sz, i, ctypes.c_char_p, sz)
    _sig(lib, "flare_torch_trim", st, i)
    _sig(lib, "flare_torch_retention_begin", st, i)
    _sig(lib, "flare_torch_retention_finish", st, i, i)
    _sig(lib, "flare_torch_sim_stream_create", st, i, ctypes.POINTER(vp))
    _sig(lib, "flare_torch_sim_stream_destroy", st, i, vp)
    _sig(lib, "flare_torch_sim_launch", st, i, vp, vp, sz)
    _sig(lib, "flare_torch_sim_stream_complete", st, i, vp)
    _sig(lib, "flare_torch_sim_begin_capture", st, i, vp)
    _sig(lib, "flare_torch_sim_end_capture", st, i, vp, ctypes.POINTER(i))
    _sig(lib, "flare_torch_sim_faults", st, i, ctypes.POINTER(u64))
    _sig(lib, "flare_torch_sleep", st, i, u32)
    _sig(lib, "flare_torch_wake", st, i, i, vp)
    _sig(lib, "flare_torch_census", sz, i, ctypes.c_char_p, sz)
    _sig(lib, "flare_torch_mark_step", st)
    _sig(lib, "flare_torch_growth_report", st, i, u64, u64, i, ctypes.c_char_p, sz, ctypes.POINTER(sz))
    _sig(lib, "flare_torch_sim_write", st, i, vp, vp, sz)
    _sig(lib, "flare_torch_sim_read", st, i, vp, vp, sz)
    _sig(lib, "flare_last_error_message", sz, ctypes.c_char_p, sz)
    _sig(lib, "flare_status_name", ctypes.c_char_p, st)
    _sig(lib, "flare_torch_dump_snapshot", st, ctypes.c_char_p)
    _sig(lib, "flare_history_set_frame", st, ctypes.c_char_p)
    _lib = lib
    if os.environ.get("FLARE_TORCH_RECORD"):
        # The process-wide pools are never destroyed: write what they buffered.
        atexit.register(lib.flare_torch_record_flush)
    return lib


def last_error():
    """The calling thread's last error message from the library ('' if none)."""
    lib = load()
    n = lib.flare_last_error_message(None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    lib.flare_last_error_message(buf, n + 1)
    return buf.value.decode("utf-8", "replace")


def _check(call, status):
    if status != 0:
        name = load().flare_status_name(status).decode()
        raise FlareError(call, name, last_error())


def hook_failures():
    """How many hook calls (free, record_stream, reset, graph-pool hooks) failed in
    this process (their messages went to the calling thread's last error)."""
    return int(load().flare_torch_hook_failures())


def use_simulated(capacity_bytes=0, device_count=0):
    """Makes this process's pools use the simulated driver (no GPU; for tests).
    Must come before any allocation. 0: the defaults (140 GiB, 2 devices)."""
    capacity_bytes = _int_in("capacity_bytes", capacity_bytes, 0, 2**64 - 1)
    device_count = _int_in("device_count", device_count, 0, 2**32 - 1)
    _check("flare_torch_use_simulated", load().flare_torch_use_simulated(capacity_bytes, device_count))


def _int_in(name, value, lo, hi):
    """``value`` as an int in ``lo..=hi``; ValueError otherwise (ctypes would wrap
    it silently: device 2**32 became device 0)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} {value} is out of range ({lo} to {hi})")
    return value


def _device(device):
    if device is not None:
        return _int_in("device", device, 0, 2**31 - 1)
    try:
        import torch  # noqa: PLC0415

        return torch.cuda.current_device()
    except ImportError:
        return 0


def _addr(lib, name):
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def _set_oom_handler(lib, torch):
    """Points flare_torch_alloc's failure path at PyTorch's torchCheckFail (found in
    libc10.so), so that an allocation that fails raises instead of handing PyTorch a
    NULL pointer (pytorch #133280). FLARE_TORCH_OOM=null leaves it unset (and the
    library then does not look for it either). The library would find the same
    function itself at the first failure (the bare pair relies on that); setting it
    here finds it where this package knows PyTorch is, and warns now when it is
    missing."""
    if os.environ.get("FLARE_TORCH_OOM", "").strip() == "null":
        return False
    c10 = pathlib.Path(torch.__file__).resolve().parent / "lib" / "libc10.so"
    try:
        fail = getattr(ctypes.CDLL(str(c10)), TORCH_CHECK_FAIL)
    except (OSError, AttributeError) as e:
        warnings.warn(
            f"flare_package: {TORCH_CHECK_FAIL} not found in {c10} ({e}): an allocation "
            "that fails returns NULL to PyTorch (pytorch #133280)",
            RuntimeWarning,
            stacklevel=3,
        )
        return False
    lib.flare_torch_set_oom_handler(ctypes.cast(fail, ctypes.c_void_p))
    return True


def oom_handler_installed():
    """Whether install() set PyTorch's torchCheckFail as the failure path."""
    return _state["oom_handler"]


def record_flush():
    """Writes what every pool recorded so far (``FLARE_TORCH_RECORD``) to its
    file and waits for the writes. Called at exit (registered by ``load()``);
    nothing to do when not recording."""
    load().flare_torch_record_flush()


def dump_snapshot(path):
    """Writes one memory_viz snapshot of every pool of the process (each device's
    tensor pool, its mempool pool and every CUDA graph pool, which PyTorch's own
    ``torch.cuda.memory._snapshot()`` does not show for a pluggable allocator) to
    ``path``: a pickle that ``pytorch.org/memory_viz`` opens and
    ``torch.cuda._memory_viz`` renders (``segment_plot``, ``trace_plot``). Its
    ``device_traces`` hold each pool's recent events when ``FLARE_TORCH_HISTORY=N``
    (events kept per pool) was set before the first allocation; without it, the
    segments alone. Raises ``FlareError`` (``FLARE_STATUS_IO``) when the file cannot
    be written."""
    _check("flare_torch_dump_snapshot", load().flare_torch_dump_snapshot(os.fsencode(path)))


def set_history_frame(frame=None):
    """Sets the calling thread's frame: every history event it writes from now on
    (``FLARE_TORCH_HISTORY``) carries ``frame``, a short label of your choosing (a
    phase, a layer, a request), shown by memory_viz as the event's stack
    (``flare_package:0:FRAME``); ``None`` clears it."""
    arg = None if frame is None else str(frame).encode("utf-8")
    _check("flare_history_set_frame", load().flare_history_set_frame(arg))


@contextlib.contextmanager
def history_frame(frame):
    """``with history_frame("prefill"):``: the frame of the events written inside
    (``set_history_frame``), cleared at the end."""
    set_history_frame(frame)
    try:
        yield
    finally:
        set_history_frame(None)


def install():
    """Makes flare-package the allocator of every CUDA tensor of this process
    (``torch.cuda.memory.change_current_allocator``; PyTorch allows it only before
    the first CUDA allocation). Registers the hooks: record_stream, reset (called by
    ``torch.cuda.empty_cache()``: trim), and the graph-pool hooks that keep each
    CUDA graph's memory to itself (no scope call needed around captures). An
    allocation that fails raises a RuntimeError naming the request and the pool's
    live and idle bytes. Returns the ``CUDAPluggableAllocator``; a second call
    returns the same one.

    This, not the bare ``CUDAPluggableAllocator(path, "flare_torch_alloc",
    "flare_torch_free")`` of PyTorch's documentation: PyTorch calls only the hooks
    registered, and without them ``record_stream`` is lost (memory reused while
    another stream reads it), ``empty_cache()`` does nothing, CUDA graphs share the
    per-tensor pool, and a failed allocation raises only if the library finds
    PyTorch's torchCheckFail itself (the module's docstring says more)."""
    if _state["installed"] is not None:
        return _state["installed"]
    import torch  # noqa: PLC0415

    lib = load()
    path = str(library_path())
    alloc = torch.cuda.memory.CUDAPluggableAllocator(path, "flare_torch_alloc", "flare_torch_free")
    a = alloc._allocator
    a.set_record_stream_fn(_addr(lib, "flare_torch_record_stream"))
    a.set_reset_fn(_addr(lib, "flare_torch_reset"))
    a.set_begin_allocate_to_pool(_addr(lib, "flare_torch_begin_allocate_to_pool"))
    a.set_end_allocate_to_pool_fn(_addr(lib, "flare_torch_end_allocate_to_pool"))
    a.set_release_pool(_addr(lib, "flare_torch_release_pool"))
    _state["oom_handler"] = _set_oom_handler(lib, torch)
    torch.cuda.memory.change_current_allocator(alloc)
    _state["installed"] = alloc
    return alloc


def mempool(device=None):
    """A ``torch.cuda.MemPool`` over flare-package for ``device`` (default: the
    current one): PyTorch's caching allocator sub-allocates whole mappings of ours,
    each of exactly the segment's size, so our physical bytes are the pool's
    reserved bytes. One pool per device, made once and kept alive by this module
    for the whole process (a pool on another device asserts, pytorch #149802; a
    tensor outliving its pool was freed with the wrong function, pytorch #146431).
    Use it with ``torch.cuda.use_mem_pool(pool)`` or
    ``torch.cuda.graph(g, pool=pool.id)``."""
    import torch  # noqa: PLC0415

    d = _device(device)
    if d in _state["mempools"]:
        return _state["mempools"][d]
    load()
    alloc = torch.cuda.memory.CUDAPluggableAllocator(
        str(library_path()), "flare_torch_pool_alloc", "flare_torch_pool_free"
    )
    with torch.cuda.device(d):
        pool = torch.cuda.MemPool(alloc.allocator())
    _state["keep"].append(alloc)
    _state["mempools"][d] = pool
    return pool


@contextlib.contextmanager
def retention(device=None):
    """A retention scope on ``device``'s tensor pool: nothing freed inside is
    released (freed memory is reused by later allocations that fit); at the end
    what is idle is released (one synchronize; an exception aborts the scope, which
    releases the same)."""
    d = _device(device)
    lib = load()
    _check("flare_torch_retention_begin", lib.flare_torch_retention_begin(d))
    try:
        yield
    except BaseException:
        lib.flare_torch_retention_finish(d, 1)
        raise
    _check("flare_torch_retention_finish", lib.flare_torch_retention_finish(d, 0))


def stats(device=None):
    """The pools of ``device`` as a dict: ``tensor`` and ``mempool`` (every
    snapshot counter by name: physical_bytes, live and idle bytes, block counts,
    reuse hits...), ``graph_pools`` (one entry per CUDA graph pool: id, live
    allocations, snapshot), ``physical_bytes`` (all of them), ``backend``,
    ``created`` (False: the device was never used, nothing else)."""
    lib = load()
    d = _device(device)
    n = lib.flare_torch_stats(d, None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    lib.flare_torch_stats(d, buf, n + 1)
    out = json.loads(buf.value.decode())
    if "error" in out:
        raise FlareError("flare_torch_stats", "FLARE_STATUS_INVALID_ARGUMENT", out["error"])
    return out


def trim(device=None):
    """Releases what ``device``'s tensor and mempool pools hold idle (graph pools
    keep their memory until PyTorch releases them). ``torch.cuda.empty_cache()``
    does it for every device once ``install()`` ran."""
    _check("flare_torch_trim", load().flare_torch_trim(_device(device)))


def forget_stream(stream):
    """Tells every pool that ``stream`` is about to be destroyed: call it before
    destroying a CUDA stream that PyTorch did not create (one you wrap with
    ``torch.cuda.ExternalStream``, or made in an extension), once nothing more is
    queued on it by you. The driver may give the destroyed stream's handle value to
    the next stream created; without this call the pools would take that new stream
    for the old one and hand it memory the old stream's work may still use. What the
    pools held for the stream is kept safe (a fence event recorded on it now), live
    tensors stay valid. PyTorch's own streams (``torch.cuda.Stream()``, the current
    and default streams) need no call: they come from per-device pools that PyTorch
    never destroys, and PyTorch has no allocator hook for a stream's end.

    ``stream``: a ``torch.cuda.Stream`` or ``ExternalStream`` (its ``cuda_stream``),
    or the raw ``cudaStream_t`` value as an int. A stream the pools never saw: nothing
    happens. Raises ``FlareError`` (nothing changed) for a default stream (0, 1, 2:
    ``FLARE_STATUS_INVALID_ARGUMENT``) or a stream being captured
    (``FLARE_STATUS_STREAM_STATE``: end the capture first)."""
    handle = _int_in("stream", getattr(stream, "cuda_stream", stream), 0, 2**64 - 1)
    _check("flare_torch_forget_stream", load().flare_torch_forget_stream(handle))


# FlareSleepMode values.
SLEEP_MODES = {"discard": 0, "offload": 1}


def sleep(mode="discard", device=None):
    """Puts ``device``'s tensor memory to sleep: every tensor of the per-tensor
    allocator (``install()``) on it keeps its address, and its physical memory goes
    back to the device (graph pools and ``mempool()`` are not touched). ``mode``:
    ``"discard"`` (contents lost; ``wake(zero=True)`` zeroes them) or ``"offload"``
    (copied to pinned host memory, restored by ``wake()``). Synchronizes the device
    first. Until ``wake()``, allocating or freeing a tensor on that device fails.
    Raises ``FlareError`` (``FLARE_STATUS_TAG_STATE``: asleep already, or the device
    never used; ``FLARE_STATUS_SCOPE_STATE``: inside ``retention()`` or a capture)."""
    if mode not in SLEEP_MODES:
        raise ValueError(f"mode must be one of {sorted(SLEEP_MODES)}, not {mode!r}")
    d = _device(device)
    _check("flare_torch_sleep", load().flare_torch_sleep(d, SLEEP_MODES[mode]))


def _stream_handle(stream, device):
    """A ``cudaStream_t`` value: a ``torch.cuda.Stream`` (its ``cuda_stream``), an
    int, or None: PyTorch's current stream on ``device`` when PyTorch sees a GPU,
    else 0 (the legacy default stream)."""
    if stream is None:
        try:
            import torch  # noqa: PLC0415
        except ImportError:
            return 0
        if not torch.cuda.is_available():
            return 0
        return torch.cuda.current_stream(device).cuda_stream
    if hasattr(stream, "cuda_stream"):
        return int(stream.cuda_stream)
    return _int_in("stream", stream, 0, 2**64 - 1)


def wake(zero=False, stream=None, device=None):
    """Wakes ``device``'s tensor memory put to sleep by ``sleep()``: every tensor is
    valid again at its address, its bytes restored after an offload sleep. After a
    discard sleep the bytes are whatever the new memory held (stale bytes: NaNs in a
    KV cache, vLLM PR 45542) unless ``zero=True``: then every tensor's bytes are set
    to zero by memsets queued on ``stream`` (a ``torch.cuda.Stream`` or a raw handle;
    default PyTorch's current stream), which later work on that stream sees.
    ``census()["zeroed_bytes"]`` counts them. Raises ``FlareError``
    (``FLARE_STATUS_TAG_STATE``: not asleep; ``FLARE_STATUS_OUT_OF_MEMORY``: the
    device full, still asleep; ``FLARE_STATUS_DRIVER_ERROR`` naming
    ``cuMemsetD8Async``: awake, but not zeroed)."""
    d = _device(device)
    handle = _stream_handle(stream, d) if zero else 0
    _check("flare_torch_wake", load().flare_torch_wake(d, 1 if zero else 0, handle))


def census(device=None):
    """``device``'s tensor memory as a dict: ``sleeping``, ``live_count``,
    ``live_bytes``, ``peak_live_bytes``, ``idle_bytes``, ``physical_bytes``,
    ``offloaded_bytes``, ``zeroed_bytes`` and ``zero_memsets`` (cumulative, by
    ``wake(zero=True)``), ``created`` (False: never used, nothing else)."""
    lib = load()
    d = _device(device)
    n = lib.flare_torch_census(d, None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    lib.flare_torch_census(d, buf, n + 1)
    out = json.loads(buf.value.decode())
    if "error" in out:
        raise FlareError("flare_torch_census", "FLARE_STATUS_INVALID_ARGUMENT", out["error"])
    return out


def mark_step():
    """Writes a step marker for every pool of every device: tensors allocated from
    now on belong to the next step of ``growth_report()``. Call it once per request
    or iteration of a serving loop. Recording pools (``FLARE_TORCH_RECORD``) write a
    ``step`` line."""
    _check("flare_torch_mark_step", load().flare_torch_mark_step())


def growth_report(device=None, step_events=1000, min_steps=32, as_dict=False):
    """The growth report of ``device``'s tensors (the per-tensor pool and every CUDA
    graph pool): the tensors still live, grouped by tag, size and the step they were
    made in, with the rate each group grew at after its first step, the groups that
    keep growing first; a tag's sizes made in one step each (a new size every call,
    as per-shape scratch makes) are pooled as "a new size each step". Steps are the
    markers of ``mark_step()`` when one was written, else the retention scopes begun
    (``retention()``, and one per graph pool made), else ``step_events``
    allocations; a group grows when its live tensors come from at least
    ``min_steps`` distinct steps, one of them in the last quarter of the steps.

    Returns the text people read (the rule and its thresholds included), or with
    ``as_dict=True`` the JSON form as a dict (``step_kind``, ``steps``, ``growing``,
    ``groups`` with each group's ``tag``, ``bytes`` (None for the pooled new sizes),
    ``count``, ``allocations_per_step``, ``bytes_per_step``, ``grows``, ...:
    docs/c-guide.md, "Growth report"). Raises ``FlareError`` for a device the machine
    lacks."""
    d = _device(device)
    step_events = _int_in("step_events", step_events, 1, 2**64 - 1)
    min_steps = _int_in("min_steps", min_steps, 1, 2**64 - 1)
    lib = load()
    flag = 1 if as_dict else 0
    n = ctypes.c_size_t()
    call = "flare_torch_growth_report"
    while True:
        _check(call, lib.flare_torch_growth_report(d, step_events, min_steps, flag, None, 0, ctypes.byref(n)))
        # The pools change between the calls: a larger buffer, and again if it grew.
        size = n.value + 4096
        buf = ctypes.create_string_buffer(size)
        _check(call, lib.flare_torch_growth_report(d, step_events, min_steps, flag, buf, size, ctypes.byref(n)))
        if n.value < size:
            break
    text = buf.value.decode("utf-8", "replace")
    return json.loads(text) if as_dict else text
