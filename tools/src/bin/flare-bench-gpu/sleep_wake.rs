//! Section 8: sleep and wake of one tag against the host copy bandwidth.

use std::time::Instant;

use serde::Serialize;

use flare_package::{fmt_bytes, Pool, ReusePolicy};

use crate::harness::{ratio, stats};
use crate::{Bench, BoxResult, GIB, MIB};

/// Section 8: the host copy bandwidth, then one row per allocation size and mode.
#[derive(Debug, Serialize)]
pub(crate) struct SleepWake {
    /// `cuMemcpyDtoH` of 1 GiB from a pool allocation into pinned memory, bytes per
    /// second (median of 3).
    pub(crate) copy_to_host_bytes_per_second: Option<f64>,
    /// `cuMemcpyHtoD` of the same, bytes per second.
    pub(crate) copy_to_device_bytes_per_second: Option<f64>,
    /// What an offload's host memory costs apart from the copy, for the tag's size
    /// (`host_bytes`): `cuMemHostAlloc` and `cuMemFreeHost` of one pinned buffer of
    /// that size (what sleep and wake do today), seconds; and the host side of a
    /// staging route through a bounded pinned buffer into ordinary pageable memory:
    /// a copy of that many bytes from a 64 MiB buffer into freshly allocated pageable
    /// memory (first touch: page faults and zeroing), and the same copy into it again
    /// (warm), seconds, one thread.
    pub(crate) host_bytes: u64,
    pub(crate) pinned_alloc_seconds: Option<f64>,
    pub(crate) pinned_free_seconds: Option<f64>,
    pub(crate) pageable_first_touch_seconds: f64,
    pub(crate) pageable_warm_copy_seconds: f64,
    pub(crate) rows: Vec<SleepWakeRow>,
}

#[derive(Debug, Serialize)]
pub(crate) struct SleepWakeRow {
    /// `best-fit` (whole mappings) or `segments` (blocks of the tag's own heap).
    pub(crate) policy: &'static str,
    pub(crate) allocation_bytes: u64,
    pub(crate) allocations: u64,
    /// `offload` or `discard`.
    pub(crate) mode: &'static str,
    /// The first round's sleep and wake, seconds: the sleep pins the host buffer
    /// (`cuMemHostAlloc`), which the wake keeps.
    pub(crate) first_sleep_seconds: f64,
    pub(crate) first_wake_seconds: f64,
    /// Medians over the later rounds (the kept buffer serves: no pinning), seconds.
    pub(crate) sleep_seconds: f64,
    pub(crate) wake_seconds: f64,
    /// The driver's free memory rise across the (last) sleep, bytes.
    pub(crate) free_rise_bytes: Option<u64>,
    /// Offload: requested bytes copied over the later rounds' sleep (wake) time,
    /// bytes per second, and its ratio to the host copy bandwidth of the same
    /// direction.
    pub(crate) sleep_bytes_per_second: Option<f64>,
    pub(crate) wake_bytes_per_second: Option<f64>,
    pub(crate) sleep_vs_copy: Option<f64>,
    pub(crate) wake_vs_copy: Option<f64>,
}

