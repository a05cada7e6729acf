//! Thread caches on the simulated driver.
#![cfg(not(flare_loom))] // the loom build runs tests/loom/ alone

#[path = "../common/mod.rs"]
mod common;

mod cache_handed_pointers;
mod caching;
mod concurrent_snapshots;
mod exited_threads;
mod release_points;
mod remote_frees;
mod segment_blocks;
