"""OUTDIR/results.json, OUTDIR/report.md and one PNG per workload, from the
children's JSON of one or several output directories (``run.py --report``
merges the calls of a split run). matplotlib is imported here only, and only for
the pictures: without it the report says so and the rest is written."""

import json
import pathlib

from . import aggregate, config

GIB = config.GIB


def load_runs(dirs, runs_dir=None, only=None):
    """Every run of each directory (its runs/*.json, else its results.json's
    runs), each with its source: the directory's name. ``runs_dir``: where the
    children of a single directory wrote (--runs-dir); ``only``: the run ids to
    keep (the parent's plan: a runs directory may hold another call's too)."""
    out = []
    for d in dirs:
        d = pathlib.Path(d)
        rd = pathlib.Path(runs_dir) if runs_dir is not None else d / "runs"
        files = sorted(rd.glob("*.json")) if rd.is_dir() else []
        runs = []
        if files:
            for f in files:
                try:
                    runs.append(json.loads(f.read_text()))
                except ValueError as e:
                    runs.append({"run_id": f.stem, "status": "failed", "error": f"unreadable {f}: {e}",
                                 "workload": f.stem.split(".")[0], "allocator": "?"})
        elif (d / "results.json").exists():
            runs = json.loads((d / "results.json").read_text()).get("runs", [])
        if only is not None:
            runs = [r for r in runs if r.get("run_id") in only]
        for r in runs:
            r["source"] = d.name
        out.append(runs)
    return aggregate.merge(*out)


def load_meta(dirs):
    metas = []
    for d in dirs:
        p = pathlib.Path(d) / "meta.json"
        m = json.loads(p.read_text()) if p.exists() else {}
        m["source"] = pathlib.Path(d).name
        metas.append(m)
    return metas


def gib(b):
    return "–" if b is None else f"{b / GIB:.2f}"


def signed_mib(b):
    return "–" if b is None else f"{b / config.MIB:+.0f}"


def num(x, fmt="{:.2f}"):
    return "–" if x is None else fmt.format(x)


def params(n):
    if not n:
        return "?"
    return f"{n / 1e9:.2f} B" if n >= 1e8 else f"{n / 1e6:.2f} M"


def outputs_cell(s):
    if s["outputs_equal"] is None:
        return "–"
    if s["outputs_equal"]:
        return "equal"
    n = sum(c["differ_count"] for c in s["outputs"].values())
    return f"**differ** ({n} steps)"


def table(ws):
    head = ("| allocator | runs ok | peak driver GiB (sampled) | per step | allocator peak GiB | after run | after empty_cache "
            "| growth driver MiB (end / peak) | growth live MiB | largest fit | median ms | p99 ms | spread | vs default | outputs |")
    rows = [head, "|" + " --- |" * (head.count("|") - 1)]
    for a, s in ws["allocators"].items():
        if not s["ok"]:
            why = "; ".join(s["skipped"]) or ("failed: " + ", ".join(s["failed"]))
            rows.append(f"| {a} | 0/{s['runs']} | {why} |" + " |" * 12)
            continue
        spread = "n/a (1 round)" if s["spread"] is None else f"{s['spread'] * 100:.1f}%"
        ratio = num(s["ratio_to_default"], "{:.3f}")
        rows.append(
            f"| {a} | {s['ok']}/{s['runs']} | {gib(s['driver_peak_bytes'])} | {gib(s['driver_peak_step_bytes'])} "
            f"| {gib(s['allocator_peak_bytes'])} | {gib(s['driver_after_bytes'])} | {gib(s['driver_after_empty_cache_bytes'])} "
            f"| {signed_mib(s['growth_driver_bytes'])} / {signed_mib(s['growth_driver_peak_bytes'])} | {signed_mib(s['growth_live_bytes'])} "
            f"| {'–' if s['budget_largest'] is None else s['budget_largest']} "
            f"| {num(s['median_ms'])} | {num(s['p99_ms'])} | {spread} | {ratio} | {outputs_cell(s)} |"
        )
    return "\n".join(rows)


STEP_NAMES = {"serving": "generate call", "graphs": "replay", "training": "training step"}


