//! Building a backend: the driver a [`Backend`] names, made outside the pool core so
//! that [`Pool`](crate::Pool) works over any [`Driver`] and never names a backend.
//! [`Pool::new`](crate::Pool::new) calls [`open`]; an engine with its own driver
//! calls [`Pool::with_driver`](crate::Pool::with_driver).
#![forbid(unsafe_code)]

mod pool;

use std::sync::Arc;

use crate::driver::cuda::CudaDriver;
use crate::driver::sim::{SimConfig, SimDriver};
use crate::driver::{Driver, DriverCall};
use crate::error::{Error, Result};
use crate::pool::{Backend, PoolConfig};

/// The driver `config.backend` names, for `config.device` with the primary contexts
/// of `config.peer_devices` retained too (so that a release can synchronize every
/// device with access).
///
/// Errors: [`Error::InvalidArgument`] for a simulated machine that is not one a real
/// engine could run on (capacity 0, a granularity that is not a power of two, a
/// device or peer that is not among its devices); [`Error::NoDriver`] when the CUDA
/// backend is asked for and libcuda cannot be loaded or initialised, or the device
/// or a peer does not exist; [`Error::Driver`] when the granularity query fails.
pub fn open(config: &PoolConfig) -> Result<Arc<dyn Driver>> {
    match config.backend {
        Backend::Cuda => {
            if !CudaDriver::is_available() {
                return Err(Error::NoDriver(
                    "libcuda.so.1 could not be loaded: no NVIDIA driver on this machine \
                     (the simulated backend needs none)"
                        .into(),
                ));
            }
            let driver =
                CudaDriver::with_peers(config.device, &config.peer_devices).map_err(|e| {
                    if e.call == DriverCall::Init {
                        Error::NoDriver(format!(
                            "{} failed with {} ({}) for device {}",
                            e.call,
                            e.code.name(),
                            e.code.0,
                            config.device
                        ))
                    } else {
                        Error::Driver {
                            source: e,
                            bytes: 0,
                        }
                    }
                })?;
            Ok(Arc::new(driver))
        }
        Backend::Simulated(sim) => {
            validate_sim(config, &sim)?;
            Ok(Arc::new(SimDriver::new(sim)))
        }
    }
}

/// The simulated machine must be one a real engine could run on: a capacity of at
/// least one granule, a power-of-two granularity (as every CUDA granularity is), at
/// most [`SIM_MAX_DEVICES`](crate::driver::sim::SIM_MAX_DEVICES) devices, and the
/// device and every peer among them.
pub(crate) fn validate_sim(config: &PoolConfig, sim: &SimConfig) -> Result<()> {
    validate_sim_machine(sim)?;
    let count = sim.device_count;
    let missing = std::iter::once(("device", config.device))
        .chain(config.peer_devices.iter().map(|&p| ("peer device", p)))
        .find(|&(_, d)| d as u32 >= count);
    if let Some((what, d)) = missing {
        return Err(Error::InvalidArgument(format!(
            "{what} {d} does not exist: the simulated machine has {count} device(s) \
             (SimConfig::device_count)"
        )));
    }
    Ok(())
}

/// The least simulated granularity a pool accepts, bytes (one page).
pub const SIM_MIN_GRANULARITY_BYTES: u64 = 4096;

/// The machine half of [`validate_sim`] (no pool yet: the PyTorch entry points check
/// their simulated machine when it is configured, before any pool exists): a
/// capacity of at least one granule, a power-of-two granularity of at least
/// [`SIM_MIN_GRANULARITY_BYTES`], at least one and at
/// most [`SIM_MAX_DEVICES`](crate::driver::sim::SIM_MAX_DEVICES) devices.
///
/// Errors: [`Error::InvalidArgument`] naming the value and the rule it breaks.
pub(crate) fn validate_sim_machine(sim: &SimConfig) -> Result<()> {
    if sim.device_count == 0 {
        return Err(Error::InvalidArgument(
            "the simulated machine has 0 devices".into(),
        ));
    }
    if sim.capacity_bytes == 0 {
        return Err(Error::InvalidArgument(
            "the simulated device's capacity is 0 bytes".into(),
        ));
    }
    if sim.granularity_bytes != 0 && !sim.granularity_bytes.is_power_of_two() {
        return Err(Error::InvalidArgument(format!(
            "the simulated granularity {} bytes is not a power of two",
            sim.granularity_bytes
        )));
    }
    // A device smaller than one granule could never hold a mapping.
    let granularity = match sim.granularity_bytes {
        0 => SimConfig::default().granularity_bytes,
        g => g,
    };
    // Below a page, mappings would share the 512-byte units segments and the thread
    // caches' pointer table count in (real devices: 2 MiB on an H200, 64 KiB at the
    // least): a review saw a live pointer refused as unknown at a granularity of 1.
    if granularity < SIM_MIN_GRANULARITY_BYTES {
        return Err(Error::InvalidArgument(format!(
            "the simulated granularity {granularity} bytes is below the least, \
             {SIM_MIN_GRANULARITY_BYTES} bytes"
        )));
    }
    if sim.capacity_bytes < granularity {
        return Err(Error::InvalidArgument(format!(
            "the simulated device's capacity, {} bytes, is less than one granule ({} \
             bytes): it could never hold a mapping",
            sim.capacity_bytes, granularity
        )));
    }
    let max = crate::driver::sim::SIM_MAX_DEVICES;
    if sim.device_count > max {
        return Err(Error::InvalidArgument(format!(
            "the simulated machine has {} devices: at most {max} can be simulated \
             (SIM_MAX_DEVICES)",
            sim.device_count
        )));
    }
    Ok(())
}
