#!/usr/bin/env python3
"""memory_viz snapshots on a GPU (issue 38): flare_package as PyTorch's allocator
(per tensor), a small model's forward and a CUDA graph capture and replay, then
``flare_package.dump_snapshot(path)``; the pickle is loaded and rendered by
PyTorch's own ``torch.cuda._memory_viz`` (the segment and trace views as HTML, the
text summaries), and checked as the memory_viz page reads it
(``python/tests/memory_viz_model.py``). Pickles written by ``flare-replay --viz``
go through the same rendering.

    cargo clib && cargo build --release -p flare-tools
    python3 python/tests/gpu/viz_check.py OUTDIR [REPLAY.pickle ...]

With no REPLAY.pickle, one is made with ``flare-replay --policy segments --viz``
($FLARE_REPLAY, else target/release/flare-replay) on
tests/data/graph-warmup-20sizes.segment.trace when the binary is there.

The package is the checkout's (python/), the library $FLARE_PACKAGE_LIB, else the
checkout's target/release/libflare_package.so (as python/tests/gpu/run_h200.py).
Writes OUTDIR/{model.pickle, *.html, summary.json}; prints a short summary; exit 0
when every check passed.
"""

import argparse
import json
import os
import pathlib
import pickle
import subprocess
import sys
import traceback

HERE = pathlib.Path(__file__).resolve()
REPO = HERE.parents[3]
if os.environ.get("FLARE_PACKAGE_TEST_INSTALLED") != "1":
    sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(HERE.parents[1]))
# Read when the allocator is made (the first CUDA allocation): every pool keeps
# its recent events for the snapshot's trace.
os.environ.setdefault("FLARE_TORCH_HISTORY", "200000")

import memory_viz_model  # noqa: E402

MIB = 1 << 20


def render(mv, data, out, name):
    """Every view torch.cuda._memory_viz has for a snapshot, written to OUT; returns
    what was made (an exception is the check failing)."""
    made = {}
    # The segment view ("Allocator State History") and the trace views ("Active
    # Memory Timeline", and per segment): the HTML the page is embedded in.
    for fn, kwargs, suffix in (
        ("segment_plot", {}, "segments"),
        ("trace_plot", {}, "trace"),
        ("trace_plot", {"plot_segments": True}, "trace-segments"),
    ):
        if not hasattr(mv, fn):
            made[suffix] = f"no {fn} in this PyTorch"
            continue
        html = getattr(mv, fn)(data, **kwargs)
        assert isinstance(html, str) and "snapshot.pickle" in html, f"{fn}: no snapshot"
        path = out / f"{name}.{suffix}.html"
        path.write_text(html)
        made[suffix] = str(path)
    # The text views: segsum asserts that every segment's bytes are accounted.
    if hasattr(mv, "segsum"):
        text = mv.segsum(data)
        (out / f"{name}.segsum.txt").write_text(text)
        made["segsum"] = text.splitlines()[-12:-9]
    if hasattr(mv, "trace"):
        text = mv.trace(data)
        (out / f"{name}.trace.txt").write_text(text)
        made["trace_lines"] = len(text.splitlines())
    return made


def summarize(data):
    s = memory_viz_model.check(data)
    s.pop("actions")
    s["pool_ids"] = sorted({tuple(x["segment_pool_id"]) for x in data["segments"]})
    s["actions"] = {}
    for t in data["device_traces"]:
        for e in t:
            s["actions"][e["action"]] = s["actions"].get(e["action"], 0) + 1
    return s


def model_run(out):
    """install(), a forward, a graph capture and replays, dump_snapshot()."""
    import torch
    import flare_package as fp

    fp.install()
    torch.manual_seed(0)
    dev = "cuda"
    model = torch.nn.Sequential(
        torch.nn.TransformerEncoderLayer(
            d_model=512, nhead=8, dim_feedforward=2048, batch_first=True
        ),
        torch.nn.TransformerEncoderLayer(
            d_model=512, nhead=8, dim_feedforward=2048, batch_first=True
        ),
    ).to(dev).eval()
    with torch.no_grad(), fp.history_frame("eager"):
        for seq in (64, 200, 333):
            y = model(torch.randn(4, seq, 512, device=dev))
            torch.cuda.synchronize()
    static_in = torch.randn(4, 128, 512, device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side), fp.history_frame("warmup"):
        for _ in range(2):
            model(static_in)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), fp.history_frame("capture"), torch.cuda.graph(graph):
        static_out = model(static_in)
    for _ in range(3):
        static_in.copy_(torch.randn_like(static_in))
        graph.replay()
    torch.cuda.synchronize()
    expect = model(static_in)
    assert torch.allclose(static_out, expect, atol=1e-3, rtol=1e-3), "graph replay differs"
    path = out / "model.pickle"
    fp.dump_snapshot(str(path))
    stats = fp.stats(0)
    del y
    return path, stats


def replay_pickles(out, given):
    if given:
        return [pathlib.Path(p) for p in given]
    binary = pathlib.Path(os.environ.get("FLARE_REPLAY", REPO / "target/release/flare-replay"))
    trace = REPO / "tests/data/graph-warmup-20sizes.segment.trace"
    if not binary.is_file():
        print(f"no {binary}: no flare-replay --viz pickle checked (give one as an argument)")
        return []
    path = out / "replay.pickle"
    subprocess.run(
        [str(binary), "--policy", "segments", "--viz", str(path), str(trace)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return [path]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("replay", nargs="*", help="pickles written by flare-replay --viz")
    args = ap.parse_args()
    out = pathlib.Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    failed = False
    import torch
    import torch.cuda._memory_viz as mv

    results["torch"] = torch.__version__
    try:
        path, stats = model_run(out)
        with open(path, "rb") as f:
            data = pickle.load(f)
        s = summarize(data)
        # The pools' own bytes: the snapshot holds every pool of the device.
        assert s["total_bytes"] == stats["physical_bytes"], (
            f"snapshot {s['total_bytes']} bytes, pools {stats['physical_bytes']}"
        )
        assert any(p != (0, 0) for p in s["pool_ids"]), "no graph pool segment"
        for action in ("alloc", "free_requested", "free_completed", "segment_map"):
            assert s["actions"].get(action), f"no {action} event"
        s["rendered"] = render(mv, data, out, "model")
        results["model"] = s
    except Exception:
        failed = True
        results["model"] = {"error": traceback.format_exc()}
    for i, p in enumerate(replay_pickles(out, args.replay)):
        key = f"replay{i}"
        try:
            with open(p, "rb") as f:
                data = pickle.load(f)
            s = summarize(data)
            s["file"] = str(p)
            s["rendered"] = render(mv, data, out, key)
            results[key] = s
        except Exception:
            failed = True
            results[key] = {"file": str(p), "error": traceback.format_exc()}
    (out / "summary.json").write_text(json.dumps(results, indent=1, default=str))
    for key, s in results.items():
        if key == "torch":
            print(f"torch {s}")
        elif "error" in s:
            print(f"{key}: FAILED\n{s['error']}")
        else:
            print(
                f"{key}: {s['segments']} segments, {s['blocks']} blocks, {s['events']} "
                f"trace events {s['actions']}, {s['total_bytes'] / MIB:.1f} MiB mapped, "
                f"{s['allocated_bytes'] / MIB:.1f} MiB allocated, pool ids "
                f"{s['pool_ids']}; rendered: {sorted(s['rendered'])}"
            )
    print("viz_check:", "FAILED" if failed else "ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
