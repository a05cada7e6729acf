// The Rust guide (docs/rust-guide.md) is the crate's documentation, and its Rust
// blocks doctests; README.md's Rust block is a doctest too (`ReadmeDoctests`, below).
// The loom build (`--cfg flare_loom`) leaves them out: its locks work only inside a
// loom model.
#![cfg_attr(not(flare_loom), doc = include_str!("../docs/rust-guide.md"))]
#![cfg_attr(flare_loom, doc = "flare-package, built for the loom models.")]
#![deny(missing_docs)]
#![deny(clippy::unwrap_used, clippy::expect_used)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod backend;
pub mod driver;
mod error;
pub mod ffi;
pub mod pool;
pub mod torch;
pub mod trace;

pub(crate) mod sync;

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
    Allocation, Backend, CrossStreamReuse, Pool, PoolConfig, RetentionScope, ReusePolicy,
    SleepMode, Snapshot, TagCensus,
};

/// Formats a byte count the way error messages and reports print it: `"1.0 GiB"`,
/// `"2.0 MiB"`, `"512 B"` (binary units, one decimal).
pub fn fmt_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

/// Whether `numbers` is `0, 1, 2, ...`: the rows of an enum's list (issue 10, "one
/// list, many uses") must be numbered in order from 0, because their `ALL` arrays are
/// indexed by number. Checked when the crate is built (`const _: () = assert!(..)`).
pub(crate) const fn numbered_from_zero(numbers: &[usize]) -> bool {
    let mut i = 0;
    while i < numbers.len() {
        if numbers[i] != i {
            return false;
        }
        i += 1;
    }
    true
}
