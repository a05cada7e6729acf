//! The PyTorch layer on the simulated driver: routing to graph pools, their life,
//! stream order, out-of-memory, the mempool pool's exact accounting, configuration.

// Test code: a failed expectation is the test failing (the crate denies these lints
// for library code).
#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;
use crate::{
    Backend, CrossStreamReuse, CuResult, Error, ReusePolicy, SimConfig, SimDriver, Stream,
};

const MIB: u64 = 1 << 20;

fn sim_allocator(capacity: u64) -> TorchAllocator {
    TorchAllocator::new(TorchConfig {
        backend: Backend::Simulated(SimConfig {
            capacity_bytes: capacity,
            device_count: 2,
            ..SimConfig::default()
        }),
        ..TorchConfig::default()
    })
}

fn stream(sim: &SimDriver, device: i32) -> Stream {
    let previous = sim.ctx_get_device();
    assert!(sim.ctx_set_current(device).is_success());
    let s = sim.stream_create().expect("stream");
    assert!(sim.ctx_set_current(previous).is_success());
    Stream(s)
}

/// Physical bytes over every pool of `device` (what the driver holds).
fn physical(a: &TorchAllocator, device: i32) -> u64 {
    let t = a
        .snapshot(device, PoolKind::Tensor)
        .map_or(0, |s| s.physical_bytes);
    let m = a
        .snapshot(device, PoolKind::Mempool)
        .map_or(0, |s| s.physical_bytes);
    let g: u64 = a
        .graph_snapshots(device)
        .iter()
        .map(|(_, _, s)| s.physical_bytes)
        .sum();
    t + m + g
}

#[test]
fn config_defaults_and_environment() {
    let c = TorchConfig::from_lookup(|_| None).expect("defaults");
    assert_eq!(c, TorchConfig::default());
    assert_eq!(c.backend, Backend::Cuda);
    assert_eq!(c.tensor_policy, ReusePolicy::Segments);
    assert_eq!(c.mempool_policy, ReusePolicy::Exact);
    assert_eq!(c.release_threshold_bytes, u64::MAX);

    let env = |name: &str| {
        Some(
            match name {
                "FLARE_TORCH_BACKEND" => "sim",
                "FLARE_TORCH_SIM_CAPACITY" => "3G",
                "FLARE_TORCH_SIM_DEVICES" => "4",
                "FLARE_TORCH_POLICY" => "best-fit",
                "FLARE_TORCH_RELEASE_THRESHOLD" => "64MiB",
                "FLARE_TORCH_CROSS_STREAM" => "never",
                "FLARE_TORCH_PEERS" => "1, 2",
                _ => "",
            }
            .to_string(),
        )
    };
    let c = TorchConfig::from_lookup(env).expect("valid");
    assert_eq!(
        c.backend,
        Backend::Simulated(SimConfig {
            capacity_bytes: 3 << 30,
            device_count: 4,
            ..SimConfig::default()
        })
    );
    assert_eq!(c.tensor_policy, ReusePolicy::BestFit);
    assert_eq!(c.graph_policy, ReusePolicy::Segments); // empty: the default
    assert_eq!(c.release_threshold_bytes, 64 * MIB);
    assert_eq!(c.cross_stream_reuse, CrossStreamReuse::Never);
    assert_eq!(c.peer_devices, vec![1, 2]);

    for (name, value) in [
        ("FLARE_TORCH_BACKEND", "rocm"),
        ("FLARE_TORCH_POLICY", "first-fit"),
        ("FLARE_TORCH_RELEASE_THRESHOLD", "lots"),
        ("FLARE_TORCH_PEERS", "0,x"),
    ] {
        let err = TorchConfig::from_lookup(|n| (n == name).then(|| value.to_string()))
            .expect_err("invalid value");
        let text = err.to_string();
        assert!(text.contains(name) && text.contains(value), "{text}");
    }

    // FLARE_TORCH_RECORD is a prefix of file names: a directory is refused (a new
    // user's `FLARE_TORCH_RECORD=/tmp` wrote `/tmp.dev0.tensor.trace` into `/`).
    for dir in [
        std::env::temp_dir().display().to_string(),
        "some/dir/".into(),
    ] {
        let text = TorchConfig::from_lookup(|n| (n == "FLARE_TORCH_RECORD").then(|| dir.clone()))
            .expect_err("a directory")
            .to_string();
        assert!(text.contains("is a directory"), "{text}");
    }

    // A simulated machine no engine could run on is refused when configured, not at
    // the first allocation: 1 byte holds no 2 MiB granule; 0 devices, or more than
    // the simulator has, name no device to allocate on.
    for (name, value, rule) in [
        ("FLARE_TORCH_SIM_CAPACITY", "1", "less than one granule"),
        ("FLARE_TORCH_SIM_DEVICES", "0", "0 devices"),
        ("FLARE_TORCH_SIM_DEVICES", "129", "at most 128"),
    ] {
        let env = |n: &str| match n {
            "FLARE_TORCH_BACKEND" => Some("sim".to_string()),
            n if n == name => Some(value.to_string()),
            _ => None,
        };
        let text = TorchConfig::from_lookup(env)
            .expect_err("impossible machine")
            .to_string();
        assert!(text.contains(name) && text.contains(rule), "{text}");
    }
}

