#!/usr/bin/env python3
"""flare-package as PyTorch's allocator on a real GPU (issue 14): one command runs
every part in its own process (the allocator is per process) and prints a summary.

    cargo clib
    python3 python/tests/gpu/run_h200.py OUTDIR            # everything
    python3 python/tests/gpu/run_h200.py OUTDIR --parts reference,tensor

The package is the checkout's (python/), the library $FLARE_PACKAGE_LIB, else the
checkout's target/release/libflare_package.so (flare_package.library_path()). With
FLARE_PACKAGE_TEST_INSTALLED=1 the package is the one installed in the running
Python (`pip install ./python`, or the wheel), with the library inside it.

Parts (each a subprocess with a timeout; one failing does not stop the others):
  reference   PyTorch's default allocator: eager and graph-replay logits of a
              Llama-style model (random weights, fixed seeds, bf16, odd shapes),
              saved; driver memory; decode-loop timing.
  tensor      install() (per-tensor mode): outputs bitwise equal to the reference
              (eager and replay), aliasing check after the captures, memory from
              torch / the driver / our snapshot, out of memory (too large and
              full now) raises and the next steps run, two streams with
              record_stream, decode-loop timing; no hook failed.
  mempool     flare_package.mempool(): eager and graphs (pool=pool.id) bitwise
              equal, our physical bytes == the pool's reserved bytes, out of memory
              in the pool raises torch.OutOfMemoryError and the next steps run.
  sanitizer   a short per-tensor run under compute-sanitizer --tool memcheck.
  decode      a decode-like loop timed in alternating processes of the default
              allocator and ours (4 each): median over median must be <= 1.
  two_gpu     two devices: a pool each (FLARE_TORCH_PEERS=0,1), the model on each,
              peer copies; skipped with a message when one GPU is visible.
  record      issue 17: per-tensor mode with FLARE_TORCH_RECORD (eager, graphs,
              replays), then `flare-replay --as-recorded --json` on every recorded
              pool's trace (the binary: $FLARE_REPLAY, else target/release/flare-replay):
              each replay's peak physical bytes must equal the recorded pool's.
Results: OUTDIR/<part>.json, OUTDIR/summary.json; exit 0 when no part failed.
"""

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
import traceback

HERE = pathlib.Path(__file__).resolve()
REPO = HERE.parents[3]
if os.environ.get("FLARE_PACKAGE_TEST_INSTALLED") != "1":
    sys.path.insert(0, str(REPO / "python"))

PARTS = ["reference", "tensor", "mempool", "sanitizer", "decode", "two_gpu", "record"]
# The decode part alternates processes of each allocator this many times (one
# process each measured the reference's step at 4.6 to 9.3 ms in four runs on the
# H200: a single pair of processes says nothing about a few percent).
DECODE_ROUNDS = 5


import h200_model  # noqa: E402 (sample() reads and fills its globals)
from h200_model import (  # noqa: E402
    build_model,
    inputs,
    Result,
    driver_used,
    torch_counters,
    sample,
    run_eager,
    capture_graphs,
    replay_all,
    compare,
    aliasing,
    decode_loop,
    load_ref,
    SHAPES,
    GIB,
)


def part_reference(torch, res, out, quick):
    dev = 0
    h200_model.ALLOCATOR_BYTES = torch.cuda.memory_reserved
    base = driver_used(torch, dev)
    samples = []
    model = build_model(torch, dev)
    eager = run_eager(torch, model, dev, samples)
    eager2 = run_eager(torch, model, dev, samples)
    compare(torch, res, "reference is deterministic (two eager runs)", eager2, eager)
    graphs = capture_graphs(torch, model, dev)
    sample(torch, dev, samples)
    graph = replay_all(torch, graphs, dev)
    compare(torch, res, "reference: graph replay == eager", graph, eager)
    aliasing(torch, res, graphs, dev, graph)
    sample(torch, dev, samples)
    torch.save({"eager": eager, "graph": graph}, out / "ref.pt")
    res.fig("driver_peak_used_bytes_over_baseline", max(samples) - base)
    res.fig("samples_driver_over_baseline_and_reserved", [(u - base, r) for u, r in h200_model.DIAG])
    res.fig("torch_counters", torch_counters(torch, dev))
    res.fig("decode_step_ms", decode_loop(torch, model, dev, steps=100 if quick else 300))


