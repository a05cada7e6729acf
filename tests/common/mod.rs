//! Shared by the integration tests: the checks run after every operation, and the
//! scenarios that run both on the simulated driver (CI) and on the real one (GPU).
#![allow(dead_code)]

pub mod counting;
pub mod hammer;
pub mod heap;
pub mod hooked;
pub mod kernels;
pub mod own_process;
pub mod per_shape_leak;

use flare_package::driver::sim::SimState;
use flare_package::{Backend, Pool, PoolConfig, ReusePolicy, SimConfig, Snapshot};

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// The backend a scenario runs on.
#[derive(Clone, Copy, Debug)]
pub enum On {
    Sim,
    Cuda,
}

pub fn config(on: On, policy: ReusePolicy) -> PoolConfig {
    let backend = match on {
        On::Sim => Backend::Simulated(SimConfig::default()),
        On::Cuda => Backend::Cuda,
    };
    PoolConfig {
        backend,
        reuse_policy: policy,
        ..PoolConfig::default()
    }
}

pub fn pool(on: On, policy: ReusePolicy) -> Pool {
    match Pool::new(config(on, policy)) {
        Ok(p) => p,
        Err(e) => panic!("cannot create a pool on {on:?}: {e} (a GPU test needs a CUDA GPU)"),
    }
}

/// The snapshot invariants, and on the simulated driver the books against what the
/// driver holds.
#[track_caller]
pub fn check(pool: &Pool) -> Snapshot {
    let s = pool.snapshot();
    if let Err(e) = s.check_invariants() {
        panic!("snapshot invariant broken: {e}\n{s:#?}");
    }
    if let Some(sim) = pool.sim_driver() {
        let d = sim.state();
        assert_eq!(
            s.physical_bytes, d.physical_bytes,
            "physical bytes: books vs driver\n{s:#?}\n{d:#?}"
        );
        assert_eq!(
            s.reserved_bytes, d.reserved_bytes,
            "reserved bytes: books vs driver"
        );
        let mapped =
            whole_mappings(&s) - s.sleeping_count + s.segment_handles + s.segment_handles_lent;
        assert!(
            d.mappings >= mapped && d.mappings <= mapped + s.pending_count,
            "driver mappings {} vs live {} + idle {} + segment handles {} (+ pending {})",
            d.mappings,
            s.live_count,
            s.idle_count,
            s.segment_handles,
            s.pending_count
        );
        assert!(sim.faults().is_empty(), "driver faults: {:?}", sim.faults());
        check_counts(&s, &d);
    }
    s
}

/// Whole mappings the books hold, live or idle (live allocations that are not
/// blocks of segments, and idle mappings).
pub fn whole_mappings(s: &Snapshot) -> u64 {
    s.live_count - s.block_live_count + s.idle_count
}

/// The books against what the simulated driver holds, object by object: every live
/// and idle whole mapping holds one handle, one reservation and one mapping; every
/// handle mapped in a segment one handle and one mapping, every segment one
/// reservation; a pending
/// leftover holds at most one of each, and only its still-live handle counts in
/// `pending_bytes`. So handles, reservations and mappings lie between
/// `live + idle` and `live + idle + pending`, and mapped bytes between
/// `live mapped + idle` and that plus `pending_bytes` (a pending leftover that is
/// still mapped always still holds its handle).
#[track_caller]
pub fn check_counts(s: &Snapshot, d: &SimState) {
    let whole = whole_mappings(s);
    // A sleeping allocation keeps its reservation only (and a handle the driver
    // refused to release, unmapped).
    let handles = whole - s.sleeping_count + s.sleeping_held_count + s.segment_handles;
    // A sleeping block holds no reservation of its own (its segment's is counted).
    let reservations = whole - s.sleeping_block_count + s.segment_count;
    // A lent handle holds a second (retired) mapping.
    let mappings = whole - s.sleeping_count + s.segment_handles + s.segment_handles_lent;
    for (what, n, want) in [
        ("handles", d.handles, handles),
        ("reservations", d.reservations, reservations),
        ("mappings", d.mappings, mappings),
    ] {
        assert!(
            n >= want && n <= want + s.pending_count,
            "driver {what} {n} vs {want} (+ pending {})\n{s:#?}\n{d:#?}",
            s.pending_count
        );
    }
    let mapped = s.live_mapped_bytes + s.idle_bytes + s.segment_mapped_bytes + s.segment_lent_bytes;
    assert!(
        d.mapped_bytes >= mapped && d.mapped_bytes <= mapped + s.pending_bytes,
        "driver mapped bytes {} vs live mapped {} + idle {} (+ pending {})",
        d.mapped_bytes,
        s.live_mapped_bytes,
        s.idle_bytes,
        s.pending_bytes
    );
    if s.pending_count == 0 {
        assert_eq!(
            d.handles, handles,
            "handles = whole live + idle + segment handles with nothing pending"
        );
        assert_eq!(
            d.mappings, mappings,
            "mappings = whole live + idle + segment handles + lent with nothing pending"
        );
        assert_eq!(
            d.reservations, reservations,
            "reservations = whole live + idle + segments with nothing pending"
        );
    }
}