#[test]
fn small_tensors_share_a_handle_and_frees_are_stream_ordered() {
    let a = sim_allocator(140 << 30);
    let sim = a.sim_driver(0).expect("sim");
    let s = stream(&sim, 0);
    let ptrs: Vec<u64> = (0..100)
        .map(|_| a.alloc(4096, 0, s).expect("alloc"))
        .collect();
    let snap = a.snapshot(0, PoolKind::Tensor).expect("created");
    // Segments: 100 blocks of 4 KiB in one 2 MiB handle.
    assert_eq!(snap.physical_bytes, 2 * MIB);
    assert_eq!(snap.block_live_bytes, 100 * 4096);
    // A kernel on s still uses the first tensor when it is freed.
    assert!(sim.launch(s.0, ptrs[0], 4096).is_success());
    a.free(ptrs[0], 0, s).expect("free");
    // Another stream does not get it while s's work is queued...
    let t = stream(&sim, 0);
    let other = a.alloc(4096, 0, t).expect("alloc on t");
    assert_ne!(other, ptrs[0]);
    // ...s does, at once (stream order).
    assert_eq!(a.alloc(4096, 0, s).expect("alloc on s"), ptrs[0]);
    assert_eq!(sim.contract_faults(), 0);
    // The threshold is max: frees keep memory cached until reset.
    for p in ptrs {
        a.free(p, 0, s).expect("free");
    }
    a.free(other, 0, t).expect("free other");
    assert!(sim.stream_complete(s.0).is_success());
    assert!(a.snapshot(0, PoolKind::Tensor).expect("s").physical_bytes > 0);
    a.reset().expect("reset");
    assert_eq!(physical(&a, 0), 0);
    assert_eq!(sim.contract_faults(), 0);
}

#[test]
fn capture_allocations_go_to_the_graph_pool_and_stay_there_until_released() {
    let a = sim_allocator(140 << 30);
    let sim = a.sim_driver(0).expect("sim");
    let s = stream(&sim, 0);
    let eager_before = a.alloc(MIB, 0, s).expect("eager");
    let id = (7, 0);
    a.begin_allocate_to_pool(0, id).expect("begin");
    assert!(sim
        .stream_begin_capture(s.0, crate::CaptureMode::Global)
        .is_success());
    let tmp = a.alloc(3 * MIB, 0, s).expect("capture tmp");
    let out = a.alloc(MIB, 0, s).expect("capture out");
    assert!(sim.launch(s.0, tmp, 3 * MIB).is_success()); // a graph node
    a.free(tmp, 0, s).expect("free in capture");
    // Freed in the capture: reused by the same capture.
    let tmp2 = a.alloc(3 * MIB, 0, s).expect("capture tmp2");
    assert_eq!(tmp2, tmp);
    a.free(tmp2, 0, s).expect("free tmp2");
    assert_eq!(sim.stream_end_capture(s.0), CuResult::SUCCESS);
    a.end_allocate_to_pool(0, id).expect("end");

    let graphs = a.graph_snapshots(0);
    assert_eq!(graphs.len(), 1);
    let (gid, live, gs) = graphs[0];
    assert_eq!((gid, live), (id, 1)); // `out` is live
    let graph_physical = gs.physical_bytes;
    assert!(graph_physical >= 4 * MIB);
    // The tensor pool saw only the eager allocation.
    assert_eq!(
        a.snapshot(0, PoolKind::Tensor).expect("t").block_live_count,
        1
    );

    // The graph's output is freed eagerly: it goes back to the graph pool, and no
    // eager allocation (same stream, same sizes) gets graph memory.
    a.free(out, 0, s).expect("free out");
    let graph_range = |p: u64| a.graph_snapshots(0).len() == 1 && (p == tmp || p == out);
    for size in [MIB, 3 * MIB, MIB, 3 * MIB] {
        let p = a.alloc(size, 0, s).expect("eager after");
        assert!(!graph_range(p), "eager allocation {p:#x} got graph memory");
        a.free(p, 0, s).expect("free eager");
    }
    a.reset().expect("reset");
    // Reset keeps the graph pool's memory: its graph may replay.
    assert_eq!(a.graph_snapshots(0)[0].2.physical_bytes, graph_physical);
    // PyTorch releases the pool: nothing live, so it is destroyed now.
    a.release_pool(0, id).expect("release");
    assert!(a.graph_snapshots(0).is_empty());
    a.free(eager_before, 0, s).expect("free eager_before");
    a.reset().expect("reset");
    assert_eq!(physical(&a, 0), 0);
    assert_eq!(sim.state().physical_bytes, 0);
    assert_eq!(sim.contract_faults(), 0);
}

