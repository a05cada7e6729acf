"""One workload under one allocator, in this process (the allocator is per
process): the parent starts ``run.py --child SPEC`` with the allocator's
environment (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True for expandable, set
before torch starts) and reads the JSON this writes to SPEC's ``out`` (partial
results on the way, status "running", so that a killed child leaves its steps).

Order, the same for every allocator: pin the cores; import torch; flare:
``flare_package.install()`` before anything touches CUDA; deterministic algorithms
(strict unless --warn-only: in warn-only mode flash attention's backward is not
deterministic); CUDA initialised; the baseline (device memory used before the
workload's first allocation); the sampling thread; flare-mempool:
``flare_package.mempool()`` and, for serving, the whole workload inside
``torch.cuda.use_mem_pool`` (graphs: the MemPool is the capture pool; training:
not applicable, config.NOT_APPLICABLE); setup, the measured steps, memory after
the run and after ``torch.cuda.empty_cache()``; then, in round 0, the
largest-size search under the budget (the ballast)."""

import contextlib
import gc
import hashlib
import json
import os
import pathlib
import sys
import time
import traceback
import warnings

from . import config, search
from .memory import AllocatorView, Ballast, DriverMemory, Sampler, expandable_in_use
from .workloads import WORKLOAD_CLASSES


def digest(value):
    """A short hash of one step's output: exact (floats by their hex form)."""
    if isinstance(value, float):
        text = value.hex()
    else:
        text = json.dumps(value, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Recorder:
    """The measured steps: time (host wall time of the step, which ends with a
    device-to-host copy and a synchronize), driver memory at the end of the step
    and its peak during the step (the sampling thread's samples in the step's
    interval and the end sample), the allocator's live and held bytes, the
    step's output and its hash."""

    def __init__(self, ctx, write_partial):
        self.ctx = ctx
        self.steps = []
        self.hashes = []
        self.values = []
        self.write_partial = write_partial

    def now(self):
        return self.ctx.sampler.now()

    def phase(self, name, seconds):
        self.ctx.phases[name] = round(seconds, 3)

    def sync(self):
        if self.ctx.cuda:
            self.ctx.torch.cuda.synchronize(self.ctx.device)

    def step(self, phase, fn, shape, output=None):
        t0 = self.now()
        r = fn()
        self.sync()
        t1 = self.now()
        drv = self.ctx.sampler.sample_now()
        during = self.ctx.sampler.max_between(t0, t1)
        live, held = self.ctx.view.live(), self.ctx.view.held()
        self.steps.append({
            "i": len(self.steps),
            "phase": phase,
            "ms": round((t1 - t0) * 1e3, 4),
            "driver": drv,
            "driver_peak": max(drv, during if during is not None else drv),
            "live": live,
            "held": held,
            "shape": shape,
        })
        if output is not None:
            v = output(r)
            self.values.append(v)
            self.hashes.append(digest(v))
        if len(self.steps) % 50 == 0:
            self.write_partial()
        return r


class Context:
    """What a workload sees: torch, the device, its sizes, the allocator variant,
    flare_package (or None), the flare MemPool (flare-mempool), the sampler and
    the allocator view."""


def pin_cores(res):
    # Every child on the same 4 cores: the steps are partly host-bound, and runs
    # moved between cores spread per-process figures by 20% (run_h200.py saw it).
    if hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) >= 6:
            os.sched_setaffinity(0, set(cores[2:6]))
        res["env"]["cores"] = sorted(os.sched_getaffinity(0))


