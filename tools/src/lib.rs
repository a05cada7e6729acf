//! flare-package's tools: what the command-line programs and benchmarks share.
//!
//! - [`cuda_baseline`]: the allocators an engine would use instead of flare-package
//!   (the stream-ordered pool, `cuMemAlloc`) and the raw driver sequence of a fresh
//!   mapping, which `flare-bench-gpu` and the criterion benchmarks compare against.
#![deny(missing_docs)]

pub mod cuda_baseline;