/// In a graph pool, memory a capture frees on its stream coalesces and serves that
/// capture's later requests, as PyTorch's private pools do: two adjacent 4 MiB blocks
/// freed in the capture serve an 8 MiB request with no growth. (The pool maps 4 MiB
/// for the first block, then 4 MiB more for the second: an eighth of 4 MiB, rounded
/// to the 2 MiB granularity, is less than the need.) Held whole in the capture's
/// bucket instead, neither block would fit, and the pool would map 8 MiB more.
#[test]
fn a_capture_reuses_what_it_freed_coalesced() {
    let a = sim_allocator(140 << 30);
    let sim = a.sim_driver(0).expect("sim");
    let s = stream(&sim, 0);
    let id = (9, 0);
    a.begin_allocate_to_pool(0, id).expect("begin");
    assert!(sim
        .stream_begin_capture(s.0, crate::CaptureMode::Global)
        .is_success());
    let x = a.alloc(4 * MIB, 0, s).expect("x");
    let y = a.alloc(4 * MIB, 0, s).expect("y");
    assert_eq!(y, x + 4 * MIB, "adjacent in the segment");
    a.free(x, 0, s).expect("free x");
    a.free(y, 0, s).expect("free y");
    let z = a.alloc(8 * MIB, 0, s).expect("z");
    assert_eq!(z, x, "the two freed blocks, coalesced");
    let (_, _, gs) = a.graph_snapshots(0)[0];
    assert_eq!(gs.physical_bytes, 8 * MIB);
    assert_eq!(gs.capture_held_bytes, 0);
    assert_eq!(sim.stream_end_capture(s.0), CuResult::SUCCESS);
    a.end_allocate_to_pool(0, id).expect("end");
    // Eager work never gets the graph's memory: the tensor pool is another pool.
    let e = a.alloc(8 * MIB, 0, s).expect("eager");
    assert!(e < x || e >= x + 8 * MIB);
    a.free(e, 0, s).expect("free eager");
    a.free(z, 0, s).expect("free z");
    a.release_pool(0, id).expect("release");
    a.reset().expect("reset");
    assert!(a.graph_snapshots(0).is_empty());
    assert_eq!(physical(&a, 0), 0);
    assert_eq!(sim.contract_faults(), 0);
}

#[test]
fn a_released_graph_pool_lives_until_its_last_allocation_is_freed() {
    let a = sim_allocator(140 << 30);
    let sim = a.sim_driver(0).expect("sim");
    let s = stream(&sim, 0);
    let id = (0, 3);
    // Two graphs share the pool: two begins, two releases.
    let mut outs = Vec::new();
    for _ in 0..2 {
        a.begin_allocate_to_pool(0, id).expect("begin");
        assert!(sim
            .stream_begin_capture(s.0, crate::CaptureMode::Global)
            .is_success());
        outs.push(a.alloc(5 * MIB, 0, s).expect("alloc"));
        assert_eq!(sim.stream_end_capture(s.0), CuResult::SUCCESS);
        a.end_allocate_to_pool(0, id).expect("end");
    }
    a.release_pool(0, id).expect("release 1");
    a.release_pool(0, id).expect("release 2");
    assert_eq!(a.graph_snapshots(0).len(), 1, "two outputs still live");
    a.free(outs[0], 0, s).expect("free 0");
    assert_eq!(a.graph_snapshots(0).len(), 1, "one output still live");
    a.free(outs[1], 0, s).expect("free 1");
    assert!(a.graph_snapshots(0).is_empty());
    assert_eq!(sim.state().physical_bytes, 0);
    assert_eq!(sim.contract_faults(), 0);
}

