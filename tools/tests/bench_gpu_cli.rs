//! `flare-bench-gpu --traces`: checked before anything is measured. On the simulated
//! backend a bad directory would otherwise be reported only after every other
//! benchmark ran (exit 1); checked first, it is an argument error (exit 2) at once.
#![cfg(not(flare_loom))] // the loom build runs tests/loom/ alone

use std::path::PathBuf;
use std::process::{Command, Output};

fn bench(args: &[&str], cwd: Option<&std::path::Path>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_flare-bench-gpu"));
    c.args(args);
    if let Some(dir) = cwd {
        c.current_dir(dir);
    }
    c.output().expect("run flare-bench-gpu")
}

fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir()
        .join(format!("flare-bench-gpu-cli-{}", std::process::id()))
        .join(name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs with `--traces` (or the default when `None`) on the simulated backend and
/// checks the run stopped before any measurement: exit 2, nothing on stdout, no
/// JSON report. Returns stderr.
fn rejected(traces: Option<&str>, cwd: &std::path::Path) -> String {
    let json = cwd.join("report.json");
    let json = json.to_str().unwrap();
    let mut args = vec!["--backend", "sim", "--quick", "--json", json];
    if let Some(t) = traces {
        args.extend(["--traces", t]);
    }
    let o = bench(&args, Some(cwd));
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    assert!(o.stdout.is_empty(), "{args:?}: measured before failing");
    assert!(
        !std::path::Path::new(json).exists(),
        "{args:?}: wrote a report"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(
        err.lines().count(),
        1,
        "one error line, nothing measured: {err}"
    );
    err
}

#[test]
fn missing_traces_directory_fails_before_measuring() {
    let cwd = scratch_dir("missing");
    let err = rejected(Some("/nonexistent/flare/traces"), &cwd);
    assert!(err.contains("--traces /nonexistent/flare/traces"), "{err}");
}

#[test]
fn directory_without_trace_files_fails_before_measuring() {
    let cwd = scratch_dir("empty");
    let dir = scratch_dir("empty/traces");
    std::fs::write(dir.join("notes.txt"), "not a trace").unwrap();
    std::fs::create_dir_all(dir.join("sub.trace")).unwrap(); // a directory, not a file
    let err = rejected(Some(dir.to_str().unwrap()), &cwd);
    assert!(err.contains("no *.trace file"), "{err}");
}

#[test]
fn the_default_is_relative_to_the_current_directory() {
    // A directory without tests/data: the default does not fall back to the
    // repository, and the error says where it looked.
    let cwd = scratch_dir("default");
    let err = rejected(None, &cwd);
    assert!(err.contains("--traces tests/data"), "{err}");
    assert!(err.contains("relative to the current directory"), "{err}");
    assert!(err.contains(cwd.to_str().unwrap()), "{err}");
}

#[test]
fn help_says_where_the_default_is_looked_up() {
    let o = bench(&["--help"], None);
    assert!(o.status.success());
    let help = String::from_utf8_lossy(&o.stdout);
    assert!(help.starts_with("Compare flare-package with"), "{help}");
    assert!(!help.contains(env!("CARGO_PKG_DESCRIPTION")), "{help}");
    assert!(help.contains("current directory"), "{help}");
    assert!(!help.contains("repository root)"), "{help}");
    let o = bench(&["--version"], None);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        format!("flare-bench-gpu {}", env!("CARGO_PKG_VERSION"))
    );
}

/// The shipped traces, by absolute path (the tools' tests run from `tools/`).
fn shipped_traces() -> String {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data");
    dir.to_str().unwrap().to_string()
}

/// Without a usable device the default (CUDA) backend stops before measuring: exit
/// 2, a message naming the device, the failed call and the way out (`--backend
/// sim`), nothing on stdout, no report. Device 1000 exists on no machine, so this
/// holds with or without a GPU (without libcuda the load fails; with it,
/// `cuDeviceGet`).
#[test]
fn no_usable_device_fails_before_measuring_with_a_message() {
    let cwd = scratch_dir("no-device");
    let json = cwd.join("report.json");
    let traces = shipped_traces();
    let o = bench(
        &[
            "--device",
            "1000",
            "--traces",
            &traces,
            "--json",
            json.to_str().unwrap(),
        ],
        Some(&cwd),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(o.stdout.is_empty(), "measured before failing: {err}");
    assert!(!json.exists(), "wrote a report");
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        err.contains("CUDA is not available for device 1000"),
        "{err}"
    );
    assert!(err.contains("cuInit failed with CUDA_ERROR_"), "{err}");
    assert!(err.contains("--backend sim"), "{err}");
}

/// A quick dry run on the simulated driver reports the two stream-order sections
/// (issue 11) with flare-package's side measured and no alternative: three stream
/// pair sizes of a tenth of 20,000 pairs each; one round of 1,000 frees of 2 MiB
/// buffers in flight, through `free_async_raw` and through the synchronous
/// `free_raw`; the two new targets, unmeasured. The synchronous free drains the
/// stream (its release synchronizes the device first), so its buffers are never in
/// flight at the last free.
#[test]
fn a_simulated_quick_run_reports_the_stream_order_sections() {
    let cwd = scratch_dir("sim-run");
    let json = cwd.join("report.json");
    let traces = shipped_traces();
    let o = bench(
        &[
            "--backend",
            "sim",
            "--quick",
            "--traces",
            &traces,
            "--json",
            json.to_str().unwrap(),
        ],
        Some(&cwd),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let out = String::from_utf8_lossy(&o.stdout);
    for header in ["stream pair", "in-flight frees", "flare free_async"] {
        assert!(out.contains(header), "no {header:?} in the tables:\n{out}");
    }
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let mib = 1u64 << 20;

    let pairs = r["stream_pair"].as_array().expect("stream_pair");
    let sizes: Vec<u64> = pairs
        .iter()
        .map(|p| p["size_bytes"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes, [2 * mib, 64 * mib, 1024 * mib]);
    for p in pairs {
        assert_eq!(p["flare"]["iterations"], 2_000, "{p}");
        assert!(p["flare"]["median_ns"].as_f64().unwrap() > 0.0, "{p}");
        for alt in [
            "cu_mem_alloc_async",
            "stream_ordered",
            "ratio_median_vs_cu_mem_alloc_async",
        ] {
            assert!(
                p[alt].is_null(),
                "{alt} measured on the simulated driver: {p}"
            );
        }
    }

    let f = &r["inflight_frees"];
    assert_eq!(f["buffers"], 1_000, "{f}");
    assert_eq!(f["buffer_bytes"], 2 * mib, "{f}");
    for batch in ["flare_free_async", "flare_free_sync"] {
        assert_eq!(f[batch]["rounds"], 1, "{batch}: {f}");
        assert_eq!(f[batch]["per_free"]["iterations"], 1_000, "{batch}: {f}");
        assert!(f[batch]["total_ns_median"].as_f64().unwrap() > 0.0, "{f}");
    }
    assert_eq!(f["flare_free_sync"]["in_flight_at_last_free"], false, "{f}");
    for alt in [
        "cu_mem_free_async",
        "kernel_ms",
        "ratio_total_vs_cu_mem_free_async",
    ] {
        assert!(f[alt].is_null(), "{alt} on the simulated driver: {f}");
    }

    let targets = r["targets"].as_array().expect("targets");
    let find = |prefix: &str| {
        targets
            .iter()
            .find(|t| t["what"].as_str().unwrap().starts_with(prefix))
            .unwrap_or_else(|| panic!("no target {prefix:?}: {targets:?}"))
    };
    let pair = find("stream pair 2.0 MiB / cuMemAllocAsync + cuMemFreeAsync pair");
    assert_eq!(pair["limit"], 0.25);
    let frees = find("1000 free_async of 2.0 MiB in flight / as many cuMemFreeAsync");
    assert_eq!(frees["limit"], 2.0);
    for t in [pair, frees] {
        assert!(t["measured"].is_null() && t["met"].is_null(), "{t}");
    }
}

/// A quick dry run on the simulated driver reports segment mode (issue 12) beside the
/// rest: every shipped trace replayed with best-fit and with segments (each run to its
/// end, holding nothing afterwards: the replay frees, finishes its scope and trims; the
/// lower bound as the trace computes it at the simulated 2 MiB granularity; segments
/// held only in segment mode), section 7's pairs at its six sizes with a tenth of the
/// iterations (2,000 single pairs, 10 batches of 1,000), and the new targets: the pair
/// and peak ratios unmeasured without the stream-ordered pool, the handles created
/// measured on any backend.
#[test]
fn a_simulated_quick_run_reports_segment_mode() {
    let cwd = scratch_dir("sim-segments");
    let json = cwd.join("report.json");
    let traces = shipped_traces();
    let o = bench(
        &[
            "--backend",
            "sim",
            "--quick",
            "--traces",
            &traces,
            "--json",
            json.to_str().unwrap(),
        ],
        Some(&cwd),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let out = String::from_utf8_lossy(&o.stdout);
    for header in ["segment pair", "handles created", "/ lower bound"] {
        assert!(out.contains(header), "no {header:?} in the tables:\n{out}");
    }
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let (kib, mib) = (1u64 << 10, 1u64 << 20);

    let replays = r["replay"].as_array().expect("replay");
    let mut files: Vec<_> = std::fs::read_dir(&traces)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "trace"))
        .collect();
    files.sort();
    assert_eq!(replays.len(), files.len(), "one row per shipped trace");
    for (x, file) in replays.iter().zip(&files) {
        let t = flare_package::trace::parse(file).unwrap();
        let lower = t.lower_bound_bytes(2 * mib);
        assert_eq!(x["lower_bound_bytes"], lower, "{x}");
        for (key, policy) in [("flare", "best-fit"), ("flare_segments", "segments")] {
            let f = &x[key];
            assert_eq!(f["policy"], policy, "{x}");
            assert!(f["out_of_memory_at_line"].is_null(), "{f}");
            assert_eq!(f["final_physical_bytes"], 0, "{f}");
            let peak = f["peak_physical_bytes"].as_u64().unwrap();
            let vs_lower = f["ratio_peak_vs_lower_bound"].as_f64().unwrap();
            assert!((vs_lower - peak as f64 / lower as f64).abs() < 1e-9, "{f}");
            assert!(f["mappings_created"].as_u64().unwrap() >= 1, "{f}");
        }
        assert_eq!(
            x["flare"]["segments"], 0,
            "no segment with whole mappings: {x}"
        );
        let held = x["flare_segments"]["segments"].as_u64().unwrap();
        assert!(held >= 1, "the segment-mode replay held no segment: {x}");
        for alt in [
            "stream_ordered",
            "ratio_peak_bytes",
            "ratio_peak_bytes_segments",
            "ratio_seconds_segments",
        ] {
            assert!(x[alt].is_null(), "{alt} on the simulated driver: {x}");
        }
    }

    let pairs = r["segment_pair"].as_array().expect("segment_pair");
    let sizes: Vec<u64> = pairs
        .iter()
        .map(|p| p["size_bytes"].as_u64().unwrap())
        .collect();
    assert_eq!(
        sizes,
        [4 * kib, 64 * kib, mib, 2 * mib, 64 * mib, 1024 * mib]
    );
    for p in pairs {
        for (key, iterations) in [
            ("flare_sync", 2_000),
            ("flare_stream", 2_000),
            ("flare_sync_batched", 10_000),
            ("flare_stream_batched", 10_000),
        ] {
            assert_eq!(p[key]["iterations"], iterations, "{key}: {p}");
            assert!(p[key]["median_ns"].as_f64().unwrap() > 0.0, "{key}: {p}");
        }
        for alt in [
            "stream_ordered",
            "stream_ordered_batched",
            "ratio_median_sync_vs_stream_ordered",
            "ratio_batched_stream_vs_stream_ordered",
        ] {
            assert!(p[alt].is_null(), "{alt} on the simulated driver: {p}");
        }
    }

    // Section 8 (issue 15): a 2 GiB tag (--quick) in 2 MiB and 1 GiB allocations,
    // offload and discard; each sleep gives the whole 2 GiB back to the device.
    let sw = &r["sleep_wake"];
    let rows = sw["rows"].as_array().expect("sleep_wake rows");
    // Whole mappings (best-fit), then the 2 MiB case again as blocks of the tag's
    // own segment heap (segments per tag).
    let shape: Vec<(u64, u64, &str, &str)> = rows
        .iter()
        .map(|x| {
            (
                x["allocation_bytes"].as_u64().unwrap(),
                x["allocations"].as_u64().unwrap(),
                x["mode"].as_str().unwrap(),
                x["policy"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        shape,
        [
            (2 * mib, 1024, "offload", "best-fit"),
            (2 * mib, 1024, "discard", "best-fit"),
            (1024 * mib, 2, "offload", "best-fit"),
            (1024 * mib, 2, "discard", "best-fit"),
            (2 * mib, 1024, "offload", "segments"),
            (2 * mib, 1024, "discard", "segments"),
        ]
    );
    for x in rows {
        // The tag's physical bytes come back whole: exactly the 2 GiB of whole
        // mappings; in segment mode the tag's handles, which hold the 2 GiB of blocks
        // and at most one growth's unused tail (a growth maps at most 64 MiB beyond
        // its need, docs/ARCHITECTURE.md "Segments").
        let rise = x["free_rise_bytes"].as_u64().unwrap();
        if x["policy"] == "segments" {
            assert!((2048 * mib..=2048 * mib + 64 * mib).contains(&rise), "{x}");
        } else {
            assert_eq!(rise, 2048 * mib, "{x}");
        }
        let offload = x["mode"] == "offload";
        // The first round apart from the later ones (the kept host buffer).
        assert!(x["first_sleep_seconds"].as_f64().unwrap() > 0.0, "{x}");
        assert!(x["first_wake_seconds"].as_f64().unwrap() > 0.0, "{x}");
        assert_eq!(x["sleep_vs_copy"].is_null(), !offload, "{x}");
        assert_eq!(x["wake_bytes_per_second"].is_null(), !offload, "{x}");
    }

    let targets = r["targets"].as_array().expect("targets");
    let find = |what: &str| {
        targets
            .iter()
            .find(|t| t["what"] == what)
            .unwrap_or_else(|| panic!("no target {what:?}: {targets:?}"))
    };
    for what in [
        "segment pair 4.0 KiB (scope) / stream-ordered warm pair (median) <= 0.1",
        "segment stream pair 4.0 KiB / stream-ordered warm pair (median) <= 0.1",
    ] {
        let t = find(what);
        assert_eq!(t["limit"], 0.1);
        assert!(t["measured"].is_null() && t["met"].is_null(), "{t}");
    }
    for x in replays {
        let name = x["trace"].as_str().unwrap();
        let peak = find(&format!(
            "replay {name}: segments peak physical / stream-ordered reserved high <= 1"
        ));
        assert!(peak["measured"].is_null(), "{peak}");
        let handles = find(&format!("replay {name}: segments handles created <= 100"));
        assert_eq!(handles["limit"], 100.0);
        let created = x["flare_segments"]["mappings_created"].as_u64().unwrap();
        assert_eq!(handles["measured"], created as f64, "{handles}");
        assert_eq!(handles["met"], created <= 100, "{handles}");
    }
}

/// Runs a quick dry run on the simulated driver with the shipped traces and `extra`
/// arguments; checks it succeeded and returns stdout and the JSON report.
fn simulated_quick_run(name: &str, extra: &[&str]) -> (String, serde_json::Value) {
    let cwd = scratch_dir(name);
    let json = cwd.join("report.json");
    let traces = shipped_traces();
    let mut args = vec![
        "--backend",
        "sim",
        "--quick",
        "--traces",
        &traces,
        "--json",
        json.to_str().unwrap(),
    ];
    args.extend(extra);
    let o = bench(&args, Some(&cwd));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{args:?}: {err}");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let r = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    (out, r)
}

const THREADS: [u64; 5] = [1, 2, 4, 8, 16];
/// The shared-sizes section's queue: entries per thread.
const SHARED_QUEUE: u64 = 16;

/// A thread row's common figures: the thread counts in order, some pairs, at least
/// the quick run's 100 ms measured, pairs per second = pairs / seconds.
fn check_thread_rows(rows: &[serde_json::Value]) {
    let threads: Vec<u64> = rows
        .iter()
        .map(|x| x["threads"].as_u64().unwrap())
        .collect();
    assert_eq!(threads, THREADS);
    for x in rows {
        let pairs = x["pairs"].as_u64().unwrap();
        let seconds = x["seconds"].as_f64().unwrap();
        assert!(pairs > 0, "{x}");
        // The clock runs from the start to the last thread's stop, which comes after
        // the 100 ms sleep of a quick run.
        assert!(seconds >= 0.1, "{x}");
        let pps = x["pairs_per_second"].as_f64().unwrap();
        assert!((pps - pairs as f64 / seconds).abs() <= 1e-6 * pps, "{x}");
    }
}

/// A quick dry run on the simulated driver reports issue 13's thread sections:
/// - own sizes at 1, 2, 4, 8 and 16 threads: whole batches of 256 pairs per thread;
///   no miss (each size pre-warmed, and no thread asks for another's size); no
///   remote free (each thread frees only what it allocated); at most one
///   thread-cache hit per pair (a hit is an allocation, and every allocation while
///   measuring is a counted pair);
/// - shared sizes, cross-thread frees: one thread frees its own (no remote free),
///   more free another's; at most one hit per allocation, and the allocations made
///   while measuring are the frees counted plus what the queues gained (at most a
///   full queue per thread); at most one remote free per free, and the frees after
///   the first snapshot are those counted plus what the queues held at the end;
/// - the stream-ordered pool's section not measured (null), the ratios with our side
///   only: the own-sizes figures, section 1's 2 MiB pair per pair and batched (its
///   batches: a tenth of 20 of 1,000 pairs, at least 10);
/// - the new targets: the throughput floors measured from the rows and met when at
///   or above them, the pair ratios unmeasured.
#[test]
fn a_simulated_quick_run_reports_the_thread_sections() {
    let (out, r) = simulated_quick_run("sim-threads", &[]);
    for header in [
        "threads (own sizes)",
        "threads (shared sizes)",
        "stream-ordered pool, one stream per thread: not measured (--backend Sim)",
        "ratios (issue 13)",
    ] {
        assert!(out.contains(header), "no {header:?} in the output:\n{out}");
    }
    let defaults = flare_package::PoolConfig::default();
    assert_eq!(r["thread_cache_entries"], defaults.thread_cache_entries);
    assert_eq!(r["thread_cache_bytes"], defaults.thread_cache_bytes);

    let own = r["threads"].as_array().expect("threads");
    check_thread_rows(own);
    for x in own {
        let (n, pairs) = (x["threads"].as_u64().unwrap(), x["pairs"].as_u64().unwrap());
        assert_eq!(pairs % 256, 0, "{x}");
        assert!(pairs >= 256 * n, "every thread ran a batch at least: {x}");
        assert_eq!(x["misses"], 0, "{x}");
        assert_eq!(x["remote_frees"], 0, "{x}");
        assert!(x["thread_cache_hits"].as_u64().unwrap() <= pairs, "{x}");
    }

    let shared = r["threads_shared"].as_array().expect("threads_shared");
    check_thread_rows(shared);
    for x in shared {
        let (n, pairs) = (x["threads"].as_u64().unwrap(), x["pairs"].as_u64().unwrap());
        assert_eq!(x["cross_thread"], n > 1, "{x}");
        assert!(x["misses"].is_u64(), "{x}");
        let hits = x["thread_cache_hits"].as_u64().unwrap();
        assert!(hits <= pairs + n * SHARED_QUEUE, "{x}");
        // The frees after the first snapshot: the counted ones, then, once every
        // thread has left its loop (between two steps: no pointer in hand), what
        // is left in the queues.
        let remote = x["remote_frees"].as_u64().unwrap();
        assert!(remote <= pairs + n * SHARED_QUEUE, "{x}");
        if n == 1 {
            assert_eq!(remote, 0, "one thread frees only its own: {x}");
        }
    }
    assert!(
        r["threads_stream_ordered"].is_null(),
        "{}",
        r["threads_stream_ordered"]
    );

    let mib = 1u64 << 20;
    let pair = &r["reuse_pair"][0];
    assert_eq!(pair["size_bytes"], 2 * mib);
    for p in r["reuse_pair"].as_array().unwrap() {
        assert_eq!(p["flare_batched"]["iterations"], 10_000, "{p}");
        assert!(
            p["flare_batched"]["median_ns"].as_f64().unwrap() > 0.0,
            "{p}"
        );
        for alt in ["stream_ordered_batched", "ratio_batched_vs_stream_ordered"] {
            assert!(p[alt].is_null(), "{alt} on the simulated driver: {p}");
        }
    }
    let t = &r["thread_ratios"];
    assert_eq!(t["reuse_pair_bytes"], 2 * mib, "{t}");
    assert_eq!(t["reuse_pair_median_ns"], pair["flare"]["median_ns"], "{t}");
    assert_eq!(
        t["reuse_pair_batched_ns"], pair["flare_batched"]["median_ns"],
        "{t}"
    );
    for alt in [
        "stream_ordered_pair_median_ns",
        "ratio_reuse_pair_vs_stream_ordered",
        "stream_ordered_pair_batched_ns",
        "ratio_reuse_pair_batched_vs_stream_ordered",
    ] {
        assert!(t[alt].is_null(), "{alt} on the simulated driver: {t}");
    }
    let per = t["own_sizes_vs_stream_ordered"].as_array().unwrap();
    assert_eq!(per.len(), own.len(), "{t}");
    for (x, row) in per.iter().zip(own) {
        assert_eq!(x["threads"], row["threads"], "{t}");
        assert_eq!(x["flare_pairs_per_second"], row["pairs_per_second"], "{t}");
        assert!(x["stream_ordered_pairs_per_second"].is_null(), "{t}");
        assert!(x["ratio"].is_null(), "{t}");
    }

    let targets = r["targets"].as_array().expect("targets");
    let find = |what: &str| {
        targets
            .iter()
            .find(|t| t["what"] == what)
            .unwrap_or_else(|| panic!("no target {what:?}: {targets:?}"))
    };
    let row = |rows: &serde_json::Value, n: u64| {
        rows.as_array()
            .unwrap()
            .iter()
            .find(|x| x["threads"] == n)
            .unwrap()["pairs_per_second"]
            .as_f64()
            .unwrap()
    };
    for (what, limit, measured) in [
        (
            "own sizes, 1 thread(s): reuse pairs per second (all threads) >= 10 M",
            10e6,
            row(&r["threads"], 1),
        ),
        (
            "own sizes, 8 thread(s): reuse pairs per second (all threads) >= 60 M",
            60e6,
            row(&r["threads"], 8),
        ),
        (
            "own sizes, 16 thread(s): reuse pairs per second (all threads) >= 100 M",
            100e6,
            row(&r["threads"], 16),
        ),
        (
            "shared sizes, cross-thread frees, 16 threads: pairs per second (all threads) >= 20 M",
            20e6,
            row(&r["threads_shared"], 16),
        ),
    ] {
        let t = find(what);
        assert_eq!(t["limit"], limit, "{t}");
        assert_eq!(t["at_least"], true, "{t}");
        assert_eq!(t["measured"], measured, "{t}");
        assert_eq!(t["met"], measured >= limit, "{t}");
    }
    for what in [
        "one thread's reuse pair 2.0 MiB / stream-ordered warm pair (median) <= 0.05",
        "one thread's reuse pair 2.0 MiB / stream-ordered warm pair (batched) <= 0.05",
    ] {
        let t = find(what);
        assert_eq!(t["limit"], 0.05, "{t}");
        assert_eq!(t["at_least"], false, "{t}");
        assert!(t["measured"].is_null() && t["met"].is_null(), "{t}");
    }
}

/// `--thread-cache-entries 0 --thread-cache-bytes 0` turns every pool's thread
/// caches off: reported as such, and no thread section sees a thread-cache hit or a
/// remote free. Without caches every idle mapping is open to every thread, so the
/// pre-warms leave no miss in either section: each own size is pre-warmed, and the
/// shared sizes are pre-warmed with as many of each as can be live at once (per
/// thread, a queue of 16 holds at most 4 of one size of the four, plus one between
/// an allocation and its push, one between a pop and its free).
#[test]
fn thread_caches_off_on_the_command_line() {
    let (out, r) = simulated_quick_run(
        "sim-no-caches",
        &["--thread-cache-entries", "0", "--thread-cache-bytes", "0"],
    );
    assert!(
        out.contains("thread caches: 0 entries, 0 B per thread (off)"),
        "{out}"
    );
    assert_eq!(r["thread_cache_entries"], 0);
    assert_eq!(r["thread_cache_bytes"], 0);
    for section in ["threads", "threads_shared"] {
        let rows = r[section].as_array().expect(section);
        check_thread_rows(rows);
        for x in rows {
            for counter in ["misses", "thread_cache_hits", "remote_frees"] {
                assert_eq!(x[counter], 0, "{section} {counter}: {x}");
            }
        }
    }
}