def versions(torch, res, device):
    env = res["env"]
    env["torch"] = torch.__version__
    try:
        import transformers  # noqa: PLC0415

        env["transformers"] = transformers.__version__
    except Exception as e:  # noqa: BLE001
        env["transformers"] = f"unavailable: {e}"
    env["python"] = sys.version.split()[0]
    env["PYTORCH_CUDA_ALLOC_CONF"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    env["CUBLAS_WORKSPACE_CONFIG"] = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
        env["gpu_total_bytes"] = torch.cuda.mem_get_info(device)[1]
    else:
        env["gpu"] = "cpu"


def budget_search(ctx, wl, res, driver, baseline):
    """The largest size that fits under the budget: fixed bytes (weights, states,
    KV cache: from the config) + the workload's headroom, counted as device memory
    over the baseline. The ballast takes total - baseline - budget from the
    driver, so what the process already holds (after empty_cache) counts against
    the budget, the same way for every allocator."""
    c = ctx.workload_cfg
    fixed = wl.fixed_bytes()
    budget = fixed + c["headroom"]
    total = driver.total()
    used_now = driver.used()
    want = total - baseline - budget
    b = {
        "budget_bytes": budget,
        "fixed_bytes": fixed,
        "headroom_bytes": c["headroom"],
        "param": c["probe"],
        "batch": c.get("probe_batch"),
        "held_before_bytes": used_now - baseline,
    }
    res["figures"]["budget"] = b
    if used_now - baseline >= budget:
        b.update(largest=0, probes=[], exact=True, note="the process held more than the budget before the search")
        return
    ballast = Ballast(ctx.device.index or 0)
    try:
        ballast.allocate(want)
        b["ballast_bytes"] = want
        b["free_at_start_bytes"] = ctx.torch.cuda.mem_get_info(ctx.device)[0]
        t0 = time.perf_counter()
        best, probes, exact = search.largest_fitting(wl.probe, c["probe_start"], c["probe_limit"], c["probe_step"], c["probe_max"])
        b.update(largest=best, probes=probes, exact=exact, seconds=round(time.perf_counter() - t0, 2))
    except Exception as e:  # noqa: BLE001
        b["error"] = f"{type(e).__name__}: {e}"[:2000]
    finally:
        ballast.release()


def run(spec, res, write):
    pin_cores(res)
    import torch  # noqa: PLC0415

    variant = spec["allocator"]
    base = config.base_allocator(variant)
    cuda = spec["device"] != "cpu"
    if base.startswith("flare") and not cuda:
        raise RuntimeError("the flare-package allocators need CUDA")
    fp = None
    if base.startswith("flare"):
        import flare_package as fp  # noqa: PLC0415

        res["env"]["flare_library"] = str(fp.library_path())
    if base == "flare":
        fp.install()  # before anything touches CUDA
    torch.use_deterministic_algorithms(True, warn_only=spec.get("warn_only", False))
    torch.backends.cudnn.benchmark = False
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.init()
        torch.cuda.set_device(device)
    versions(torch, res, device)
    try:
        import torch.utils.deterministic as tud  # noqa: PLC0415

        fill = bool(tud.fill_uninitialized_memory)
    except (ImportError, AttributeError):
        fill = None
    res["env"]["deterministic"] = {"on": True, "warn_only": bool(spec.get("warn_only", False)), "fill_uninitialized_memory": fill}
    ctx = Context()
    ctx.torch, ctx.device, ctx.cuda, ctx.fp, ctx.variant = torch, device, cuda, fp, variant
    ctx.model_cfg = config.MODELS[spec["size"]]
    ctx.workload_cfg = config.WORKLOAD_SIZES[spec["workload"]][spec["size"]]
    ctx.seed = config.SEED
    ctx.phases = res["figures"].setdefault("phase_s", {})
    driver = DriverMemory(torch, device)
    if cuda:
        torch.cuda.synchronize(device)
    baseline = driver.used()
    res["figures"]["baseline_used_bytes"] = baseline
    ctx.view = AllocatorView(torch, variant, device)
    ctx.view.reset_peak()
    ctx.flare_pool = fp.mempool(0) if base == "flare-mempool" else None
    ctx.sampler = Sampler(driver, baseline).start()
    rec = Recorder(ctx, lambda: write(rec))
    scope = contextlib.nullcontext()
    if ctx.flare_pool is not None and spec["workload"] == "serving":
        scope = torch.cuda.use_mem_pool(ctx.flare_pool)
    wl = WORKLOAD_CLASSES[spec["workload"]](ctx)
    try:
        with scope:
            t0 = time.perf_counter()
            res["model"] = wl.setup()
            ctx.phases["setup_s"] = round(time.perf_counter() - t0, 3)
            write(rec)
            t0 = time.perf_counter()
            wl.run(rec)
            ctx.phases["run_s"] = round(time.perf_counter() - t0, 3)
            gc.collect()
            f = res["figures"]
            f["driver_after_bytes"] = ctx.sampler.sample_now()
            f["held_after_bytes"], f["live_after_bytes"] = ctx.view.held(), ctx.view.live()
            if cuda:
                torch.cuda.synchronize(device)
                torch.cuda.empty_cache()
                torch.cuda.synchronize(device)
            f["driver_after_empty_cache_bytes"] = ctx.sampler.sample_now()
            f["held_after_empty_cache_bytes"] = ctx.view.held()
            f["allocator_peak"] = ctx.view.peak()
            f["driver_peak_bytes"] = ctx.sampler.peak()
            f["driver_peak_step_bytes"] = max((s["driver_peak"] for s in rec.steps), default=0)
            f["sampler_samples"] = len(ctx.sampler.samples)
            if variant == "expandable" and cuda:
                f["expandable_segments_in_use"] = expandable_in_use(torch)
            write(rec)
            if spec.get("budget") and cuda:
                budget_search(ctx, wl, res, driver, baseline)
            elif spec.get("budget"):
                # The CPU: no ballast, so no budget; the probes run (the code path).
                c = ctx.workload_cfg
                best, probes, exact = search.largest_fitting(wl.probe, c["probe_start"], c["probe_limit"], c["probe_step"], c["probe_max"])
                res["figures"]["budget"] = {"skipped": "the budget search needs CUDA (the ballast comes from the driver); "
                                                       f"on the CPU the probes ran without a budget: {probes}"}
            f["allocator_details"] = ctx.view.details()
    finally:
        ctx.sampler.stop()
        if ctx.sampler.errors:
            res["notes"].append(f"sampler stopped: {ctx.sampler.errors[0]}")
        res["samples"] = ctx.sampler.downsampled()


def main(spec_text):
    spec = json.loads(spec_text)
    out = pathlib.Path(spec["out"])
    res = {
        "run_id": spec["run_id"],
        "workload": spec["workload"],
        "allocator": spec["allocator"],
        "round": spec["round"],
        "size": spec["size"],
        "device": spec["device"],
        "status": "running",
        "error": None,
        "env": {},
        "notes": [],
        "figures": {},
        "steps": [],
        "outputs": {"kind": None, "hashes": [], "values": []},
    }
    kinds = {"serving": "new tokens per call", "graphs": "next tokens per replay", "training": "loss per step"}
    res["outputs"]["kind"] = kinds[spec["workload"]]
    seen = []

    def write(rec=None):
        if rec is not None:
            res["steps"] = rec.steps
            res["outputs"]["hashes"] = rec.hashes
            res["outputs"]["values"] = rec.values
        res["warnings"] = seen[:40]
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(res, default=str))
        tmp.replace(out)

    t0 = time.time()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            run(spec, res, write)
            res["status"] = "ok"
        except BaseException as e:  # noqa: BLE001
            res["status"] = "failed"
            res["error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-4000:]}"
        for w in caught:
            msg = f"{w.category.__name__}: {str(w.message)[:300]}"
            if msg not in seen:
                seen.append(msg)
    res["seconds"] = round(time.time() - t0, 1)
    write()
    if res["status"] != "ok":
        print(res["error"], file=sys.stderr)
    sys.exit(0 if res["status"] == "ok" else 1)