#[test]
fn a_release_during_another_capture_waits_for_its_end() {
    let a = sim_allocator(140 << 30);
    let sim = a.sim_driver(0).expect("sim");
    let s = stream(&sim, 0);
    a.begin_allocate_to_pool(0, (1, 0)).expect("begin 1");
    assert!(sim
        .stream_begin_capture(s.0, crate::CaptureMode::Global)
        .is_success());
    let p = a.alloc(MIB, 0, s).expect("alloc");
    a.free(p, 0, s).expect("free");
    assert_eq!(sim.stream_end_capture(s.0), CuResult::SUCCESS);
    a.end_allocate_to_pool(0, (1, 0)).expect("end 1");
    // A second capture begins; the first graph is destroyed meanwhile.
    a.begin_allocate_to_pool(0, (2, 0)).expect("begin 2");
    assert!(sim
        .stream_begin_capture(s.0, crate::CaptureMode::Global)
        .is_success());
    a.release_pool(0, (1, 0)).expect("release 1");
    // Destroying synchronizes the device: not while the capture is open.
    assert_eq!(a.graph_snapshots(0).len(), 2);
    let q = a.alloc(MIB, 0, s).expect("alloc 2");
    assert_eq!(
        sim.stream_end_capture(s.0),
        CuResult::SUCCESS,
        "capture stayed valid"
    );
    a.end_allocate_to_pool(0, (2, 0)).expect("end 2");
    assert_eq!(a.graph_snapshots(0).len(), 1, "pool 1 destroyed at the end");
    assert_eq!(a.graph_snapshots(0)[0].0, (2, 0));
    a.free(q, 0, s).expect("free q");
    a.release_pool(0, (2, 0)).expect("release 2");
    assert!(a.graph_snapshots(0).is_empty());
    assert_eq!(sim.contract_faults(), 0);
}

#[test]
fn no_pool_begun_a_capture_uses_the_tensor_pool_and_other_streams_stay_eager() {
    let a = sim_allocator(140 << 30);
    let sim = a.sim_driver(0).expect("sim");
    let s = stream(&sim, 0);
    let t = stream(&sim, 0);
    a.begin_allocate_to_pool(0, (9, 0)).expect("begin");
    // t is not captured: its allocation is eager, from the tensor pool.
    let e = a.alloc(MIB, 0, t).expect("eager on t");
    assert!(a.graph_snapshots(0).iter().all(|(_, live, _)| *live == 0));
    a.free(e, 0, t).expect("free");
    a.end_allocate_to_pool(0, (9, 0)).expect("end");
    a.release_pool(0, (9, 0)).expect("release");
    assert!(a.graph_snapshots(0).is_empty());
    // A raw capture (no pool begun) allocates from the tensor pool.
    assert!(sim
        .stream_begin_capture(s.0, crate::CaptureMode::Global)
        .is_success());
    let c = a.alloc(MIB, 0, s).expect("capture");
    a.free(c, 0, s).expect("free");
    assert_eq!(sim.stream_end_capture(s.0), CuResult::SUCCESS);
    assert!(a.snapshot(0, PoolKind::Tensor).expect("t").captures_seen >= 1);
    assert_eq!(sim.contract_faults(), 0);
}

#[test]
fn record_stream_delays_reuse_until_the_other_stream_completes() {
    let a = sim_allocator(140 << 30);
    let sim = a.sim_driver(0).expect("sim");
    let s = stream(&sim, 0);
    let t = stream(&sim, 0);
    let p = a.alloc(MIB, 0, s).expect("alloc");
    assert!(sim.launch(t.0, p, MIB).is_success()); // used on t
    a.record_stream(p, t).expect("record");
    a.free(p, 0, s).expect("free");
    assert!(sim.stream_complete(s.0).is_success());
    // t's work still queued: neither s nor t gets it.
    let q = a.alloc(MIB, 0, s).expect("alloc s");
    assert_ne!(q, p);
    assert_eq!(sim.contract_faults(), 0);
    assert!(sim.stream_complete(t.0).is_success());
    assert!(matches!(
        a.record_stream(0xdead_0000, t),
        Err(Error::UnknownPointer { .. })
    ));
    a.free(q, 0, s).expect("free q");
    a.reset().expect("reset");
    assert_eq!(sim.state().physical_bytes, 0);
    assert_eq!(sim.contract_faults(), 0);
}

