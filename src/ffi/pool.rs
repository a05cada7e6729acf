//! A pool's life through the C ABI: the handle ([`FlarePool`]), its configuration
//! (`flare_pool_config_init`, read by `flare_pool_create`), and its end
//! (`flare_pool_destroy`, `flare_pool_destroy_report`).

use std::marker::PhantomData;
use std::mem::{size_of, MaybeUninit};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use super::boundary::{
    append_last_error, boundary, boundary_value, null_error, out_arg, set_last_error,
};
use super::types::{
    struct_prefix, FlareBackend, FlareCrossStreamReuse, FlareDestroyReport, FlarePoolConfig,
    FlareReusePolicy, FlareStatus, VersionedOut, FLARE_THREAD_CACHE_OFF,
};
use crate::driver::sim::SimConfig;
use crate::pool::{
    Backend, CrossStreamReuse, Pool, PoolConfig, ReusePolicy, DEFAULT_BEST_FIT_MAX_WASTE_PERCENT,
    DEFAULT_SEGMENT_WHOLE_THRESHOLD_BYTES, DEFAULT_THREAD_CACHE_BYTES,
    DEFAULT_THREAD_CACHE_ENTRIES,
};
use crate::{fmt_bytes, Error};

/// A pool of CUDA virtual-memory mappings on one device. Opaque: created by
/// `flare_pool_create`, released by `flare_pool_destroy`.
///
/// Threading: every function may be called on the same pool from any number of
/// threads at once, except `flare_pool_destroy`, which must be the last call on the
/// pool and must not run concurrently with any other call on it.
pub struct FlarePool {
    pub(crate) pool: Pool,
    /// Set (to the function and the panic's text) when a panic was caught in a call
    /// on this pool: the books may be half-updated, so every later call but destroy
    /// is refused with `FLARE_STATUS_INTERNAL`.
    pub(crate) poisoned: OnceLock<String>,
    /// `flare_sim_inject_panic`: the next call on this pool panics once its pool
    /// operation is done, before it writes its outputs.
    pub(crate) panic_next: AtomicBool,
    /// The device ordinal the pool allocates on (`FlarePoolConfig::device`), where
    /// `flare_sim_stream_create` makes its streams.
    pub(crate) device: i32,
}

impl FlarePool {
    /// The C handle of `pool`, which allocates on `device` (not yet poisoned, no panic
    /// asked for).
    pub(crate) fn new(pool: Pool, device: i32) -> Self {
        FlarePool {
            pool,
            poisoned: OnceLock::new(),
            panic_next: AtomicBool::new(false),
            device,
        }
    }

    /// The panic `flare_sim_inject_panic` asked for, if it did. Called by every
    /// function on a pool right after its pool operation, before its outputs.
    pub(crate) fn injected_panic_point(&self) {
        // The load first: the common case reads the flag without writing it.
        if self.panic_next.load(Ordering::Relaxed) && self.panic_next.swap(false, Ordering::Relaxed)
        {
            panic!("injected by flare_sim_inject_panic");
        }
    }
}

/// The most peer devices a configuration may name.
const MAX_PEER_DEVICES: u32 = 1024;

/// `n`, or `default` when `n` is 0 (the configuration's "0: the default").
fn or_default<T: PartialEq + Default>(n: T, default: T) -> T {
    if n == T::default() {
        default
    } else {
        n
    }
}

/// The Rust `thread_cache_entries` of the C field's value `raw`: 0 is the default
/// ([`DEFAULT_THREAD_CACHE_ENTRIES`]), as in every field of the configuration, so the
/// C ABI turns thread caches off with [`FLARE_THREAD_CACHE_OFF`] (the Rust API's 0);
/// any other value is the number of entries.
fn thread_cache_entries(raw: u32) -> u32 {
    match raw {
        0 => DEFAULT_THREAD_CACHE_ENTRIES,
        FLARE_THREAD_CACHE_OFF => 0,
        n => n,
    }
}

/// A caller's configuration as `flare_pool_create` received it, non-NULL: read with
/// [`ConfigArg::copy`].
pub(crate) struct ConfigArg<'a> {
    ptr: NonNull<FlarePoolConfig>,
    _caller: PhantomData<&'a FlarePoolConfig>,
}

