//! The C ABI's types: the enums (status, backend, reuse policy, cross-stream reuse,
//! driver call), the stream handle, the versioned structs (configuration, snapshot,
//! destroy report) with their layouts, and the `struct_size` prefix rule every
//! versioned struct follows.
//!
//! The enums and structs are generated ([`super::generate`]) from lists written once:
//! the status and backend values here, the reuse policies, cross-stream reuse modes,
//! driver calls and snapshot counters with the Rust types they mirror.
//!
//! One file per C type: `status` (`FlareStatus`), `pool_config` (`FlarePoolConfig`
//! and the enums of its fields), `snapshot` (`FlareSnapshot`), `tags` (`FlareSleepMode`,
//! `FlareTagCensus`), `destroy_report` (`FlareDestroyReport`), `driver_call`
//! (`FlareDriverCall`); `versioned` holds the `struct_size` prefix rule; the stream
//! handle and the layout checks are here.

use std::ffi::c_void;
use std::mem::size_of;

mod destroy_report;
mod driver_call;
mod pool_config;
mod snapshot;
mod status;
mod tags;
mod versioned;

pub use destroy_report::FlareDestroyReport;
pub use driver_call::{FlareDriverCall, RawDriverCall};
pub use pool_config::{
    FlareBackend, FlareCrossStreamReuse, FlarePoolConfig, FlareReusePolicy, FLARE_THREAD_CACHE_OFF,
};
pub use snapshot::FlareSnapshot;
pub use status::{FlareStatus, RawStatus};
pub use tags::{FlareSleepMode, FlareTagCensus, RawSleepMode};
pub(crate) use versioned::{struct_prefix, VersionedOut};

/// A CUDA stream as C passes it: a `CUstream` (or a runtime `cudaStream_t`, the same
/// handle), never dereferenced by the library. NULL is the legacy default stream of
/// the current context (as `CU_STREAM_LEGACY`, 1, is too); `CU_STREAM_PER_THREAD` (2)
/// and created streams are passed through unchanged. On the simulated backend, a
/// handle from `flare_sim_stream_create`, or NULL.
pub type FlareStream = *mut c_void;
// The layouts the C tests assert too (`sizeof` 112, 472, 40 and 72 on 64-bit targets).
const _: () = assert!(size_of::<FlareStatus>() == 4 && size_of::<FlareBackend>() == 4);
const _: () = assert!(size_of::<FlareReusePolicy>() == 4 && size_of::<FlareDriverCall>() == 4);
const _: () = assert!(size_of::<FlareCrossStreamReuse>() == 4);
const _: () = assert!(size_of::<FlareSnapshot>() == 8 + 58 * 8);
const _: () = assert!(size_of::<FlarePoolConfig>() == 112);
const _: () = assert!(size_of::<FlareDestroyReport>() == 8 + 4 * 8);
const _: () = assert!(size_of::<FlareTagCensus>() == 8 + 8 * 8);
const _: () = assert!(size_of::<FlareSleepMode>() == 4);

#[cfg(test)]
mod tests;
