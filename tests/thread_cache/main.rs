//! Thread caches on the simulated driver.
#![cfg(not(flare_loom))] // the loom build runs tests/loom/ alone

#[path = "../common/mod.rs"]
mod common;

mod cache_handed_pointers;
mod caching;
mod concurrent_snapshots;
mod dropped_pool_heap;
mod exited_threads;
mod picks_and_bounds;
mod registry;
mod release_points;
mod remote_frees;
mod scopes_racing;
mod segment_blocks;