impl<'a> ConfigArg<'a> {
    /// The caller's configuration; `None` when `config` is NULL.
    ///
    /// # Safety
    /// `config` is NULL or, when aligned, points to a `FlarePoolConfig` whose first
    /// field (`struct_size`) is readable and which has at least `struct_size` readable
    /// bytes (when `struct_size` is valid); within them, `peer_devices` points to
    /// `peer_device_count` readable values (when non-NULL and aligned) and
    /// `record_path` is NULL or a NUL-terminated string; none of it is written during
    /// `'a`.
    pub(crate) unsafe fn new(config: *const FlarePoolConfig) -> Option<Self> {
        Some(ConfigArg {
            ptr: NonNull::new(config.cast_mut())?,
            _caller: PhantomData,
        })
    }

    /// Copies the fields inside the caller's `struct_size` over the defaults of the
    /// layout; refuses a misaligned pointer or a bad `struct_size`.
    fn copy(&self) -> Result<CallerConfig<'a>, Error> {
        let config = self.ptr.as_ptr();
        if !config.is_aligned() {
            return Err(Error::InvalidArgument("config is misaligned".into()));
        }
        // SAFETY: `config` is non-NULL and aligned, and every caller's struct has at
        // least its first field (the header's struct starts with it), by `new`'s
        // contract.
        let struct_size = unsafe { ptr::addr_of!((*config).struct_size).read() };
        let prefix =
            struct_prefix::<FlarePoolConfig>("config", struct_size, &FlarePoolConfig::FIELD_ENDS)?;
        let mut c = FlarePoolConfig::default_for_layout();
        // SAFETY: the caller's struct has `struct_size >= prefix` readable bytes
        // (`new`'s contract); `c` is a local of the same layout with
        // `size_of::<FlarePoolConfig>() >= prefix` bytes; every field is an integer or
        // a raw pointer, so any bytes are a valid value, and the prefix ends on a field
        // boundary, so no field is half copied.
        unsafe {
            ptr::copy_nonoverlapping(
                config.cast::<u8>(),
                ptr::addr_of_mut!(c).cast::<u8>(),
                prefix,
            )
        };
        Ok(CallerConfig {
            c,
            _caller: PhantomData,
        })
    }
}

/// A copy of a caller's configuration ([`ConfigArg::copy`]): its pointers are the
/// caller's, valid as `ConfigArg::new` says.
struct CallerConfig<'a> {
    c: FlarePoolConfig,
    _caller: PhantomData<&'a FlarePoolConfig>,
}

impl CallerConfig<'_> {
    /// The peer devices the configuration names (at most [`MAX_PEER_DEVICES`]).
    fn peer_devices(&self) -> Result<Vec<i32>, Error> {
        let c = &self.c;
        if c.peer_device_count > MAX_PEER_DEVICES {
            return Err(Error::InvalidArgument(format!(
                "peer_device_count {} is above {MAX_PEER_DEVICES}",
                c.peer_device_count
            )));
        }
        if c.peer_device_count == 0 {
            Ok(Vec::new())
        } else if c.peer_devices.is_null() {
            Err(null_error("peer_devices (with peer_device_count > 0)"))
        } else if !c.peer_devices.is_aligned() {
            Err(Error::InvalidArgument("peer_devices is misaligned".into()))
        } else {
            // SAFETY: non-NULL and aligned; the caller guarantees `peer_device_count`
            // readable `int32_t` values that are not written during this call
            // (`ConfigArg::new`).
            Ok(
                unsafe { std::slice::from_raw_parts(c.peer_devices, c.peer_device_count as usize) }
                    .to_vec(),
            )
        }
    }

    /// The recording path: NULL is none (an empty one is refused by `Pool::new`).
    fn record_path(&self) -> Result<Option<std::path::PathBuf>, Error> {
        let p = self.c.record_path;
        if p.is_null() {
            return Ok(None);
        }
        // SAFETY: non-NULL; the caller guarantees a NUL-terminated string that is not
        // written during this call (`ConfigArg::new`, `FlarePoolConfig::record_path`).
        let bytes = unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes();
        record_path(bytes)
    }
}