impl Bench {
    /// Section 8: the host copy bandwidth, then sleep and wake of one tag.
    pub(crate) fn sleep_wake(&self) -> BoxResult<SleepWake> {
        use flare_package::SleepMode;
        let total = if self.args.quick { 2 * GIB } else { 10 * GIB };
        // The first round, then the later ones (medians): the first sleep pins the
        // offload's host buffer, which its wake keeps for the later ones.
        let rounds = if self.args.quick { 2 } else { 4 };
        // Host copy bandwidth, both ways, 1 GiB through pinned memory.
        let pool = Pool::new(self.config())?;
        let d = pool.driver().clone();
        let a = pool.allocate_raw(GIB)?;
        let host = d.host_alloc(GIB)?;
        let (mut down, mut up) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            let t = Instant::now();
            d.copy_to_host(host, 0, a, GIB)?;
            down.push(t.elapsed().as_nanos() as u64);
            let t = Instant::now();
            d.copy_to_device(a, host, 0, GIB)?;
            up.push(t.elapsed().as_nanos() as u64);
        }
        d.host_free(host)?;
        pool.free_raw(a)?;
        drop(pool);
        let per_second = |bytes: u64, ns: f64| (ns > 0.0).then(|| bytes as f64 / (ns * 1e-9));
        let copy_down = per_second(GIB, stats(down).median_ns);
        let copy_up = per_second(GIB, stats(up).median_ns);
        // The host memory's own cost, apart from the copy: pinning the tag's size
        // (what offload does now), and first-touching as much pageable memory (what
        // a staging route would do instead), then copying into it warm.
        eprintln!("sleep and wake: host memory of {}", fmt_bytes(total));
        let d = Pool::new(self.config())?.driver().clone();
        let t = Instant::now();
        let pinned = d.host_alloc(total);
        let pinned_alloc_seconds = pinned.as_ref().ok().map(|_| t.elapsed().as_secs_f64());
        let pinned_free_seconds = match pinned {
            Ok(h) => {
                let t = Instant::now();
                d.host_free(h)?;
                Some(t.elapsed().as_secs_f64())
            }
            Err(_) => None,
        };
        let chunk = vec![0x5au8; (64 * MIB) as usize];
        let t = Instant::now();
        let mut pageable: Vec<u8> = Vec::with_capacity(total as usize);
        while pageable.len() < total as usize {
            let n = chunk.len().min(total as usize - pageable.len());
            pageable.extend_from_slice(&chunk[..n]);
        }
        let pageable_first_touch_seconds = t.elapsed().as_secs_f64();
        let t = Instant::now();
        for c in pageable.chunks_mut(chunk.len()) {
            c.copy_from_slice(&chunk[..c.len()]);
        }
        let pageable_warm_copy_seconds = t.elapsed().as_secs_f64();
        std::hint::black_box(&pageable);
        drop(pageable);
        let mut rows = Vec::new();
        let cases = [
            (ReusePolicy::BestFit, 2 * MIB),
            (ReusePolicy::BestFit, GIB),
            (ReusePolicy::Segments, 2 * MIB),
        ];
        for (policy, size) in cases {
            for mode in [SleepMode::Offload, SleepMode::Discard] {
                let n = total / size;
                let policy_name = if policy == ReusePolicy::Segments {
                    "segments"
                } else {
                    "best-fit"
                };
                eprintln!(
                    "sleep and wake: {n} x {} ({mode:?}, {policy_name})",
                    fmt_bytes(size)
                );
                let pool = Pool::new(self.config().with_policy(policy))?;
                let ptrs = (0..n)
                    .map(|_| pool.allocate_tagged_raw(size, None, 1))
                    .collect::<Result<Vec<_>, _>>()?;
                let (mut sleeps, mut wakes, mut rise) = (Vec::new(), Vec::new(), None);
                for _ in 0..rounds {
                    let before = self.mem_info(Some(&pool));
                    let t = Instant::now();
                    pool.sleep(1, mode)?;
                    sleeps.push(t.elapsed().as_nanos() as u64);
                    let after = self.mem_info(Some(&pool));
                    rise = before
                        .zip(after)
                        .map(|(b, a)| a.free.saturating_sub(b.free));
                    if pool.tag_census(1).physical_bytes != 0 {
                        return Err("a sleeping tag still holds physical memory".into());
                    }
                    let t = Instant::now();
                    pool.wake(1)?;
                    wakes.push(t.elapsed().as_nanos() as u64);
                }
                for p in ptrs {
                    pool.free_raw(p)?;
                }
                let (first_sleep_ns, first_wake_ns) = (sleeps[0], wakes[0]);
                let (sleep_ns, wake_ns) = (
                    stats(sleeps[1..].to_vec()).median_ns,
                    stats(wakes[1..].to_vec()).median_ns,
                );
                let offload = mode == SleepMode::Offload;
                let sleep_bw = per_second(total, sleep_ns).filter(|_| offload);
                let wake_bw = per_second(total, wake_ns).filter(|_| offload);
                rows.push(SleepWakeRow {
                    policy: policy_name,
                    allocation_bytes: size,
                    allocations: n,
                    mode: if offload { "offload" } else { "discard" },
                    first_sleep_seconds: first_sleep_ns as f64 * 1e-9,
                    first_wake_seconds: first_wake_ns as f64 * 1e-9,
                    sleep_seconds: sleep_ns * 1e-9,
                    wake_seconds: wake_ns * 1e-9,
                    free_rise_bytes: rise,
                    sleep_bytes_per_second: sleep_bw,
                    wake_bytes_per_second: wake_bw,
                    sleep_vs_copy: sleep_bw.zip(copy_down).and_then(|(a, b)| ratio(a, b)),
                    wake_vs_copy: wake_bw.zip(copy_up).and_then(|(a, b)| ratio(a, b)),
                });
            }
        }
        Ok(SleepWake {
            copy_to_host_bytes_per_second: copy_down,
            copy_to_device_bytes_per_second: copy_up,
            host_bytes: total,
            pinned_alloc_seconds,
            pinned_free_seconds,
            pageable_first_touch_seconds,
            pageable_warm_copy_seconds,
            rows,
        })
    }
}