def part_tensor(torch, res, out, quick):
    import flare_package as fp

    fp.install()
    dev = 0

    def ours(d):
        st = fp.stats(d)
        return (st["physical_bytes"], st["tensor"]["physical_bytes"], [g["snapshot"]["physical_bytes"] for g in st["graph_pools"]])

    h200_model.ALLOCATOR_BYTES = ours
    res.fig("oom_handler_installed", fp.oom_handler_installed())
    ref = load_ref(torch, out)
    base = driver_used(torch, dev)
    samples = []
    model = build_model(torch, dev)
    eager = run_eager(torch, model, dev, samples)
    compare(torch, res, "eager == reference", eager, ref["eager"])
    graphs = res.guard("capture", lambda: capture_graphs(torch, model, dev))
    if graphs:
        sample(torch, dev, samples)
        compare(torch, res, "graph replay == reference", replay_all(torch, graphs, dev), ref["graph"])
        aliasing(torch, res, graphs, dev, ref["graph"])
        s = fp.stats(dev)
        res.fig("graph_pools", [(g["id"], g["live"], g["snapshot"]["physical_bytes"]) for g in s["graph_pools"]])
        res.check("one graph pool per captured graph", len(s["graph_pools"]) == len(SHAPES), len(s["graph_pools"]))
    sample(torch, dev, samples)
    peak = max(samples) - base
    res.fig("driver_peak_used_bytes_over_baseline", peak)
    res.fig("samples_driver_over_baseline_and_physical", [(u - base, r) for u, r in h200_model.DIAG])
    s = fp.stats(dev)
    res.fig("ours_physical_bytes", s["physical_bytes"])
    res.fig("ours_tensor_peak_physical_bytes", s["tensor"]["peak_physical_bytes"])
    res.fig("torch_counters", torch_counters(torch, dev))
    res.check(
        "driver used (over baseline) >= our physical bytes",
        driver_used(torch, dev) - base >= s["physical_bytes"],
        f"driver {driver_used(torch, dev) - base}, ours {s['physical_bytes']}",
    )
    ref_fig = json.loads((out / "reference.json").read_text())["figures"] if (out / "reference.json").exists() else {}
    if "driver_peak_used_bytes_over_baseline" in ref_fig:
        d = ref_fig["driver_peak_used_bytes_over_baseline"]
        res.check("per-tensor peak driver memory <= default allocator's", peak <= d, f"ours {peak}, default {d}")

    # Graphs released: their pools go back.
    if graphs:
        del graphs
        import gc

        gc.collect()
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()
        left = fp.stats(dev)["graph_pools"]
        res.fig("graph_pools_after_release", len(left))
        # What may stay: PyTorch keeps a cuBLAS workspace per (handle, stream) for
        # the process's life, and the first capture on the capture stream allocates
        # it inside that graph's pool (32 MiB on Hopper: 4096 KiB x 8, PyTorch's
        # default CUBLAS_WORKSPACE_CONFIG). The default allocator keeps it in that
        # graph's private pool just the same. Every other released pool is gone.
        workspace = 32 << 20
        kept = [p for p in left if p["live"] == 1 and p["snapshot"]["live_requested_bytes"] == workspace]
        res.check(
            "graph pools destroyed once released (but one holding PyTorch's cuBLAS workspace)",
            len(left) <= 1 and len(kept) == len(left),
            left,
        )

    def oom():
        for what, size in [("too large", 200 * GIB)]:
            try:
                torch.empty(size, dtype=torch.uint8, device=dev)
                res.check(f"oom ({what}) raises", False, "no exception")
            except Exception as e:  # noqa: BLE001
                res.check(f"oom ({what}) raises", "request of" in str(e), f"{type(e).__name__}: {str(e)[:300]}")
        chunks = []
        try:
            for _ in range(40):
                chunks.append(torch.empty(10 * GIB, dtype=torch.uint8, device=dev))
            res.check("oom (device full) raises", False, "40 x 10 GiB fitted")
        except Exception as e:  # noqa: BLE001
            res.check("oom (device full) raises", "request of" in str(e), f"after {len(chunks)} x 10 GiB: {type(e).__name__}: {str(e)[:300]}")
        del chunks
        torch.cuda.empty_cache()
        compare(torch, res, "eager after the out-of-memory == reference", run_eager(torch, model, dev, []), ref["eager"])

    res.guard("oom", oom)

    def two_streams():
        s1, s2 = torch.cuda.Stream(dev), torch.cuda.Stream(dev)
        n = 16 << 20
        with torch.cuda.stream(s1):
            x = torch.ones(n, dtype=torch.float32, device=dev)
        y = torch.empty(n, dtype=torch.float32, device=dev)
        s2.wait_stream(s1)
        with torch.cuda.stream(s2):
            torch.cuda._sleep(int(2e9))  # about a second of queued work on s2
            y.copy_(x)
        x.record_stream(s2)
        xp = x.data_ptr()
        del x  # freed on s1 while s2's copy is queued
        with torch.cuda.stream(s1):
            z = torch.full((n,), 2.0, dtype=torch.float32, device=dev)
        zp = z.data_ptr()
        torch.cuda.synchronize(dev)
        ok = bool((y == 1).all().item())
        res.check("two streams: record_stream memory not reused before s2 completes", ok and zp != xp, f"y intact: {ok}, reused address: {zp == xp}")

    res.guard("two streams", two_streams)
    res.fig("decode_step_ms", decode_loop(torch, model, dev, steps=100 if quick else 300))
    if "decode_step_ms" in ref_fig:
        r = res.d["figures"]["decode_step_ms"] / ref_fig["decode_step_ms"]
        res.fig("decode_step_ratio_ours_over_default", r)
        # Informative only: one process each. The check is the decode part's.
    res.fig("stats_tensor", {k: v for k, v in fp.stats(dev)["tensor"].items() if k.endswith(("bytes", "count", "hits"))})
    res.check("no hook failed", fp.hook_failures() == 0, f"{fp.hook_failures()} failures; last error: {fp.last_error()}")