def markdown(summary, runs, metas, pictures, self_eq=None):
    lines = ["# Workload benchmark (issue 39)", ""]
    lines.append("Made by `python3 python/bench/run.py` (docs/workloads.md: the workloads and how each figure is measured).")
    lines.append("")
    for m in metas:
        gpus = sorted({r.get("env", {}).get("gpu") for r in runs if r.get("source") == m["source"] and r.get("env", {}).get("gpu")})
        lines.append(
            f"- `{m['source']}`: {', '.join(gpus) or 'no GPU recorded'}; size {m.get('size')}, {m.get('rounds')} round(s), "
            f"workloads {','.join(m.get('workloads', []))}, allocators {','.join(m.get('allocators', []))}, "
            f"started {m.get('started')}, {m.get('seconds', '?')} s, commit {str(m.get('commit'))[:12]}"
        )
    envs = [r.get("env", {}) for r in runs if r.get("env", {}).get("torch")]
    if envs:
        e = envs[0]
        lines.append(f"- torch {e.get('torch')}, transformers {e.get('transformers')}, CUDA {e.get('cuda')}, "
                     f"deterministic algorithms {e.get('deterministic')}")
    lines += [
        "",
        "Driver memory is device memory in use (total - free from `torch.cuda.mem_get_info()`) minus its value "
        "before the workload's first allocation: *sampled* is the largest of a thread's samples every ~5 ms and "
        "the per-step samples; *per step* the largest per-step peak. *Allocator peak*: "
        "`torch.cuda.max_memory_reserved()` for PyTorch's allocators and flare-mempool (whose MemPool PyTorch's "
        "caching allocator manages), the sum of the pools' `peak_physical_bytes` from `flare_package.stats()` for "
        "flare. *Growth*: the largest per-step value of the run's second half minus that of its first half, "
        "of the driver memory at the end of each step (what the process holds between steps; the target's figure) "
        "and of the per-step peak (which follows the largest shapes drawn in each half), and of the live bytes. "
        "*Largest fit*: the largest prompt length (serving), decode batch (graphs) or sequence length (training) "
        "that runs when the process may use the budget (the workload's weights, optimizer states or KV cache as "
        "computed from the config, plus a fixed headroom), the rest of the device taken by a ballast allocated "
        "straight from the CUDA driver (`cuMemAlloc_v2`), the same for every allocator. Time: per step, median "
        "and p99; *spread*: (largest - smallest) / median of the rounds' medians of the same allocator.",
        "",
    ]
    if self_eq:
        lines.append("Each allocator against itself (every round's outputs equal to its first round's): "
                     + ", ".join(f"{k} {'equal' if v else '**differ**'}" for k, v in sorted(self_eq.items())) + ".")
        lines.append("")
    for w, ws in summary.items():
        lines.append(f"## {w}")
        lines.append("")
        if len(ws["gpus"]) > 1:
            lines.append(f"**Runs from different GPUs ({', '.join(ws['gpus'])}): the figures do not compare.**")
            lines.append("")
        some = next((r for r in runs if r.get("workload") == w and r.get("status") == "ok"), None)
        if some:
            b = some.get("figures", {}).get("budget") or {}
            mdl = some.get("model") or {}
            lines.append(f"Model: {params(mdl.get('parameters'))} parameters, attention {mdl.get('attn_implementation')}. "
                         f"Step: one {STEP_NAMES[w]}. Outputs compared: {some.get('outputs', {}).get('kind')}, "
                         f"reference run `{ws['reference']}`.")
            if "budget_bytes" in b:
                lines.append(f"Budget: {gib(b['budget_bytes'])} GiB ({gib(b['fixed_bytes'])} fixed + {gib(b['headroom_bytes'])} "
                             f"headroom); the search varies {b.get('param')} at batch {b.get('batch')}.")
            elif b.get("skipped"):
                lines.append(f"Budget search: {b['skipped']}.")
            lines.append("")
        lines.append(table(ws))
        lines.append("")
        if w == "graphs":
            caps = {a: s.get("warmup_capture_s") for a, s in ws["allocators"].items() if s.get("warmup_capture_s") is not None}
            if caps:
                lines.append("Warm-up and capture of every batch size, seconds: " + ", ".join(f"{a} {v:.2f}" for a, v in caps.items()) + ".")
            lines.append(config.RETENTION_NOTE + ".")
            lines.append("")
        if ws["targets"]:
            lines.append("Targets (issue 39; same run, same GPU):")
            lines.append("")
            for a, t in ws["targets"].items():
                for k, v in t.items():
                    mark = {"holds": "holds", "misses": "**MISSES**", "unknown": "unknown"}[v["state"]]
                    lines.append(f"- {a}, {k}: {mark}: {v['detail']}")
            lines.append("")
        for a, s in ws["allocators"].items():
            for rid in s["failed"]:
                r = next((x for x in runs if x.get("run_id") == rid and x.get("workload") == w), {})
                err = (r.get("error") or "").strip().splitlines()
                lines.append(f"- `{rid}` failed ({r.get('source')}, rc {r.get('rc')}): {err[-1][:400] if err else ''}")
                if r.get("stderr_tail"):
                    lines += ["", "```", r["stderr_tail"][-1500:].strip(), "```", ""]
        if pictures.get(w):
            lines.append(f"![{w}: driver memory over steps]({pictures[w]})")
            lines.append("")
        elif pictures.get("_missing"):
            lines.append(f"(no picture: {pictures['_missing']})")
            lines.append("")
    return "\n".join(lines) + "\n"


