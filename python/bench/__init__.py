"""The workload benchmark of issue 39: PyTorch's allocators against flare-package on
the workloads engines run (serving with new shapes, many CUDA graphs in one pool,
training with varying lengths). The command is ``python3 python/bench/run.py``
(run.py says how to run it and what each module does; docs/workloads.md explains
the workloads and every figure).

Modules, one concern each: ``config`` (names, sizes, budgets; no torch), ``cli``
(arguments), ``parent`` (the subprocesses, progress, partial results), ``child``
(one workload under one allocator in this process), ``memory`` (the sampling
thread, the driver ballast, the allocators' own counters), ``model`` (the
Llama-style model and its CUDA-graph decode step), ``workloads`` (serving, graphs,
training), ``search`` (the largest size that fits; no torch), ``aggregate``
(medians, p99, growth, equality, targets, merge; no torch) and ``report``
(report.md and the PNGs; matplotlib imported there only)."""
