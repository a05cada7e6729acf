//! The segment-mode pools the segment tests run on.

use crate::common;
use common::simulated_pool;
use flare_package::{Pool, PoolConfig, ReusePolicy, SimDriver};
use std::sync::Arc;

/// A segment-mode pool on a 1 GiB simulated device with release threshold
/// `threshold` (not `u64::MAX`: thread caches stay closed outside a scope).
pub(crate) fn seg_pool(threshold: u64) -> (Pool, Arc<SimDriver>) {
    simulated_pool(
        1 << 30,
        PoolConfig {
            reuse_policy: ReusePolicy::Segments,
            release_threshold_bytes: threshold,
            ..PoolConfig::default()
        },
    )
}

/// A segment-mode pool on a simulated device of `capacity` bytes, release threshold
/// `threshold`.
pub(crate) fn seg_pool_on_device(capacity: u64, threshold: u64) -> (Pool, Arc<SimDriver>) {
    common::segment_pool(capacity, threshold)
}