def first_ok_runs(runs, workload):
    """The run drawn per allocator: its earliest round that finished."""
    out = {}
    for r in sorted(runs, key=lambda r: (r.get("round", 0), r.get("source", ""))):
        if r.get("workload") == workload and r.get("status") == "ok":
            out.setdefault(r["allocator"], r)
    return out


def pictures_for(summary, runs, into):
    """One PNG per workload: per-step driver peak (GiB over the baseline) against
    the step index, one line per allocator; {workload: file name}, or
    {"_missing": why}."""
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError as e:
        return {"_missing": f"matplotlib not available ({e})"}
    out = {}
    for w in summary:
        chosen = first_ok_runs(runs, w)
        if not chosen:
            continue
        fig, ax = plt.subplots(figsize=(10, 5))
        for a in sorted(chosen, key=lambda a: aggregate.order_key(aggregate.ALL_VARIANTS, a)):
            steps = chosen[a].get("steps", [])
            ax.plot([s["i"] for s in steps], [s["driver_peak"] / GIB for s in steps], label=a, linewidth=1)
        caps = [s["i"] for s in next(iter(chosen.values())).get("steps", []) if s.get("phase") == "capture"]
        if caps:
            ax.axvline(max(caps) + 0.5, color="grey", linestyle=":", linewidth=1)
            ax.text(max(caps) + 1, ax.get_ylim()[1] * 0.98, "captures | replays", va="top", fontsize=8, color="grey")
        ax.set_xlabel("step (captures, then replays)" if caps else f"step ({STEP_NAMES.get(w, 'step')})")
        ax.set_ylabel("driver memory in use over the baseline, GiB (peak within the step)")
        gpu = next((r.get("env", {}).get("gpu") for r in chosen.values()), "")
        ax.set_title(f"{w}: memory over steps ({gpu})")
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        name = f"{w}.png"
        fig.savefig(pathlib.Path(into) / name, dpi=110)
        plt.close(fig)
        out[w] = name
    return out


def write_all(dirs, into, pictures=True, runs_dir=None, only=None):
    """Loads, aggregates and writes results.json, report.md (and the PNGs) into
    ``into``; returns the summary."""
    into = pathlib.Path(into)
    into.mkdir(parents=True, exist_ok=True)
    runs = load_runs(dirs, runs_dir, only)
    metas = load_meta(dirs)
    summary = aggregate.summarize(runs)
    pics = pictures_for(summary, runs, into) if pictures else {}
    results = {"sources": metas, "summary": summary, "self_equality": aggregate.self_equality(runs), "runs": runs}
    tmp = into / "results.json.tmp"
    tmp.write_text(json.dumps(results, default=str))
    tmp.replace(into / "results.json")
    (into / "report.md").write_text(markdown(summary, runs, metas, pics, results["self_equality"]))
    return summary
