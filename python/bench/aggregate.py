"""From the children's JSON to the figures and the targets (no torch, no
matplotlib: CI tests it on hand-written JSON).

Definitions (docs/workloads.md repeats them):
- time per step: the steps of phase "run" (serving: generate calls; graphs:
  replays; training: steps). Per run: median and p99 (nearest rank: the
  ceil(0.99 n)-th smallest). Per allocator: the median over rounds of the runs'
  medians (and of their p99s); the spread is (largest - smallest) / median of the
  runs' medians (the allocator against itself; None with one round); the ratio
  is the allocator's median of medians over the default allocator's.
- growth: over the "run" steps, max of the second half minus max of the first
  half (the second half starts at n // 2), of the driver memory at the end of each
  step (what the process holds between steps: what an allocator accumulates), and
  of the allocator's live bytes at the end of each step; also of the per-step
  driver peak (informative: it follows the largest shapes of each half).
- memory figures: per allocator the largest over its rounds (a peak is a worst
  case); the largest fit under the budget: the smallest over the rounds that
  searched.
- outputs: each run's per-step hashes against the reference run (the default
  allocator's first round that finished, else the first run that finished):
  equal, or the steps that differ."""

import math

from . import config


def median(xs):
    xs = sorted(x for x in xs if x is not None)
    n = len(xs)
    if n == 0:
        return None
    if n % 2:
        return xs[n // 2]
    return (xs[n // 2 - 1] + xs[n // 2]) / 2


def p99(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    return xs[max(0, math.ceil(0.99 * len(xs)) - 1)]


def growth(series):
    """max(second half) - max(first half); None with fewer than 2 values."""
    s = [x for x in series if x is not None]
    if len(s) < 2:
        return None
    h = len(s) // 2
    return max(s[h:]) - max(s[:h])


def run_steps(run, phase="run"):
    return [s for s in run.get("steps", []) if s.get("phase") == phase]


def run_figures(run):
    """One run's figures: its time per step, growth and the child's memory
    figures, flattened."""
    steps = run_steps(run)
    ms = [s["ms"] for s in steps]
    f = run.get("figures", {})
    peak = f.get("allocator_peak") or {}
    budget = f.get("budget") or {}
    return {
        "steps": len(steps),
        "median_ms": median(ms),
        "p99_ms": p99(ms),
        "growth_driver_bytes": growth([s.get("driver") for s in steps]),
        "growth_driver_peak_bytes": growth([s.get("driver_peak") for s in steps]),
        "growth_live_bytes": growth([s.get("live") for s in steps]),
        "driver_peak_bytes": f.get("driver_peak_bytes"),
        "driver_peak_step_bytes": f.get("driver_peak_step_bytes"),
        "allocator_peak_bytes": peak.get("bytes"),
        "allocator_peak_source": peak.get("source"),
        "driver_after_bytes": f.get("driver_after_bytes"),
        "driver_after_empty_cache_bytes": f.get("driver_after_empty_cache_bytes"),
        "held_after_bytes": f.get("held_after_bytes"),
        "held_after_empty_cache_bytes": f.get("held_after_empty_cache_bytes"),
        "budget_largest": budget.get("largest"),
        "budget_param": budget.get("param"),
        "budget_bytes": budget.get("budget_bytes"),
        "warmup_capture_s": f.get("phase_s", {}).get("warmup_capture_s"),
    }


def ok(run):
    return run.get("status") == "ok"


def reference_run(runs):
    """The run others are compared with: the default allocator's earliest round
    that finished, else the first run that finished; None if none did."""
    done = [r for r in runs if ok(r)]
    if not done:
        return None
    default = [r for r in done if r.get("allocator") == "default"]
    pool = default or done
    return min(pool, key=lambda r: (r.get("round", 0), r.get("source", "")))


def compare_outputs(run, ref):
    """{"equal", "steps", "differ" (indices, at most 20), "differ_count",
    "length" (run, reference) when they differ in length}."""
    a = run.get("outputs", {}).get("hashes", [])
    b = ref.get("outputs", {}).get("hashes", [])
    n = min(len(a), len(b))
    differ = [i for i in range(n) if a[i] != b[i]]
    out = {"equal": not differ and len(a) == len(b), "steps": n, "differ": differ[:20], "differ_count": len(differ)}
    if len(a) != len(b):
        out["length"] = [len(a), len(b)]
    return out


def by(runs, *keys):
    out = {}
    for r in runs:
        out.setdefault(tuple(r.get(k) for k in keys), []).append(r)
    return out


def largest(xs):
    xs = [x for x in xs if x is not None]
    return max(xs) if xs else None


def smallest(xs):
    xs = [x for x in xs if x is not None]
    return min(xs) if xs else None


def summarize_allocator(runs, ref):
    done = [r for r in runs if ok(r)]
    figs = [run_figures(r) for r in done]
    medians = [f["median_ms"] for f in figs if f["median_ms"] is not None]
    mm = median(medians)
    s = {
        "runs": len(runs),
        "ok": len(done),
        "failed": [r["run_id"] for r in runs if r.get("status") == "failed"],
        "skipped": sorted({r.get("reason", "") for r in runs if r.get("status") == "skipped"}),
        "round_medians_ms": medians,
        "median_ms": mm,
        "p99_ms": median([f["p99_ms"] for f in figs]),
        "spread": (max(medians) - min(medians)) / mm if len(medians) >= 2 and mm else None,
    }
    for k in ("driver_peak_bytes", "driver_peak_step_bytes", "allocator_peak_bytes", "driver_after_bytes",
              "driver_after_empty_cache_bytes", "held_after_bytes", "held_after_empty_cache_bytes",
              "growth_driver_bytes", "growth_driver_peak_bytes", "growth_live_bytes", "warmup_capture_s"):
        s[k] = largest(f[k] for f in figs)
    s["allocator_peak_source"] = next((f["allocator_peak_source"] for f in figs if f["allocator_peak_source"]), None)
    s["budget_largest"] = smallest(f["budget_largest"] for f in figs)
    s["budget_param"] = next((f["budget_param"] for f in figs if f["budget_param"]), None)
    s["budget_bytes"] = next((f["budget_bytes"] for f in figs if f["budget_bytes"]), None)
    if ref is not None:
        cmp = {r["run_id"]: compare_outputs(r, ref) for r in done}
        s["outputs"] = cmp
        s["outputs_equal"] = all(c["equal"] for c in cmp.values()) if cmp else None
    else:
        s["outputs"], s["outputs_equal"] = {}, None
    return s


def summarize(runs):
    """{workload: {"allocators": {variant: summary}, "reference": run_id,
    "gpus": [...], "targets": {...}}} over every run given (several sources
    merged: each run is one round)."""
    out = {}
    for (w,), wruns in sorted(by(runs, "workload").items(), key=lambda kv: order_key(config.WORKLOADS, kv[0][0])):
        ref = reference_run(wruns)
        allocs = {}
        for (a,), aruns in sorted(by(wruns, "allocator").items(), key=lambda kv: order_key(ALL_VARIANTS, kv[0][0])):
            allocs[a] = summarize_allocator(aruns, ref)
        base = allocs.get("default", {}).get("median_ms")
        for a, s in allocs.items():
            s["ratio_to_default"] = s["median_ms"] / base if base and s["median_ms"] is not None else None
        gpus = sorted({r.get("env", {}).get("gpu") for r in wruns if r.get("env", {}).get("gpu")})
        out[w] = {"allocators": allocs, "reference": ref["run_id"] if ref else None, "gpus": gpus}
        out[w]["targets"] = targets(allocs)
    return out


ALL_VARIANTS = config.ALLOCATORS[:2] + ["flare", config.RETENTION, "flare-mempool"]


def order_key(order, name):
    return (order.index(name) if name in order else len(order), name)


def verdict(state, text):
    return {"state": state, "detail": text}


def gib(b):
    return "n/a" if b is None else f"{b / config.GIB:.2f} GiB"


def mib(b):
    return "n/a" if b is None else f"{b / config.MIB:+.1f} MiB"


def targets(allocs):
    """Per flare variant: memory (peak driver memory at most the lower of the two
    PyTorch allocators'), growth (none beyond the live bytes' growth + a
    granule), time (median within 2% of the default's, or faster; "established"
    only when the difference from 1 exceeds both allocators' spreads between
    rounds) and outputs (equal to the reference). Each: state "holds", "misses"
    or "unknown" (a figure missing), and a detail."""
    out = {}
    torch_peaks = [allocs.get(a, {}).get("driver_peak_bytes") for a in config.PYTORCH_ALLOCATORS]
    for a in config.FLARE_ALLOCATORS:
        s = allocs.get(a)
        if s is None:
            continue
        if not s["ok"]:
            if s["failed"]:  # a failed run is a miss on every target, never left out
                out[a] = {"run": verdict("misses", f"no run finished: {', '.join(s['failed'])} failed")}
            continue
        t = {}
        peak = s["driver_peak_bytes"]
        if peak is None or any(p is None for p in torch_peaks):
            t["memory"] = verdict("unknown", "a peak is missing (a PyTorch allocator's run failed or was not run)")
        else:
            low = min(torch_peaks)
            t["memory"] = verdict(
                "holds" if peak <= low else "misses",
                f"{gib(peak)} vs {gib(low)} (the lower of default {gib(torch_peaks[0])} and expandable {gib(torch_peaks[1])}; {(peak / low - 1) * 100:+.1f}%)" if low else f"{gib(peak)} vs {gib(low)}",
            )
        g, gl = s["growth_driver_bytes"], s["growth_live_bytes"]
        if g is None:
            t["growth"] = verdict("unknown", "too few steps")
        else:
            allowed = max(gl or 0, 0) + config.GROWTH_SLACK
            t["growth"] = verdict("holds" if g <= allowed else "misses", f"driver {mib(g)}, live {mib(gl)} (allowed {mib(allowed)})")
        r = s["ratio_to_default"]
        if r is None:
            t["time"] = verdict("unknown", "no default-allocator timing")
        else:
            sd = allocs.get("default", {}).get("spread")
            sa = s["spread"]
            state = "holds" if r <= 1 + config.TIME_TOLERANCE else "misses"
            if sa is None or sd is None:
                est = "not established: one round each (no spread between rounds)"
            elif abs(r - 1) > max(sa, sd):
                est = f"established: |ratio - 1| {abs(r - 1) * 100:.1f}% > spreads {sa * 100:.1f}% / {sd * 100:.1f}%"
            else:
                est = f"not established: |ratio - 1| {abs(r - 1) * 100:.1f}% within the spreads {sa * 100:.1f}% (self) / {sd * 100:.1f}% (default)"
            t["time"] = verdict(state, f"ratio {r:.3f} ({s['median_ms']:.2f} ms vs {allocs['default']['median_ms']:.2f} ms); {est}")
        eq = s["outputs_equal"]
        if eq is None:
            t["outputs"] = verdict("unknown", "no reference run")
        else:
            bad = {k: v for k, v in s["outputs"].items() if not v["equal"]}
            t["outputs"] = verdict("holds" if eq else "misses", "bitwise equal" if eq else describe_differences(bad))
        out[a] = t
    return out


def describe_differences(bad):
    parts = []
    for run_id, c in bad.items():
        d = f"{run_id}: {c['differ_count']} of {c['steps']} steps differ"
        if c["differ"]:
            d += f" (first: {c['differ'][:10]})"
        if "length" in c:
            d += f"; {c['length'][0]} outputs vs the reference's {c['length'][1]}"
        parts.append(d)
    return "; ".join(parts)


def self_equality(runs):
    """Per (workload, allocator) with several finished rounds: whether every
    round's outputs equal its first round's (the allocator against itself)."""
    out = {}
    for (w, a), rs in by([r for r in runs if ok(r)], "workload", "allocator").items():
        rs = sorted(rs, key=lambda r: (r.get("round", 0), r.get("source", "")))
        if len(rs) >= 2:
            out[f"{w}/{a}"] = all(compare_outputs(r, rs[0])["equal"] for r in rs[1:])
    return out


def merge(*run_lists):
    """Runs of several outputs (separate calls) as one list: each run keeps its
    source; a run id seen twice from the same source is kept once (the last)."""
    seen = {}
    for runs in run_lists:
        for r in runs:
            seen[(r.get("source"), r.get("run_id"))] = r
    return list(seen.values())
