//! Which driver a pool runs on: the choice a configuration carries
//! ([`PoolConfig::backend`](crate::PoolConfig::backend)), made here below the pool so
//! that the pool names no backend; `crate::backend` builds the driver it names.

use super::sim::SimConfig;

/// Which driver a pool runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The real CUDA driver (libcuda, loaded at run time).
    Cuda,
    /// The simulated driver with these settings.
    Simulated(SimConfig),
}

impl Default for Backend {
    /// The simulated driver with its default settings ([`SimConfig::default`]): a
    /// configuration runs anywhere unless it asks for the CUDA driver.
    fn default() -> Backend {
        Backend::Simulated(SimConfig::default())
    }
}