/// [`check`], plus the access grants: every live and idle mapping grants access to
/// each of `devices` devices, and a pending leftover grants none (a still-mapped
/// leftover is one whose set-access failed).
#[track_caller]
pub fn check_with_devices(pool: &Pool, devices: u64) -> Snapshot {
    let s = check(pool);
    if let Some(sim) = pool.sim_driver() {
        let d = sim.state();
        // A lent handle's retired mapping keeps its access, unless it is what a
        // failed lend could not undo (mapped, never granted access); so does a
        // pending leftover still mapped after a refused unmap (a wake's undo).
        let granted = (whole_mappings(&s) - s.sleeping_count + s.segment_handles) * devices;
        assert!(
            d.access_grants >= granted
                && d.access_grants
                    <= granted + (s.segment_handles_lent + s.pending_count) * devices,
            "access grants {} vs (live + idle + segment handles (+ lent)) x devices\n{s:#?}\n{d:#?}",
            d.access_grants
        );
    }
    s
}

/// The simulated driver holds nothing (after finish, trim or drop).
#[track_caller]
///
/// In segment mode the segments' reservations stay (kept for regrowth until
/// destroy): the driver holds exactly the snapshot's `segment_count` of them.
pub fn assert_driver_empty(pool: &Pool) {
    if let Some(sim) = pool.sim_driver() {
        let d = sim.state();
        let s = pool.snapshot();
        assert_eq!(d.physical_bytes, 0, "driver still holds {d:?}");
        assert_eq!(d.handles, 0, "driver still holds {d:?}");
        assert_eq!(d.reservations, s.segment_count, "driver still holds {d:?}");
        assert_eq!(
            d.reserved_bytes, s.reserved_bytes,
            "driver still holds {d:?}"
        );
        assert_eq!(d.mappings, 0, "driver still holds {d:?}");
        if !pool.policy().is_segments() {
            assert_eq!(d.reservations, 0, "driver still holds {d:?}");
        }
    }
}

/// The warmup scenario of the design: inside one scope, twelve forwards, each
/// allocating a 1 GiB transient, freeing it, allocating another and freeing it
/// (`both_live`: the two transients live at once). Returns the peak physical bytes.
pub fn warmup(on: On, policy: ReusePolicy, both_live: bool) -> u64 {
    let pool = pool(on, policy);
    let base = check(&pool);
    assert_eq!(base.physical_bytes, 0);
    pool.retention_begin().unwrap();
    for _ in 0..12 {
        if both_live {
            let a = pool.allocate_raw(GIB).unwrap();
            let b = pool.allocate_raw(GIB).unwrap();
            check(&pool);
            pool.free_raw(a).unwrap();
            pool.free_raw(b).unwrap();
        } else {
            let a = pool.allocate_raw(GIB).unwrap();
            pool.free_raw(a).unwrap();
            let b = pool.allocate_raw(GIB).unwrap();
            pool.free_raw(b).unwrap();
        }
        check(&pool);
    }
    let s = check(&pool);
    assert!(s.scope_open);
    pool.retention_finish().unwrap();
    let after = check(&pool);
    assert_eq!(after.physical_bytes, 0, "nothing held after finish");
    assert_eq!(after.idle_bytes, 0);
    assert_eq!(after.reserved_bytes, 0);
    assert_eq!(after.scopes_finished, 1);
    assert_driver_empty(&pool);
    after.peak_physical_bytes
}

/// Arena sizes the way per-shape caches make them: `batch * seq * hidden * 2` bytes
/// for a ladder of shapes (1x34 .. 64x172 .. 16x1117 style), 1000 distinct sizes.
pub fn shape_sizes() -> Vec<u64> {
    let mut v = Vec::new();
    let mut i = 0u64;
    while v.len() < 1000 {
        let batch = [1u64, 2, 4, 8, 16, 32, 64][(i % 7) as usize];
        let seq = 34 + 32 * (i / 7) + (i % 5);
        let bytes = batch * seq * 2048 * 2 + i; // + i: every size distinct
        if !v.contains(&bytes) {
            v.push(bytes);
        }
        i += 1;
    }
    v
}

