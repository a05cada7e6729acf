//! The planted leak of issue 38: a server loop whose calls each keep per-shape
//! scratch for their new length, never freed. It makes
//! `tests/data/planted/per-shape-leak.tensor.trace` (the committed trace is this
//! generator's output, checked by `tests/trace/growth.rs`; `FLARE_BLESS_TRACE=1 cargo
//! test --release --test trace growth::` writes it again) and drives a live pool
//! through the same calls (`tests/pool/growth_report.rs`).
//!
//! The workload, all untagged:
//! - before the loop (step 0, before the first `step` marker): the weights (the 11
//!   sizes of [`WEIGHTS`], 8 layers of each but the embedding) and a KV cache
//!   ([`KV_CACHE`]), kept;
//! - [`CALLS`] calls; call `i` writes a `step` marker, then with its length `L`
//!   ([`lengths`]: a new length every call) allocates and frees transients whose
//!   sizes depend on `L` (activations, MLP, attention scores), allocates the six
//!   scratch tensors `L * w` for each width `w` of [`WIDTHS`] (bytes per token),
//!   never freed, and every tenth call a 1 MiB cache entry, kept (bounded: 12
//!   entries, 12 steps).
//!
//! What a growth report must say (computed from these parameters, not from a
//! report): one group grows, tag 0's "a new size each step", at 6 allocations and
//! `sum(WIDTHS) * sum(lengths) / CALLS` bytes per step (the weights and the KV cache,
//! each size made in step 0 only, are its base, not its growth).

/// Server calls, one step each.
pub const CALLS: u64 = 120;

/// The six per-token widths of the scratch each new length keeps, bytes: hidden
/// states, two projections, the MLP's, a score row and a mask.
pub const WIDTHS: [u64; 6] = [4096, 1024, 2048, 11264, 256, 64];

/// The weights: bytes of each size, and how many of it (an embedding, then eight
/// layers of ten matrices and norms).
pub const WEIGHTS: [(u64, u64); 11] = [
    (131_072_000, 1),
    (8_388_608, 8),
    (2_097_152, 8),
    (2_097_152 + 512, 8),
    (8_388_608 + 512, 8),
    (23_068_672, 8),
    (23_068_672 + 512, 8),
    (23_068_672 + 1024, 8),
    (4096, 8),
    (4096 + 512, 8),
    (131_072_000 + 512, 1),
];

/// The KV cache, bytes.
pub const KV_CACHE: u64 = 1 << 30;

/// The bounded cache's entry, bytes, kept every tenth call.
pub const CACHE_ENTRY: u64 = 1 << 20;

/// One line of the workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `a ID BYTES`
    Alloc(u64, u64),
    /// `f ID`
    Free(u64),
    /// `step`
    Step,
}

/// The calls' lengths (tokens): pseudo-random in 1..=4096 (a fixed linear
/// congruential sequence), each new, and none whose six scratch sizes meet a size
/// already live (a weight, the KV cache, the cache entry, an earlier call's
/// scratch): every scratch size is made in one step only.
pub fn lengths() -> Vec<u64> {
    let mut taken: std::collections::HashSet<u64> = WEIGHTS.iter().map(|&(b, _)| b).collect();
    taken.insert(KV_CACHE);
    taken.insert(CACHE_ENTRY);
    let mut seen = std::collections::HashSet::new();
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut out = Vec::new();
    while (out.len() as u64) < CALLS {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let len = (x >> 33) % 4096 + 1;
        let sizes = WIDTHS.map(|w| len * w);
        if seen.contains(&len) || sizes.iter().any(|s| taken.contains(s)) {
            continue;
        }
        seen.insert(len);
        taken.extend(sizes);
        out.push(len);
    }
    out
}

/// The workload's lines, in order.
pub fn workload() -> Vec<Op> {
    let mut ops = Vec::new();
    let mut next = 0u64;
    let mut alloc = |ops: &mut Vec<Op>, bytes: u64| {
        next += 1;
        ops.push(Op::Alloc(next, bytes));
        next
    };
    for &(bytes, n) in &WEIGHTS {
        for _ in 0..n {
            alloc(&mut ops, bytes);
        }
    }
    alloc(&mut ops, KV_CACHE);
    for (i, len) in lengths().into_iter().enumerate() {
        ops.push(Op::Step);
        // Transients: hidden states in and out, the MLP's two halves, attention
        // scores (16 heads, bf16), freed before the call returns.
        let hidden = alloc(&mut ops, len * 4096);
        let up = alloc(&mut ops, len * 11264);
        let gate = alloc(&mut ops, len * 11264);
        ops.push(Op::Free(gate));
        let scores = alloc(&mut ops, len * len * 32);
        // The per-shape scratch, kept for this length and never freed.
        for w in WIDTHS {
            alloc(&mut ops, len * w);
        }
        ops.push(Op::Free(scores));
        ops.push(Op::Free(up));
        let out = alloc(&mut ops, len * 4096);
        ops.push(Op::Free(hidden));
        ops.push(Op::Free(out));
        if i % 10 == 0 {
            alloc(&mut ops, CACHE_ENTRY);
        }
    }
    ops
}

/// The workload as flare-trace v1, with the comment lines that say what it is.
pub fn trace_text() -> String {
    let mut s = String::from(
        "# flare-trace v1\n\
         # per-shape scratch leak (issue 38): a server loop of 120 calls, a `step` marker each; \
         each call's length is new, and it keeps six tensors of that length (widths 4096, \
         1024, 2048, 11264, 256, 64 bytes per token) that are never freed\n\
         # made by tests/common/per_shape_leak.rs (FLARE_BLESS_TRACE=1 cargo test --release \
         --test trace growth:: writes it); expected growth: tag 0, a new size each step, 6 \
         allocations per step\n",
    );
    for op in workload() {
        match op {
            Op::Alloc(id, bytes) => s.push_str(&format!("a {id} {bytes}\n")),
            Op::Free(id) => s.push_str(&format!("f {id}\n")),
            Op::Step => s.push_str("step\n"),
        }
    }
    s
}

/// The bytes per step the leak grows by: `sum(WIDTHS) * sum(lengths) / CALLS`.
pub fn leak_bytes_per_step() -> f64 {
    let total: u64 = lengths()
        .iter()
        .map(|l| l * WIDTHS.iter().sum::<u64>())
        .sum();
    total as f64 / CALLS as f64
}