/// Reads a caller's configuration (only the fields inside its `struct_size`) and
/// converts it.
pub(crate) fn read_config(config: &ConfigArg<'_>) -> Result<PoolConfig, Error> {
    let caller = config.copy()?;
    let c = &caller.c;
    let reuse_policy = ReusePolicy::from(FlareReusePolicy::parse(c.reuse_policy, "reuse_policy")?);
    let cross_stream_reuse = CrossStreamReuse::from(FlareCrossStreamReuse::parse(
        c.cross_stream_reuse,
        "cross_stream_reuse",
    )?);
    let peer_devices = caller.peer_devices()?;
    let backend = match FlareBackend::parse(c.backend, "backend")? {
        FlareBackend::FLARE_BACKEND_CUDA => Backend::Cuda,
        FlareBackend::FLARE_BACKEND_SIMULATED => {
            let defaults = SimConfig::default();
            Backend::Simulated(SimConfig {
                capacity_bytes: or_default(c.sim_capacity_bytes, defaults.capacity_bytes),
                granularity_bytes: or_default(c.sim_granularity_bytes, defaults.granularity_bytes),
                device_count: or_default(c.sim_device_count, defaults.device_count),
            })
        }
    };
    Ok(PoolConfig {
        backend,
        device: c.device,
        reuse_policy,
        release_threshold_bytes: c.release_threshold_bytes,
        peer_devices,
        best_fit_max_waste_percent: or_default(
            c.best_fit_max_waste_percent,
            DEFAULT_BEST_FIT_MAX_WASTE_PERCENT,
        ),
        cross_stream_reuse,
        segment_whole_threshold_bytes: or_default(
            c.segment_whole_threshold_bytes,
            DEFAULT_SEGMENT_WHOLE_THRESHOLD_BYTES,
        ),
        thread_cache_entries: thread_cache_entries(c.thread_cache_entries),
        thread_cache_bytes: or_default(c.thread_cache_bytes, DEFAULT_THREAD_CACHE_BYTES),
        record_path: caller.record_path()?,
        history_events: usize::try_from(c.history_events).unwrap_or(usize::MAX),
    })
}

/// The recording path of a C configuration, its bytes up to the NUL (an empty one
/// is kept as such: `Pool::new` refuses it, for Rust and C alike).
fn record_path(bytes: &[u8]) -> Result<Option<std::path::PathBuf>, Error> {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        Ok(Some(std::ffi::OsStr::from_bytes(bytes).into()))
    }
    #[cfg(not(unix))]
    {
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(Some(s.into())),
            Err(_) => Err(Error::InvalidArgument("record_path is not UTF-8".into())),
        }
    }
}

/// Fills the caller's configuration with the defaults. Call it as
/// `flare_pool_config_init(&cfg, sizeof cfg)`: `config_size` is the size of the
/// caller's struct. Defaults: `struct_size = min(config_size,
/// sizeof(FlarePoolConfig))`, `FLARE_BACKEND_SIMULATED` (set `FLARE_BACKEND_CUDA` for
/// real memory), device 0, `FLARE_REUSE_BEST_FIT`, release threshold 0, no peers,
/// simulated capacity, granularity and device count 0 (their defaults: 140 GiB,
/// 2 MiB, 1 device), best-fit waste bound 30%, `FLARE_CROSS_STREAM_WHEN_COMPLETE`,
/// segment whole-mapping threshold 0 (its default: no request takes a whole mapping
/// in `FLARE_REUSE_SEGMENTS`), thread caches of 32 entries and 1 GiB per thread.
///
/// Writes at most `config_size` bytes: only the fields lying wholly inside the first
/// `config_size` bytes (and inside this library's struct) are written, so an older
/// caller's smaller struct is never overrun, and the bytes of a newer caller's larger
/// struct past this library's struct are left as they are (a create by this library
/// does not read them). Padding between the written fields is zeroed, and so is the
/// tail padding when `config_size` covers the whole struct. NULL, a misaligned pointer
/// or a `config_size` below 4: nothing is written. Thread-safe.
///
/// # Safety
/// `config` is NULL or points to at least `config_size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn flare_pool_config_init(config: *mut FlarePoolConfig, config_size: usize) {
    let config = NonNull::new(config).map(|config| {
        // SAFETY: non-NULL; `config_size` writable bytes (so at most `isize::MAX`),
        // not accessed otherwise during the call, by the caller's contract.
        unsafe {
            std::slice::from_raw_parts_mut(config.as_ptr().cast::<MaybeUninit<u8>>(), config_size)
        }
    });
    flare_pool_config_init_inner(config);
}