#[test]
fn out_of_memory_is_an_error_and_the_pool_stays_usable() {
    let a = sim_allocator(64 * MIB);
    let sim = a.sim_driver(0).expect("sim");
    let s = stream(&sim, 0);
    let big = a.alloc(40 * MIB, 0, s).expect("40 MiB");
    let err = a.alloc(40 * MIB, 0, s).expect_err("does not fit");
    assert!(matches!(err, Error::OutOfMemory { .. }), "{err}");
    let err = a.alloc(1 << 40, 0, s).expect_err("beyond the device");
    assert!(matches!(err, Error::RequestTooLarge { .. }), "{err}");
    assert_eq!(a.live_idle_bytes(0).0, 40 * MIB);
    a.free(big, 0, s).expect("free");
    // Cached (threshold max), yet the next request is served: the out-of-memory
    // path reuses or releases what is idle.
    let p = a.alloc(60 * MIB, 0, s).expect("60 MiB after the free");
    a.free(p, 0, s).expect("free");
    assert_eq!(sim.contract_faults(), 0);
}

#[test]
fn mempool_pool_physical_is_what_pytorch_holds() {
    let a = sim_allocator(140 << 30);
    let sim = a.sim_driver(0).expect("sim");
    let s = stream(&sim, 0);
    let segs: Vec<u64> = [2 * MIB, 20 * MIB, 2 * MIB]
        .iter()
        .map(|&b| a.pool_alloc(b, 0, s).expect("segment"))
        .collect();
    let m = a.snapshot(0, PoolKind::Mempool).expect("m");
    assert_eq!(m.physical_bytes, 24 * MIB);
    assert_eq!(m.live_mapped_bytes, 24 * MIB);
    a.pool_free(segs[1], 0, s).expect("free");
    assert_eq!(
        a.snapshot(0, PoolKind::Mempool).expect("m").physical_bytes,
        4 * MIB
    );
    a.pool_free(segs[0], 0, s).expect("free");
    a.pool_free(segs[2], 0, s).expect("free");
    assert_eq!(physical(&a, 0), 0);
    assert!(matches!(
        a.pool_free(segs[2], 0, s),
        Err(Error::UnknownPointer { .. })
    ));
    assert_eq!(sim.contract_faults(), 0);
}

#[test]
fn devices_have_their_own_pools() {
    let a = sim_allocator(140 << 30);
    let sim1 = a.sim_driver(1).expect("sim 1");
    let s1 = stream(&sim1, 1);
    let p = a.alloc(MIB, 1, s1).expect("device 1");
    assert!(a.snapshot(0, PoolKind::Tensor).is_none(), "device 0 unused");
    assert!(matches!(
        a.free(p, 0, Stream::LEGACY),
        Err(Error::UnknownPointer { .. })
    ));
    assert!(matches!(
        a.alloc(MIB, 64, Stream::LEGACY),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        a.alloc(MIB, -1, Stream::LEGACY),
        Err(Error::InvalidArgument(_))
    ));
    a.free(p, 1, s1).expect("free on its device");
    let json = a.stats_json(1);
    assert!(json.starts_with("{\"device\":1,\"backend\":\"sim\",\"created\":true"));
    assert!(json.contains("\"block_live_count\":0"));
    // The machine has 2 devices: 5 is an error, as it is for an allocation on it;
    // a device that exists but was never used is reported as not created.
    assert!(a.stats_json(5).contains("device 5 does not exist"));
    assert!(matches!(
        a.alloc(MIB, 5, Stream::LEGACY),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(a.trim(5), Err(Error::InvalidArgument(_))));
    let fresh = sim_allocator(140 << 30);
    assert_eq!(
        fresh.stats_json(1),
        "{\"device\":1,\"backend\":\"sim\",\"created\":false}"
    );
    assert!(fresh.trim(1).is_ok());
}

#[test]
fn retention_scope_on_the_tensor_pool() {
    let a = sim_allocator(140 << 30);
    a.retention_begin(0).expect("begin");
    assert!(matches!(a.retention_begin(0), Err(Error::ScopeState(_))));
    let p = a.alloc(8 * MIB, 0, Stream::LEGACY).expect("alloc");
    a.free(p, 0, Stream::LEGACY).expect("free");
    assert!(matches!(a.trim(0), Err(Error::ScopeState(_))));
    // empty_cache (torch.cuda.graph calls it before each capture) inside the scope:
    // no error, and the freed 8 MiB stays retained until the finish.
    a.reset().expect("empty_cache inside a scope is no failure");
    assert_eq!(physical(&a, 0), 8 * MIB);
    a.retention_finish(0, false).expect("finish");
    assert_eq!(physical(&a, 0), 0);
    assert!(matches!(
        a.retention_finish(0, false),
        Err(Error::ScopeState(_))
    ));
}
