//! What of the pool names a backend, kept out of the pool core (which takes any
//! [`Driver`](crate::Driver)): [`Pool::new`], which builds the driver `config.backend`
//! names with [`open`](super::open); [`Pool::sim_driver`], the simulated driver under
//! a pool; the pool's `Debug`, which says whether it is simulated; and the
//! [`PoolConfig`] constructors that choose a backend.

use std::sync::Arc;

use crate::driver::sim::{SimConfig, SimDriver};
use crate::error::Result;
use crate::pool::{Backend, Pool, PoolConfig};

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("policy", &self.policy())
            .field("granularity", &self.granularity())
            .field("simulated", &self.sim_driver().is_some())
            .finish_non_exhaustive()
    }
}

impl Pool {
    /// Creates a pool on the backend named in `config`.
    ///
    /// Errors: [`Error::InvalidArgument`] for a negative device or peer ordinal, or
    /// an empty [`PoolConfig::record_path`]; [`Error::NoDriver`] when the CUDA
    /// backend is asked for and libcuda cannot be loaded or initialised;
    /// [`Error::Driver`] when the granularity query fails.
    ///
    /// [`Error::InvalidArgument`]: crate::Error::InvalidArgument
    /// [`Error::NoDriver`]: crate::Error::NoDriver
    /// [`Error::Driver`]: crate::Error::Driver
    pub fn new(config: PoolConfig) -> Result<Pool> {
        // The configuration is checked before any driver is touched (a negative
        // device is an invalid argument on every backend, not a missing driver).
        crate::pool::validate_config(&config)?;
        let driver = crate::backend::open(&config)?;
        Pool::with_driver(config, driver)
    }

    /// The simulated driver under this pool, when it runs on one (created with
    /// [`Backend::Simulated`], or [`Pool::with_driver`] given a [`SimDriver`]): the
    /// typed handle for fault injection, queued work and captures, and for comparing
    /// the books with what the driver holds. The pool holds the driver once; this is
    /// that same driver, seen as its concrete type.
    pub fn sim_driver(&self) -> Option<Arc<SimDriver>> {
        let any: Arc<dyn std::any::Any + Send + Sync> = self.driver().clone();
        any.downcast::<SimDriver>().ok()
    }
}

impl PoolConfig {
    /// A default configuration on the simulated driver with `sim`.
    pub fn simulated(sim: SimConfig) -> Self {
        PoolConfig {
            backend: Backend::Simulated(sim),
            ..Default::default()
        }
    }

    /// A default configuration on the real CUDA driver, device `device`.
    pub fn cuda(device: i32) -> Self {
        PoolConfig {
            backend: Backend::Cuda,
            device,
            ..Default::default()
        }
    }
}