/// `flare_pool_config_init` on the caller's bytes (`None`: NULL); a start misaligned
/// for a `FlarePoolConfig` is left alone.
fn flare_pool_config_init_inner(config: Option<&mut [MaybeUninit<u8>]>) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let Some(config) = config else {
            return;
        };
        if !config.as_ptr().cast::<FlarePoolConfig>().is_aligned() {
            return;
        }
        let size = config.len().min(size_of::<FlarePoolConfig>());
        // The whole struct, tail padding included, when the caller's covers it; else
        // the fields lying wholly inside its size.
        let Some(prefix) = FlarePoolConfig::FIELD_ENDS
            .into_iter()
            .chain([size_of::<FlarePoolConfig>()])
            .filter(|&end| end <= size)
            .max()
        else {
            return;
        };
        let mut defaults = std::mem::MaybeUninit::<FlarePoolConfig>::zeroed();
        // SAFETY: all-zero bytes are a valid `FlarePoolConfig` (integers and a NULL
        // pointer).
        let d = unsafe { defaults.assume_init_mut() };
        // Field by field, so that the padding stays zero.
        let FlarePoolConfig {
            backend,
            device,
            reuse_policy,
            release_threshold_bytes,
            peer_devices,
            peer_device_count,
            sim_capacity_bytes,
            sim_granularity_bytes,
            sim_device_count,
            best_fit_max_waste_percent,
            cross_stream_reuse,
            segment_whole_threshold_bytes,
            thread_cache_entries,
            thread_cache_bytes,
            record_path,
            history_events,
            struct_size: _,
        } = FlarePoolConfig::default_for_layout();
        d.struct_size = size as u32; // at most size_of::<FlarePoolConfig>()
        d.backend = backend;
        d.device = device;
        d.reuse_policy = reuse_policy;
        d.release_threshold_bytes = release_threshold_bytes;
        d.peer_devices = peer_devices;
        d.peer_device_count = peer_device_count;
        d.sim_capacity_bytes = sim_capacity_bytes;
        d.sim_granularity_bytes = sim_granularity_bytes;
        d.sim_device_count = sim_device_count;
        d.best_fit_max_waste_percent = best_fit_max_waste_percent;
        d.cross_stream_reuse = cross_stream_reuse;
        d.segment_whole_threshold_bytes = segment_whole_threshold_bytes;
        d.thread_cache_entries = thread_cache_entries;
        d.thread_cache_bytes = thread_cache_bytes;
        d.record_path = record_path;
        d.history_events = history_events;
        // SAFETY: `defaults` has `size_of::<FlarePoolConfig>() >= prefix` bytes, all
        // initialised (zeroed, then whole fields written), and is a separate local.
        let bytes = unsafe {
            std::slice::from_raw_parts(defaults.as_ptr().cast::<MaybeUninit<u8>>(), prefix)
        };
        // `prefix <= size <= config.len()`.
        config[..prefix].copy_from_slice(bytes);
    }));
}

