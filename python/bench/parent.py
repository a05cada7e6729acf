"""The parent: one subprocess per (workload, allocator, round), allocators in
alternating order (round r runs them forwards when r is even, backwards when odd),
each with its environment and a timeout; a child that fails or times out is
recorded as failed with its stderr's tail and the others go on. After every child
the parent rewrites OUTDIR/results.json and OUTDIR/report.md (a killed run leaves
usable JSON: OUTDIR/runs/*.json holds each child's own), and prints a progress
line with the time, flushed. At the end: the pictures too."""

import json
import os
import pathlib
import platform
import subprocess
import sys
import time

from . import aggregate, config, report

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
RUN = HERE / "run.py"


# With --deadline: seconds kept for the final report, and the least a child is
# started with.
REPORT_RESERVE_S = 15
MIN_CHILD_S = 20


def stamp():
    return time.strftime("%H:%M:%S")


def say(text):
    print(f"[{stamp()}] {text}", flush=True)


def child_env(variant, device):
    """The child's environment: no allocator setting inherited; expandable
    segments for "expandable" (read by PyTorch when its allocator starts);
    cuBLAS's deterministic workspace; the checkout's python/ first on the path
    (unless FLARE_PACKAGE_TEST_INSTALLED=1: the installed flare_package); no hub
    access."""
    env = dict(os.environ)
    for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF"):
        env.pop(k, None)
    if config.base_allocator(variant) == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = "1"
    env["TOKENIZERS_PARALLELISM"] = "false"
    py = str(REPO / "python")
    if os.environ.get("FLARE_PACKAGE_TEST_INSTALLED") == "1":
        env["PYTHONPATH"] = env.get("PYTHONPATH", "") + os.pathsep + py
    else:
        env["PYTHONPATH"] = py + os.pathsep + env.get("PYTHONPATH", "")
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def tail(text, n=3000):
    text = text or ""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return text[-n:]


def run_child(spec, timeout, runs_dir):
    """Runs one child; returns its record (the child's JSON, with rc, seconds and
    the stderr tail added; a record of its own when the child wrote none or was
    killed)."""
    out = runs_dir / f"{spec['run_id']}.json"
    out.unlink(missing_ok=True)
    spec = dict(spec, out=str(out))
    cmd = [sys.executable, str(RUN), "--child", json.dumps(spec)]
    t0 = time.time()
    try:
        p = subprocess.run(cmd, env=child_env(spec["allocator"], spec["device"]), capture_output=True, text=True, timeout=timeout)
        rc, err = p.returncode, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, err = "timeout", f"killed after {timeout} s\n{tail(e.stderr)}"
    rec = None
    if out.exists():
        try:
            rec = json.loads(out.read_text())
        except ValueError as e:
            err = f"{err}\nunreadable result: {e}"
    if rec is None:
        rec = {k: spec[k] for k in ("run_id", "workload", "allocator", "round", "size", "device")}
        rec.update(status="failed", error=f"no result (rc={rc})", steps=[], figures={}, outputs={"hashes": []})
    if rc != 0 and rec.get("status") != "failed":
        rec["status"] = "failed"
        rec["error"] = (rec.get("error") or "") + f"\nchild exit status {rc} (it was {rec.get('status')!r} when it last wrote)"
    rec["rc"] = rc
    rec["seconds"] = round(time.time() - t0, 1)
    rec["stderr_tail"] = tail(err)
    out.write_text(json.dumps(rec, default=str))
    return rec


def skipped(spec, reason):
    rec = {k: spec[k] for k in ("run_id", "workload", "allocator", "round", "size", "device")}
    rec.update(status="skipped", reason=reason, steps=[], figures={}, outputs={"hashes": []})
    return rec


def schedule(workloads, allocators, rounds):
    """[(workload, variant, round)] in the order they run."""
    out = []
    for w in workloads:
        vs = config.variants(w, allocators)
        for r in range(rounds):
            for v in (vs if r % 2 == 0 else list(reversed(vs))):
                out.append((w, v, r))
    return out


def git_commit():
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception:  # noqa: BLE001
        return None


