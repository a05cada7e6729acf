"""Names, sizes and budgets of the benchmark (no torch: the parent, the report and
the CI tests read it).

Three sizes: ``full`` (the GPU run: a Llama-style model of 0.85 B parameters),
``quick`` (the GPU smoke test: everything in under 2 minutes) and ``tiny`` (the
CPU smoke test: a model of a few hundred thousand parameters)."""

GIB = 1 << 30
MIB = 1 << 20

WORKLOADS = ["serving", "graphs", "training"]
ALLOCATORS = ["default", "expandable", "flare", "flare-mempool"]
# The graphs workload runs "flare" a second time with a retention scope around the
# warm-up and the captures (flare_package.retention()): a variant of its own.
RETENTION = "flare+retention"
# The allocators a variant is made of (its process installs the first).
BASE = {RETENTION: "flare"}
PYTORCH_ALLOCATORS = ["default", "expandable"]
FLARE_ALLOCATORS = ["flare", "flare-mempool", RETENTION]
SIZES = ["full", "quick", "tiny"]

# Where the benchmark does not run an allocator, and why (the report says it).
NOT_APPLICABLE = {
    ("training", "flare-mempool"): (
        "not applicable: torch.cuda.use_mem_pool() routes only the calling thread's "
        "allocations, and backward runs on autograd's device thread (PyTorch's "
        "documentation of use_mem_pool), so the gradients would come from PyTorch's "
        "default allocator: the figures would mix two allocators"
    ),
}
RETENTION_NOTE = (
    "flare-mempool has no retention variant: retention() is a scope on the "
    "per-tensor pool of install(), which the MemPool mode does not use (its graphs' "
    "eager warm-up runs in PyTorch's default allocator, the captures in the flare MemPool)"
)

MODELS = {
    # hidden 2048, 16 layers, intermediate 5632, 32 heads / 8 KV heads, vocabulary
    # 32000: 0.85 B parameters (1.7 GB in bf16).
    "full": dict(hidden=2048, layers=16, inter=5632, heads=32, kv_heads=8, vocab=32000),
    "quick": dict(hidden=512, layers=4, inter=1408, heads=8, kv_heads=2, vocab=8192),
    "tiny": dict(hidden=64, layers=2, inter=128, heads=4, kv_heads=2, vocab=512),
}

# Per workload and size. serving: `calls` generate calls, batch and prompt length
# drawn per call; graphs: `batches` captured into one pool, `replays` in a mixed
# order; training: `steps` steps, sequence length drawn per step. `headroom`: the
# memory budget of the largest-size search is the workload's fixed bytes (weights,
# optimizer states, KV cache: config-derived, the same for every allocator) plus
# this; the search varies `probe` at batch `probe_batch` from `probe_start`
# (doubling, then bisection to `probe_step`, at most `probe_max` probes) up to
# `probe_limit`.
WORKLOAD_SIZES = {
    "serving": {
        "full": dict(calls=200, batch=(1, 8), prompt=(32, 3072), new_tokens=8, headroom=3 * GIB,
                     probe="prompt_len", probe_batch=8, probe_start=1024, probe_limit=65536, probe_step=64, probe_max=10),
        "quick": dict(calls=20, batch=(1, 4), prompt=(8, 256), new_tokens=4, headroom=256 * MIB,
                      probe="prompt_len", probe_batch=4, probe_start=256, probe_limit=8192, probe_step=64, probe_max=6),
        "tiny": dict(calls=12, batch=(1, 3), prompt=(4, 48), new_tokens=3, headroom=64 * MIB,
                     probe="prompt_len", probe_batch=2, probe_start=16, probe_limit=128, probe_step=16, probe_max=4),
    },
    "graphs": {
        # 35 batch sizes as vLLM captures them (1, 2, 4, then every 8 to 256).
        "full": dict(batches=[1, 2, 4] + list(range(8, 257, 8)), ctx=1024, replays=600, headroom=2 * GIB,
                     probe="decode_batch", probe_ctx=256, probe_start=128, probe_limit=8192, probe_step=16, probe_max=8),
        "quick": dict(batches=[1, 2, 4, 8, 16, 24, 32, 48], ctx=128, replays=60, headroom=256 * MIB,
                      probe="decode_batch", probe_ctx=64, probe_start=64, probe_limit=2048, probe_step=16, probe_max=5),
        "tiny": dict(batches=[1, 2, 3, 4, 6, 8], ctx=32, replays=24, headroom=64 * MIB,
                     probe="decode_batch", probe_ctx=16, probe_start=4, probe_limit=32, probe_step=4, probe_max=3),
    },
    "training": {
        "full": dict(steps=200, batch=4, seq=(64, 2048), headroom=8 * GIB, lr=1e-4,
                     probe="seq_len", probe_batch=4, probe_start=512, probe_limit=32768, probe_step=32, probe_max=10),
        "quick": dict(steps=20, batch=2, seq=(16, 256), headroom=512 * MIB, lr=1e-4,
                      probe="seq_len", probe_batch=2, probe_start=128, probe_limit=8192, probe_step=32, probe_max=6),
        "tiny": dict(steps=12, batch=2, seq=(4, 48), headroom=64 * MIB, lr=1e-4,
                     probe="seq_len", probe_batch=2, probe_start=16, probe_limit=128, probe_step=16, probe_max=4),
    },
}

# Seconds a child may run (each (workload, allocator, round) is one process),
# from estimates on an H100 with some margin: a child past it is killed and
# recorded as failed; the others go on.
TIMEOUTS = {
    "full": {"serving": 240, "graphs": 180, "training": 240},
    "quick": {"serving": 90, "graphs": 90, "training": 90},
    "tiny": {"serving": 300, "graphs": 300, "training": 300},
}

# Targets (issue 39), against the same run on the same GPU.
TIME_TOLERANCE = 0.02  # median time per step at most 2% over the default allocator's
# "No growth": the driver memory's growth over the run at most the live bytes'
# growth (when positive) plus this much (one 2 MiB mapping granule).
GROWTH_SLACK = 2 * MIB
SEED = 39


def variants(workload, allocators):
    """The allocator variants a workload runs for the allocators asked: the
    retention variant follows "flare" in the graphs workload."""
    out = []
    for a in allocators:
        out.append(a)
        if workload == "graphs" and a == "flare":
            out.append(RETENTION)
    return out


def base_allocator(variant):
    """The allocator a variant's process installs."""
    return BASE.get(variant, variant)


def parse_list(text, known, what):
    """A comma-separated list of names, each one of ``known`` (order kept,
    duplicates dropped). Raises ValueError naming the unknown ones and the known
    ones."""
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    if not names:
        raise ValueError(f"no {what} given: choose from {', '.join(known)}")
    bad = [n for n in names if n not in known]
    if bad:
        raise ValueError(f"unknown {what} {', '.join(repr(b) for b in bad)}: choose from {', '.join(known)}")
    out = []
    for n in names:
        if n not in out:
            out.append(n)
    return out