/// Creates a pool from `*config` and writes it to `*out_pool`.
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a NULL argument, a bad `struct_size`,
/// an unknown backend, reuse policy or cross-stream reuse mode, a negative device or
/// peer ordinal, NULL
/// `peer_devices` with a non-zero count; `FLARE_STATUS_NO_DRIVER` when the CUDA
/// backend is asked for and libcuda cannot be loaded or initialised;
/// `FLARE_STATUS_DRIVER_ERROR` when the granularity query fails.
///
/// Ownership: the caller owns the pool and releases it with `flare_pool_destroy`.
/// `config` and `peer_devices` are only read during the call. Thread-safe.
///
/// # Safety
/// `config` is NULL or points to a `FlarePoolConfig` of at least `struct_size`
/// readable bytes; `out_pool` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn flare_pool_create(
    config: *const FlarePoolConfig,
    out_pool: *mut *mut FlarePool,
) -> FlareStatus {
    flare_pool_create_inner(
        // SAFETY: `config` is NULL or a caller's configuration of at least
        // `struct_size` readable bytes, its pointers valid, by the caller's contract
        // (`ConfigArg::new`'s).
        unsafe { ConfigArg::new(config) },
        // SAFETY: `out_pool` is NULL or writable, by the caller's contract.
        unsafe { out_arg(out_pool, "out_pool") },
    )
}

/// `flare_pool_create` on the caller's configuration (`None`: NULL) and output.
fn flare_pool_create_inner(
    config: Option<ConfigArg<'_>>,
    out_pool: Result<&mut MaybeUninit<*mut FlarePool>, Error>,
) -> FlareStatus {
    boundary("flare_pool_create", || {
        let config = config.ok_or_else(|| null_error("config"))?;
        let out_pool = out_pool?;
        let config = read_config(&config)?;
        let device = config.device;
        let pool = Box::new(FlarePool::new(Pool::new(config)?, device));
        out_pool.write(Box::into_raw(pool));
        Ok(())
    })
}

/// Releases everything the pool holds, live allocations included (one synchronize,
/// then unmap, release and free each mapping, refused steps retried once), and frees
/// the pool. `pool` is invalid afterwards, whatever the status.
///
/// Live allocations are a leak on the caller's side (or a deliberate teardown): when
/// there were any, the thread's last error message says how many and how many bytes
/// were released (`"flare_pool_destroy: released 2 live allocation(s): 3145729 bytes
/// requested, 6291456 bytes (6.0 MiB) mapped"`), even on success (the only success
/// that sets the message). `flare_pool_destroy_report` gives the same figures as
/// numbers.
///
/// A poisoned pool (a panic was caught in an earlier call on it) is destroyed all the
/// same: what its books name is released.
///
/// NULL: `FLARE_STATUS_SUCCESS`, nothing happens.
///
/// Errors: `FLARE_STATUS_DRIVER_ERROR` with the first step the driver still refused
/// after the retry (that memory is left to the driver; the pool is freed all the
/// same).
///
/// Threading: must not run concurrently with any other call on this pool.
///
/// # Safety
/// `pool` is NULL or was returned by `flare_pool_create` and not yet destroyed.
#[no_mangle]
pub unsafe extern "C" fn flare_pool_destroy(pool: *mut FlarePool) -> FlareStatus {
    // SAFETY: `pool` is NULL or a live pool no other call uses, by the caller's
    // contract.
    flare_pool_destroy_inner(unsafe { OwnedPool::new(pool) })
}

/// `flare_pool_destroy` of the caller's pool (`None`: NULL).
fn flare_pool_destroy_inner(pool: Option<OwnedPool>) -> FlareStatus {
    destroy("flare_pool_destroy", pool, |_| {})
}

/// `flare_pool_destroy`, and writes what it released to `*out_report`: the live
/// allocations (count, requested and mapped bytes), whether a scope was open, and the
/// physical bytes the pool held. The caller sets `out_report->struct_size` first
/// (`sizeof(FlareDestroyReport)`).
///
/// The report is written whenever the pool was destroyed: on `FLARE_STATUS_SUCCESS`
/// and on `FLARE_STATUS_DRIVER_ERROR` (the pool is freed then too). `pool` NULL:
/// `FLARE_STATUS_SUCCESS` and an all-zero report (nothing released).
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a NULL or misaligned `out_report` or a
/// bad `struct_size`: nothing is written, and the pool is NOT destroyed (it stays
/// usable); `FLARE_STATUS_DRIVER_ERROR` as for `flare_pool_destroy`.
///
/// Threading: must not run concurrently with any other call on this pool.
///
/// # Safety
/// `pool` is NULL or was returned by `flare_pool_create` and not yet destroyed;
/// `out_report` is NULL or points to at least `out_report->struct_size` writable
/// bytes.
#[no_mangle]
pub unsafe extern "C" fn flare_pool_destroy_report(
    pool: *mut FlarePool,
    out_report: *mut FlareDestroyReport,
) -> FlareStatus {
    flare_pool_destroy_report_inner(
        // SAFETY: `pool` is NULL or a live pool no other call uses, by the caller's
        // contract.
        unsafe { OwnedPool::new(pool) },
        // SAFETY: `out_report` is NULL or a caller's report of at least
        // `struct_size` writable bytes, by the caller's contract.
        unsafe { VersionedOut::new(out_report) },
    )
}