def line(rec):
    if rec["status"] != "ok":
        first = (rec.get("error") or rec.get("reason") or "").strip().splitlines()
        return f"{rec['status'].upper()}: {first[-1][:300] if first else ''}"
    f = aggregate.run_figures(rec)
    b = rec.get("figures", {}).get("budget", {})
    fit = f", largest {b.get('param')} under the budget {b.get('largest')}" if "largest" in b else ""
    med = "n/a" if f["median_ms"] is None else f"{f['median_ms']:.2f}"
    p = "n/a" if f["p99_ms"] is None else f"{f['p99_ms']:.2f}"
    return (f"ok in {rec.get('seconds')} s: {f['steps']} steps, median {med} ms, p99 {p} ms, "
            f"peak driver {aggregate.gib(f['driver_peak_bytes'])}{fit}")


def main(a):
    out = a.outdir
    out.mkdir(parents=True, exist_ok=True)
    runs_dir = a.runs_dir or out / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    size = "tiny" if a.tiny else ("quick" if a.quick else "full")
    meta = {
        "command": " ".join([sys.executable] + sys.argv),
        "workloads": a.workloads,
        "allocators": a.allocators,
        "rounds": a.rounds,
        "size": size,
        "device": a.device,
        "warn_only": a.warn_only,
        "budget_search": not a.no_budget,
        "deadline_s": a.deadline or None,
        "runs_dir": str(runs_dir),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "host": platform.node(),
        "commit": git_commit(),
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    plan = schedule(a.workloads, a.allocators, a.rounds)
    ids = {f"{w}.{v}.r{r}" for w, v, r in plan}
    for stale in ids:
        (runs_dir / f"{stale}.json").unlink(missing_ok=True)  # an earlier call's, into the same directory
    say(f"{len(plan)} runs ({size}, device {a.device}, {a.rounds} round(s)) into {out}")
    t_start = time.time()
    for i, (w, v, r) in enumerate(plan):
        spec = {
            "run_id": f"{w}.{v}.r{r}",  # the ids above
            "workload": w,
            "allocator": v,
            "round": r,
            "size": size,
            "device": a.device,
            "warn_only": a.warn_only,
            "budget": r == 0 and not a.no_budget,
        }
        base = config.base_allocator(v)
        reason = config.NOT_APPLICABLE.get((w, base))
        if reason is None and a.device == "cpu" and base.startswith("flare"):
            reason = "skipped on the CPU: the flare-package allocators need CUDA"
        if reason is not None:
            rec = skipped(spec, reason)
            (runs_dir / f"{spec['run_id']}.json").write_text(json.dumps(rec))
            say(f"({i + 1}/{len(plan)}) {w} / {v} / round {r}: SKIPPED: {reason}")
            continue
        timeout = a.timeout or config.TIMEOUTS[size][w]
        if a.deadline:
            left = a.deadline - (time.time() - t_start) - REPORT_RESERVE_S
            if left < MIN_CHILD_S:
                rec = skipped(spec, f"out of time: --deadline {a.deadline} s reached")
                (runs_dir / f"{spec['run_id']}.json").write_text(json.dumps(rec))
                say(f"({i + 1}/{len(plan)}) {w} / {v} / round {r}: SKIPPED: out of time (--deadline {a.deadline} s)")
                continue
            timeout = int(min(timeout, left))
        say(f"({i + 1}/{len(plan)}) {w} / {v} / round {r}: started (timeout {timeout} s)")
        rec = run_child(spec, timeout, runs_dir)
        say(f"({i + 1}/{len(plan)}) {w} / {v} / round {r}: {line(rec)}")
        if rec["status"] != "ok" and rec.get("stderr_tail"):
            for ln in rec["stderr_tail"].strip().splitlines()[-8:]:
                print(f"    {ln}", flush=True)
        try:
            report.write_all([out], out, pictures=False, runs_dir=runs_dir, only=ids)
        except Exception as e:  # noqa: BLE001
            say(f"partial report failed: {type(e).__name__}: {e}")
    meta["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    meta["seconds"] = round(time.time() - t_start, 1)
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    summary = report.write_all([out], out, pictures=True, runs_dir=runs_dir, only=ids)
    say(f"done in {meta['seconds']} s: {out / 'results.json'}, {out / 'report.md'}")
    for w, ws in summary.items():
        for a_, t in ws["targets"].items():
            states = ", ".join(f"{k} {v['state']}" for k, v in t.items())
            print(f"    {w} / {a_}: {states}", flush=True)
    failed = [r for r in report.load_runs([out], runs_dir=runs_dir, only=ids) if r.get("status") == "failed"]
    return 1 if failed else 0