def part_tensor_short(torch, res, out, quick):
    """For compute-sanitizer: install, a small model, eager, one graph, frees."""
    global SHAPES
    import flare_package as fp

    fp.install()
    model = build_model(torch, 0, blocks=2, hidden=256, heads=4, kv_heads=2, inter=512, vocab=1024)
    with torch.no_grad():
        for shape in SHAPES[:3]:
            model(inputs(torch, shape, 1, 0, vocab=1024))
    saved, SHAPES = SHAPES, SHAPES[:2]
    try:
        # The model's vocabulary is 1024: inputs drawn from the default 8192 made
        # the embedding assert (index out of range) under compute-sanitizer.
        graphs = capture_graphs(torch, model, 0, vocab=1024)
        for g, _, _ in graphs.values():
            g.replay()
        torch.cuda.synchronize()
        del graphs
    finally:
        SHAPES = saved
    torch.cuda.empty_cache()
    res.check("no hook failed", fp.hook_failures() == 0, fp.last_error())


def alloc_pair_us(torch, device, n=20000, reps=5):
    """An allocate + free pair of a 4 KiB tensor (`torch.empty`, then dropped),
    host time per pair, median of reps, microseconds: the allocator's own cost as
    PyTorch calls it (its caching allocator, or the pluggable path into ours)."""
    times = []
    for _ in range(200):
        torch.empty(1024, device=device)
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            torch.empty(1024, device=device)
        times.append((time.perf_counter() - t0) / n * 1e6)
    times.sort()
    return times[len(times) // 2]


def part_decode(torch, res, out, quick):
    """One decode-loop measurement in this process (the allocator installed by
    child() for decode_flare, PyTorch's default for decode_default), and the
    allocate + free pair alone."""
    model = build_model(torch, 0)
    res.fig("decode_step_ms", decode_loop(torch, model, 0, steps=100 if quick else 300))
    res.fig("alloc_pair_us", alloc_pair_us(torch, 0))


def run_decode(out, quick, timeout, env):
    """Alternates DECODE_ROUNDS processes of the default allocator and of ours on
    the same loop; ours must not be slower: median over median <= 1.0, with the
    spread of each side reported."""
    t0 = time.time()
    ms = {"decode_default": [], "decode_flare": []}
    pair = {"decode_default": [], "decode_flare": []}
    errors = []
    for _ in range(DECODE_ROUNDS):
        for part in ms:
            r = run_part(part, out, quick, timeout, env)
            v = r.get("figures", {}).get("decode_step_ms")
            if v is None:
                errors.append(f"{part}: {r.get('errors')} rc={r.get('rc')}")
            else:
                ms[part].append(v)
                pair[part].append(r["figures"].get("alloc_pair_us"))
    res = {"part": "decode", "checks": {}, "figures": {k: sorted(v) for k, v in ms.items()}, "errors": errors, "rc": 0}
    res["figures"]["alloc_pair_us"] = {k: sorted(x for x in v if x is not None) for k, v in pair.items()}
    if all(ms.values()):
        med = {k: sorted(v)[len(v) // 2] for k, v in ms.items()}
        ratio = med["decode_flare"] / med["decode_default"]
        res["figures"]["median_ratio_ours_over_default"] = ratio
        res["checks"]["decode loop not slower than the default allocator (median of alternating processes)"] = {
            "ok": ratio <= 1.0,
            "detail": f"{ratio:.3f} (ours {med['decode_flare']:.3f} ms, default {med['decode_default']:.3f} ms)",
        }
    res["seconds"] = round(time.time() - t0, 1)
    (out / "decode.json").write_text(json.dumps(res, indent=1, default=str))
    return res


def part_mempool(torch, res, out, quick):
    import flare_package as fp

    dev = 0
    ref = load_ref(torch, out)
    pool = fp.mempool(dev)

    def reserved():
        return sum(seg["total_size"] for seg in pool.snapshot())

    def exact(when):
        ours = fp.stats(dev)["mempool"]["physical_bytes"]
        res.check(f"mempool: our physical == pool reserved ({when})", ours == reserved(), f"ours {ours}, reserved {reserved()}")

    with torch.cuda.use_mem_pool(pool):
        model = build_model(torch, dev)
        eager = run_eager(torch, model, dev, [])
    compare(torch, res, "mempool: eager == reference", eager, ref["eager"])
    exact("after eager")
    graphs = res.guard("capture", lambda: capture_graphs(torch, model, dev, pool=pool.id))
    if graphs:
        exact("after captures")
        compare(torch, res, "mempool: graph replay == reference", replay_all(torch, graphs, dev), ref["graph"])
        with torch.cuda.use_mem_pool(pool):
            aliasing(torch, res, graphs, dev, ref["graph"])
    res.fig("pool_reserved_bytes", reserved())
    res.fig("ours", {k: v for k, v in fp.stats(dev)["mempool"].items() if k.endswith("bytes")})

    def oom():
        try:
            with torch.cuda.use_mem_pool(pool):
                torch.empty(200 * GIB, dtype=torch.uint8, device=dev)
            res.check("mempool: oom raises torch.OutOfMemoryError", False, "no exception")
        except Exception as e:  # noqa: BLE001
            res.check("mempool: oom raises torch.OutOfMemoryError", isinstance(e, torch.OutOfMemoryError), f"{type(e).__name__}: {str(e)[:300]}")
        with torch.cuda.use_mem_pool(pool):
            compare(torch, res, "mempool: eager after the out-of-memory == reference", run_eager(torch, model, dev, []), ref["eager"])
        exact("after the out-of-memory")

    res.guard("oom", oom)
    res.check("no hook failed", fp.hook_failures() == 0, fp.last_error())


def part_two_gpu(torch, res, out, quick):
    import flare_package as fp

    if torch.cuda.device_count() < 2:
        res.d["skipped"] = f"only {torch.cuda.device_count()} GPU visible: the two-GPU part needs 2"
        return
    fp.install()
    ref = load_ref(torch, out)
    for dev in (0, 1):
        with torch.cuda.device(dev):
            model = build_model(torch, dev)
            compare(torch, res, f"device {dev}: eager == reference", run_eager(torch, model, dev, []), ref["eager"])
            del model
    a = torch.randn(64 << 20, device=0)
    b = a.to(1)
    c = b.to(0)
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    res.check("peer copy 0 -> 1 -> 0", torch.equal(a, c) and torch.equal(a.cpu(), b.cpu()), f"peer access 0->1: {torch.cuda.can_device_access_peer(0, 1)}")
    k = torch.empty_like(b)
    k.copy_(a)  # device 1 <- device 0 through copy_
    torch.cuda.synchronize(1)
    res.check("copy_ across devices", torch.equal(k.cpu(), a.cpu()))
    s0, s1 = fp.stats(0), fp.stats(1)
    res.check("one pool per device", s0["created"] and s1["created"] and s0["physical_bytes"] > 0 and s1["physical_bytes"] > 0, f"physical {s0['physical_bytes']}, {s1['physical_bytes']}")
    res.fig("physical_bytes", [s0["physical_bytes"], s1["physical_bytes"]])
    res.check("no hook failed", fp.hook_failures() == 0, fp.last_error())


def part_record(torch, res, out, quick):
    """Runs the model with recording on (FLARE_TORCH_RECORD, set by main for this
    part), then writes each pool's recorded peak physical bytes for the parent to
    compare with the replays."""
    import flare_package as fp

    dev = 0
    model = build_model(torch, dev)
    compare(torch, res, "eager == reference", run_eager(torch, model, dev, []), load_ref(torch, out)["eager"])
    graphs = capture_graphs(torch, model, dev)
    replay_all(torch, graphs, dev)
    torch.cuda.synchronize(dev)
    s = fp.stats(dev)
    peaks = {"tensor": s["tensor"]["peak_physical_bytes"], "mempool": s["mempool"]["peak_physical_bytes"]}
    # graph-K: the K-th graph pool made on the device; PyTorch numbers its graphs'
    # pools (n, 0) in the order they are made.
    for k, g in enumerate(sorted(s["graph_pools"], key=lambda g: tuple(g["id"])), start=1):
        peaks[f"graph-{k}"] = g["snapshot"]["peak_physical_bytes"]
    fp.record_flush()
    res.fig("recorded_peaks", peaks)
    res.check("no hook failed", fp.hook_failures() == 0, fp.last_error())


def replay_recorded(out, res):
    """The parent's half of the record part: each recorded pool's trace replayed
    as recorded, its peak physical bytes compared with the pool's own."""
    exe = os.environ.get("FLARE_REPLAY") or str(REPO / "target" / "release" / "flare-replay")
    if not os.path.exists(exe):
        res["errors"].append(f"flare-replay not found at {exe} (set FLARE_REPLAY)")
        return
    peaks = res.get("figures", {}).get("recorded_peaks", {})
    replayed = {}
    for name, want in peaks.items():
        path = out / "record" / f"run.dev0.{name}.trace"
        if not path.exists():
            res["checks"][f"{name}: trace written"] = {"ok": False, "detail": str(path)}
            continue
        p = subprocess.run([exe, "--as-recorded", "--json", str(path)], capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            res["checks"][f"{name}: replays"] = {"ok": False, "detail": p.stderr[-500:]}
            continue
        got = json.loads(p.stdout.splitlines()[-1])["peak_physical_bytes"]
        replayed[name] = got
        res["checks"][f"{name}: replay peak physical == recorded"] = {"ok": got == want, "detail": f"replay {got}, recorded {want} ({path.stat().st_size} bytes of trace)"}
    res["figures"]["replayed_peaks"] = replayed


PART_FUNCS = {
    "reference": part_reference,
    "tensor": part_tensor,
    "tensor_short": part_tensor_short,
    "mempool": part_mempool,
    "two_gpu": part_two_gpu,
    "record": part_record,
    "decode_default": part_decode,
    "decode_flare": part_decode,
}


def child(part, out, quick):
    res = Result(part)
    try:
        if part.startswith("decode") and hasattr(os, "sched_setaffinity"):
            # Both sides of the timing on the same 4 cores: the step is host-bound
            # (Python and launches), and runs moved between cores spread the
            # per-process figures by 20% (6.8 to 9.6 ms for the same allocator).
            cores = sorted(os.sched_getaffinity(0))
            if len(cores) >= 6:
                os.sched_setaffinity(0, set(cores[2:6]))
            res.fig("cores", sorted(os.sched_getaffinity(0)))
        import torch

        if part.startswith("tensor") or part in ("two_gpu", "decode_flare", "record"):
            # Before anything touches CUDA: PyTorch swaps its allocator only before
            # it is initialised, and asking for the device's name initialises it
            # ("Can't swap an already initialized allocator", seen on the H200).
            import flare_package as fp

            fp.install()
        torch.use_deterministic_algorithms(True, warn_only=True)
        res.fig("torch", torch.__version__)
        res.fig("gpu", torch.cuda.get_device_name(0))
        PART_FUNCS[part](torch, res, out, quick)
    except Exception as e:  # noqa: BLE001
        res.d["errors"].append(f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}")
    (out / f"{part}.json").write_text(json.dumps(res.d, indent=1, default=str))
    failed = res.d["errors"] or any(not c["ok"] for c in res.d["checks"].values())
    sys.exit(1 if failed else 0)


# ----------------------------------------------------------------------------- driver
def run_part(part, out, quick, timeout, env):
    t0 = time.time()
    if part == "sanitizer":
        cs = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
        if not os.path.exists(cs):
            return {"part": part, "skipped": "compute-sanitizer not found (PATH, /usr/local/cuda/bin)", "checks": {}, "figures": {}, "errors": [], "rc": 0, "seconds": 0}
        sub = out / "sanitizer"
        sub.mkdir(exist_ok=True)
        cmd = [cs, "--tool", "memcheck", "--error-exitcode", "99", sys.executable, str(HERE), str(sub), "--child", "tensor_short"]
    else:
        cmd = [sys.executable, str(HERE), str(out), "--child", part] + (["--quick"] if quick else [])
    # A part run again (the decode rounds) must not read the previous run's result.
    (out / f"{part}.json").unlink(missing_ok=True)
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        rc, log = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        rc, log = "timeout", f"timed out after {timeout} s\n{(e.stdout or b'')[-4000:]!r}{(e.stderr or b'')[-4000:]!r}"
    (out / f"{part}.log").write_text(log)
    if part == "sanitizer":
        ok = rc == 0 and "ERROR SUMMARY: 0 errors" in log
        r = {"part": part, "checks": {"memcheck clean": {"ok": ok, "detail": f"rc={rc}; " + "\n".join(log.splitlines()[-15:])}}, "figures": {}, "errors": []}
    else:
        f = out / f"{part}.json"
        r = json.loads(f.read_text()) if f.exists() else {"part": part, "checks": {}, "figures": {}, "errors": [f"no result (rc={rc}): {log[-3000:]}"]}
    r["rc"], r["seconds"] = rc, round(time.time() - t0, 1)
    (out / f"{part}.json").write_text(json.dumps(r, indent=1, default=str))
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=pathlib.Path, help="directory for the results (created)")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {PARTS}")
    ap.add_argument("--timeout", type=int, default=540, help="seconds per part (default 540)")
    ap.add_argument("--quick", action="store_true", help="shorter timing loops")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    if a.child:
        child(a.child, a.out, a.quick)
    env = dict(os.environ)
    env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    env["PYTHONPATH"] = str(REPO / "python") + os.pathsep + env.get("PYTHONPATH", "")
    parts = [p for p in a.parts.split(",") if p]
    results = []
    for part in parts:
        penv = dict(env)
        if part == "two_gpu":
            penv.setdefault("FLARE_TORCH_PEERS", "0,1")
        if part == "record":
            (a.out / "record").mkdir(exist_ok=True)
            penv["FLARE_TORCH_RECORD"] = str(a.out / "record" / "run")
        print(f"== {part}", flush=True)
        if part == "decode":
            r = run_decode(a.out, a.quick, a.timeout, penv)
        else:
            r = run_part(part, a.out, a.quick, a.timeout, penv)
            if part == "record" and not r.get("errors"):
                replay_recorded(a.out, r)
        results.append(r)
        if r.get("skipped"):
            print(f"   SKIPPED: {r['skipped']}")
        for k, c in r.get("checks", {}).items():
            print(f"   [{'PASS' if c['ok'] else 'FAIL'}] {k}: {c['detail'].splitlines()[0][:200] if c['detail'] else ''}")
        for k, v in r.get("figures", {}).items():
            print(f"   {k}: {json.dumps(v, default=str)[:300]}")
        for e in r.get("errors", []):
            print(f"   ERROR: {e[:1500]}")
        print(f"   rc={r['rc']} ({r['seconds']} s)", flush=True)
    failed = [r["part"] for r in results if r.get("errors") or any(not c["ok"] for c in r.get("checks", {}).values()) or (r["rc"] not in (0,) and not r.get("skipped"))]
    skipped = [r["part"] for r in results if r.get("skipped")]
    summary = {"parts": parts, "failed": failed, "skipped": skipped, "results": results}
    (a.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print(f"\nsummary: {len(parts) - len(failed)}/{len(parts)} parts passed" + (f"; failed: {failed}" if failed else "") + (f"; skipped: {skipped}" if skipped else ""))
    print(f"results: {a.out}/summary.json and {a.out}/<part>.json, logs {a.out}/<part>.log")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