/// `flare_pool_destroy_report` of the caller's pool (`None`: NULL) into the caller's
/// report; a bad report leaves the pool as it is.
fn flare_pool_destroy_report_inner(
    pool: Option<OwnedPool>,
    out_report: VersionedOut<'_, FlareDestroyReport>,
) -> FlareStatus {
    const NAME: &str = "flare_pool_destroy_report";
    let out_report = match boundary_value(NAME, || out_report.check("out_report", "report")) {
        Ok(out_report) => out_report,
        // Dropping `pool` (an `OwnedPool`) leaves the pool alive and usable.
        Err(status) => return status,
    };
    let Some(pool) = pool else {
        out_report.write(&FlareDestroyReport::default());
        return FlareStatus::FLARE_STATUS_SUCCESS;
    };
    destroy(NAME, Some(pool), |report| out_report.write(report))
}

/// A caller's pool handed to a destroy: owned by the call, freed only by
/// [`OwnedPool::into_pool`] (dropping an `OwnedPool` leaves the pool alive).
pub(crate) struct OwnedPool(NonNull<FlarePool>);

impl OwnedPool {
    /// The caller's pool; `None` when `pool` is NULL.
    ///
    /// # Safety
    /// `pool` is NULL or was returned by `flare_pool_create` and not yet destroyed,
    /// and no other call on it runs while the `OwnedPool` lives.
    pub(crate) unsafe fn new(pool: *mut FlarePool) -> Option<Self> {
        NonNull::new(pool).map(OwnedPool)
    }

    /// Frees the handle and returns what it held.
    fn into_pool(self) -> FlarePool {
        // SAFETY: by `new`'s contract, the `Box<FlarePool>` that `flare_pool_create`
        // leaked, not yet destroyed and not in use elsewhere; `self` is consumed, so
        // it is taken back once.
        *unsafe { Box::from_raw(self.0.as_ptr()) }
    }
}

/// Destroys `pool` (`None`, NULL, is a no-op success); `report` receives what was
/// released whenever the pool was freed.
fn destroy(
    name: &'static str,
    pool: Option<OwnedPool>,
    report: impl FnOnce(&FlareDestroyReport),
) -> FlareStatus {
    let Some(pool) = pool else {
        return FlareStatus::FLARE_STATUS_SUCCESS;
    };
    let FlarePool { pool, .. } = pool.into_pool();
    // The counters before the release (no other call runs now): what is released.
    // A poisoned pool is destroyed all the same, from its books as they are.
    let released = FlareDestroyReport::before_destroy(&pool.snapshot());
    let leaked = (released.live_count > 0).then(|| {
        format!(
            "released {} live allocation(s): {} bytes requested, {} bytes ({}) mapped",
            released.live_count,
            released.live_requested_bytes,
            released.live_mapped_bytes,
            fmt_bytes(released.live_mapped_bytes)
        )
    });
    let status = boundary(name, || pool.destroy());
    if status == FlareStatus::FLARE_STATUS_SUCCESS
        || status == FlareStatus::FLARE_STATUS_DRIVER_ERROR
    {
        report(&released);
    }
    if let Some(leaked) = leaked {
        if status == FlareStatus::FLARE_STATUS_SUCCESS {
            set_last_error(format!("{name}: {leaked}"));
        } else {
            // Keep the failure's message first, then what was live.
            append_last_error(&leaked);
        }
    }
    status
}
