// The Rust guide (docs/rust-guide.md) is the crate's documentation, and its Rust
// blocks doctests; README.md's Rust block is a doctest too (`ReadmeDoctests`, below).
// The loom build (`--cfg flare_loom`) leaves them out: its locks work only inside a
// loom model.
#![cfg_attr(not(flare_loom), doc = include_str!("../docs/rust-guide.md"))]
#![cfg_attr(flare_loom, doc = "flare-package, built for the loom models.")]
#![deny(missing_docs)]
#![deny(clippy::unwrap_used, clippy::expect_used)]
#![deny(clippy::undocumented_unsafe_blocks)]

// The layers, each built on those below it:
// - ffi (the C ABI), torch (PyTorch's pools), trace (flare-trace v1 and its replay), viz
//   (memory_viz snapshots);
// - backend: builds the driver a configuration names, and the pool on it;
// - pool: the allocator, over any driver;
// - driver: the Driver trait, and its CUDA and simulated backends;
// - growth: the growth report's analysis (live allocations in, a report out), used
//   by the pool and the trace;
// - error, units (byte counts), lists (the enum lists' check), sync (the lock types).
pub mod backend;
pub mod driver;
mod error;
pub mod ffi;
pub mod growth;
pub mod pool;
pub mod torch;
pub mod trace;
pub mod viz;

pub(crate) mod lists;
pub(crate) mod sync;
mod units;

// README.md's code blocks, compiled and run by `cargo test --doc` only (never built
// into the library, never rendered).
#[cfg(all(doctest, not(flare_loom)))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

pub use driver::sim::{SimConfig, SimDriver};
pub use driver::{
    CaptureMode, CuResult, DevicePtr, Driver, DriverCall, DriverError, HostBuffer, Stream,
};
pub use error::{Error, Result};
pub use pool::{
    set_history_frame, Allocation, Backend, CrossStreamReuse, HistoryAction, HistoryEvent, Pool,
    PoolConfig, RetentionScope, ReusePolicy, SleepMode, Snapshot, TagCensus,
};
pub use units::fmt_bytes;
