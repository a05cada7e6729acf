//! flare-package's tools: what the command-line programs and benchmarks share.
//!
//! - [`cuda_baseline`]: the allocators an engine would use instead of flare-package
//!   (the stream-ordered pool, `cuMemAlloc`) and the raw driver sequence of a fresh
//!   mapping, which `flare-bench-gpu` and the criterion benchmarks compare against.
//! - [`plot`]: memory over a trace's events (`flare-replay --plot`), as SVG or PNG.
//! - [`pickle`]: a reader of Python pickles of plain data (no code is run).
//! - [`torch_snapshot`]: importing PyTorch memory snapshots (the pickles of
//!   `torch.cuda.memory._dump_snapshot`) as flare-trace v1 text, which
//!   `flare-replay` replays and converts.
#![deny(missing_docs)]

pub mod cuda_baseline;
pub mod pickle;
pub mod plot;
pub mod torch_snapshot;