/// 2 MiB, the granularity of an H200 (and the simulated driver's default).
pub const GRANULARITY: u64 = 2 << 20;

/// A pool with `policy` on a fresh simulated device of `capacity` bytes, and its
/// simulated driver.
pub fn sim_pool(
    policy: ReusePolicy,
    capacity: u64,
) -> (Pool, std::sync::Arc<flare_package::SimDriver>) {
    let pool = Pool::new(
        PoolConfig::simulated(SimConfig {
            capacity_bytes: capacity,
            ..SimConfig::default()
        })
        .with_policy(policy),
    )
    .expect("pool on the simulated driver");
    let sim = pool.sim_driver().expect("simulated").clone();
    (pool, sim)
}

/// The path of a shipped trace, by file name (`graph-warmup-20sizes.segment.trace`).
pub fn data(name: &str) -> std::path::PathBuf {
    // The library's tests run from the workspace root, the tools' from tools/.
    let here = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let root = if here.join("tests/data").is_dir() {
        here
    } else {
        here.join("..")
    };
    root.join("tests/data").join(name)
}

/// The four shipped traces with their figures from `tests/data/README.md`, GiB:
/// (file, lower bound, no reuse).
pub const SHIPPED: [(&str, f64, f64); 4] = [
    ("eager-prefill-20shapes.tensor.trace", 1.26, 123.11),
    ("eager-prefill-20shapes.segment.trace", 1.93, 1.93),
    ("graph-warmup-20sizes.tensor.trace", 3.08, 1208.91),
    ("graph-warmup-20sizes.segment.trace", 28.58, 53.43),
];

/// A new non-blocking simulated stream (`CU_STREAM_NON_BLOCKING`: not ordered with
/// the legacy stream, as PyTorch's side and capture streams are).
pub fn stream(sim: &flare_package::SimDriver) -> flare_package::Stream {
    flare_package::Stream(
        sim.stream_create_with_flags(flare_package::driver::sim::CU_STREAM_NON_BLOCKING)
            .expect("a simulated stream"),
    )
}

/// The simulated driver recorded no contract fault (an unmap of memory queued work
/// touches, a hand-off of memory another stream's unordered work touches, anything
/// that breaks a capture).
#[track_caller]
pub fn no_faults(sim: &flare_package::SimDriver) {
    assert_eq!(sim.contract_faults(), 0, "faults: {:?}", sim.faults());
}

/// A segment-mode pool ([`ReusePolicy::Segments`]) on a fresh simulated device of
/// `capacity` bytes, release threshold `threshold`, and its simulated driver.
pub fn segment_pool(
    capacity: u64,
    threshold: u64,
) -> (Pool, std::sync::Arc<flare_package::SimDriver>) {
    simulated_pool(
        capacity,
        PoolConfig {
            reuse_policy: ReusePolicy::Segments,
            release_threshold_bytes: threshold,
            ..PoolConfig::default()
        },
    )
}

/// A pool with `config` (its backend replaced) on a fresh simulated device of
/// `capacity` bytes, and its simulated driver.
pub fn simulated_pool(
    capacity: u64,
    config: PoolConfig,
) -> (Pool, std::sync::Arc<flare_package::SimDriver>) {
    let pool = Pool::new(PoolConfig {
        backend: Backend::Simulated(SimConfig {
            capacity_bytes: capacity,
            ..SimConfig::default()
        }),
        ..config
    })
    .expect("a pool on the simulated driver");
    let sim = pool.sim_driver().expect("simulated");
    (pool, sim)
}

/// `size` bytes of the simulated driver `d` mapped at the start of a fresh
/// reservation, with access for `devices`. Returns the start.
pub fn mapped_for(
    d: &flare_package::SimDriver,
    size: u64,
    devices: &[i32],
) -> flare_package::DevicePtr {
    use flare_package::CuResult;
    let va = d.mem_address_reserve(size, 0).unwrap();
    let h = d.mem_create(size).unwrap();
    assert_eq!(d.mem_map(va, size, 0, h), CuResult::SUCCESS);
    assert_eq!(d.mem_set_access(va, size, devices), CuResult::SUCCESS);
    va
}
