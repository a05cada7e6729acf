#!/usr/bin/env python3
"""Workload benchmark (issue 39): PyTorch's default allocator, PyTorch with
expandable segments, flare-package per tensor (install()) and flare-package as a
MemPool (mempool()), on serving with new shapes, many CUDA graphs in one pool and
training with varying lengths. Each (workload, allocator, round) runs in its own
process; docs/workloads.md explains the workloads and every figure.

    cargo clib        # the library: target/release/libflare_package.so (or set FLARE_PACKAGE_LIB)
    python3 python/bench/run.py OUTDIR [--workloads serving,graphs,training]
        [--allocators default,expandable,flare,flare-mempool] [--rounds R] [--quick]
    python3 python/bench/run.py --report OUTDIR [OUTDIR ...] [--into DIR]   # report.md + PNGs from saved JSON
    python3 python/bench/run.py OUT --device cpu --tiny                     # CPU smoke test (flare skipped)

Needs torch and transformers on the GPU machine (random weights, no download),
matplotlib for the pictures (the report part imports it; the children do not).
Writes OUTDIR/runs/<workload>.<allocator>.r<round>.json (each child's own,
partial while it runs), OUTDIR/results.json and OUTDIR/report.md after every
child, and OUTDIR/<workload>.png at the end. Exit status 1 if a child failed.

Runs (the graphs workload adds flare+retention after flare: a retention scope
around warm-up and capture; flare-mempool does not run training: use_mem_pool
routes only the calling thread, and backward runs on autograd's thread):
  serving   4 processes; graphs 5; training 3.

Time on one H100 (estimates: the CPU smoke test could measure only the imports of
torch + transformers, 4-6 s on a 2-core machine; process start-up with the model
built on the GPU ~8-10 s), one round:
  serving    200 generate calls (batch 1-8, prompt 32-3072 log-uniform, 8 new
             tokens; ~250 ms a call with transformers' eager decode) ~50 s +
             budget search ~5 s + start ~10 s = ~70 s a process: ~5 min for 4;
  graphs     35 warm-ups + captures ~2 s, 600 replays ~2 s, search ~2 s, start
             ~10 s = ~15 s a process: ~1.5 min for 5;
  training   200 steps (batch 4, length 64-2048 log-uniform, ~100 ms a step)
             ~20 s + search ~2 s + start ~10 s = ~30 s a process: ~1.5 min for 3.
  Whole: ~8 min (the budget is 12). In two calls of at most 9 minutes:
    call 1: run.py $OUT/serving --workloads serving --deadline 520 --runs-dir /tmp/runs1          (~5 min)
    call 2: run.py $OUT/graphs-training --workloads graphs,training --deadline 520 --runs-dir /tmp/runs2  (~3 min)
    then:   run.py --report OUT1 OUT2 --into DIR        (merges the two results.json; no GPU)
  (--runs-dir outside $OUT: the device tool brings back at most 8 files; OUTDIR
  then holds results.json, report.md, meta.json and the PNGs, and results.json
  holds every run.)
  --deadline S cuts each child's timeout to what is left of S seconds and skips
  (records as skipped) the runs that no longer fit, so a call ends with its report.
  --quick: every workload and allocator in under 2 minutes (13 processes of
  ~6-8 s). --rounds R multiplies the time by R (rounds after the first skip the
  budget search).
"""

import os
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
# Run as a script, Python puts this directory first on the path: take it off
# (its module names would shadow others'), and import the package from python/.
if sys.path and pathlib.Path(sys.path[0] or ".").resolve() == HERE:
    sys.path.pop(0)
PYTHON = str(HERE.parent)
if os.environ.get("FLARE_PACKAGE_TEST_INSTALLED") == "1":
    sys.path.append(PYTHON)  # the installed flare_package comes first
else:
    sys.path.insert(0, PYTHON)

from bench import cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:], __doc__))
