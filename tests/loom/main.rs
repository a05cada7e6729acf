//! Loom models of the pool's concurrency (run only under `--cfg flare_loom`).
//!
//! Run (release: loom is slow in debug):
//!
//! ```text
//! RUSTFLAGS="--cfg flare_loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test --release --test loom -- --nocapture --test-threads=1
//! ```
#![cfg(flare_loom)]

mod books;
mod segments;
mod tag_state;
mod thread_caches;
