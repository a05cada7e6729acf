//! The report printed as tables, one or more per section, and the targets.

use comfy_table::Table;

use flare_package::fmt_bytes;

use crate::harness::Stats;
use crate::report::Report;
use crate::sleep_wake::SleepWake;
use crate::threads::{SHARED_QUEUE, SHARED_SIZES};

fn us(ns: f64) -> String {
    format!("{:.2} µs", ns / 1000.0)
}

fn opt<T>(v: Option<T>, f: impl Fn(T) -> String) -> String {
    v.map_or_else(|| "n/a".to_string(), f)
}

pub(crate) fn print(r: &Report) {
    println!(
        "flare-bench-gpu: backend {:?}, device {}, {}timer overhead {:.0} ns (included in every pair)\n",
        r.backend,
        r.device,
        if r.quick { "QUICK RUN, " } else { "" },
        r.timer_overhead_ns
    );
    let mut t = Table::new();
    t.set_header(vec![
        "reuse pair",
        "flare median",
        "flare p99",
        "stream-ordered median",
        "stream-ordered p99",
        "cuMemAlloc median",
        "cuMemAlloc p99",
        "ours/stream (median)",
        "ours/cuMemAlloc (median)",
        "batched: flare / stream-ordered",
        "ours/stream (batched)",
    ]);
    for p in &r.reuse_pair {
        t.add_row(vec![
            fmt_bytes(p.size_bytes),
            us(p.flare.median_ns),
            us(p.flare.p99_ns),
            opt(p.stream_ordered, |s| us(s.median_ns)),
            opt(p.stream_ordered, |s| us(s.p99_ns)),
            opt(p.cu_mem_alloc, |s| us(s.median_ns)),
            opt(p.cu_mem_alloc, |s| us(s.p99_ns)),
            opt(p.ratio_median_vs_stream_ordered, |x| format!("{x:.3}")),
            opt(p.ratio_median_vs_cu_mem_alloc, |x| format!("{x:.5}")),
            format!(
                "{} / {}",
                us(p.flare_batched.median_ns),
                opt(p.stream_ordered_batched, |s| us(s.median_ns))
            ),
            opt(p.ratio_batched_vs_stream_ordered, |x| format!("{x:.3}")),
        ]);
    }
    println!("{t}\n");

    let mut t = Table::new();
    t.set_header(vec![
        "fresh mapping",
        "flare median",
        "flare p99",
        "raw driver median",
        "raw driver p99",
        "ours/raw (median)",
        "ours/raw (p99)",
    ]);
    for f in &r.fresh_mapping {
        t.add_row(vec![
            fmt_bytes(f.size_bytes),
            us(f.flare.median_ns),
            us(f.flare.p99_ns),
            us(f.raw_driver.median_ns),
            us(f.raw_driver.p99_ns),
            opt(f.ratio_median, |x| format!("{x:.3}")),
            opt(f.ratio_p99, |x| format!("{x:.3}")),
        ]);
    }
    println!("{t}\n");

    let mut t = Table::new();
    t.set_header(vec![
        "stream pair",
        "flare median",
        "flare p99",
        "cuMemAllocAsync median",
        "cuMemAllocAsync p99",
        "own pool median",
        "ours/cuMemAllocAsync (median)",
        "ours/own pool (median)",
    ]);
    for p in &r.stream_pair {
        t.add_row(vec![
            fmt_bytes(p.size_bytes),
            us(p.flare.median_ns),
            us(p.flare.p99_ns),
            opt(p.cu_mem_alloc_async, |s| us(s.median_ns)),
            opt(p.cu_mem_alloc_async, |s| us(s.p99_ns)),
            opt(p.stream_ordered, |s| us(s.median_ns)),
            opt(p.ratio_median_vs_cu_mem_alloc_async, |x| format!("{x:.3}")),
            opt(p.ratio_median_vs_stream_ordered, |x| format!("{x:.3}")),
        ]);
    }
    println!("{t}\n");

    let f = &r.inflight_frees;
    println!(
        "{} frees of {} buffers in flight per round{}",
        f.buffers,
        fmt_bytes(f.buffer_bytes),
        match (f.kernel_passes, f.kernel_ms) {
            (Some(p), Some(ms)) => format!(" (kernel ahead of them: {p} passes, {ms:.1} ms)"),
            _ => String::new(),
        }
    );
    let mut t = Table::new();
    t.set_header(vec![
        "in-flight frees",
        "rounds",
        "host time (median round)",
        "per free median",
        "per free p99",
        "in flight at the last free",
        "/ cuMemFreeAsync (host time)",
    ]);
    let rows = [
        (
            "flare free_async",
            Some(&f.flare_free_async),
            f.ratio_total_vs_cu_mem_free_async,
        ),
        ("cuMemFreeAsync", f.cu_mem_free_async.as_ref(), Some(1.0)),
        (
            "flare free_raw (synchronous)",
            Some(&f.flare_free_sync),
            f.ratio_total_sync_vs_cu_mem_free_async,
        ),
    ];
    for (what, batch, vs) in rows {
        let Some(b) = batch else { continue };
        t.add_row(vec![
            what.to_string(),
            b.rounds.to_string(),
            us(b.total_ns_median),
            us(b.per_free.median_ns),
            us(b.per_free.p99_ns),
            if b.in_flight_at_last_free {
                "yes"
            } else {
                "no"
            }
            .to_string(),
            opt(vs, |x| format!("{x:.3}")),
        ]);
    }
    println!("{t}\n");

    let mut t = Table::new();
    t.set_header(vec![
        "trace",
        "events",
        "policy",
        "flare time",
        "flare peak physical",
        "/ lower bound",
        "handles created",
        "flare free before/after",
        "stream-ordered time",
        "stream-ordered reserved high",
        "ours/stream time",
        "ours/stream peak",
    ]);
    for p in &r.replay {
        let so = p.stream_ordered.as_ref();
        let rows = [
            (&p.flare, p.ratio_seconds, p.ratio_peak_bytes),
            (
                &p.flare_segments,
                p.ratio_seconds_segments,
                p.ratio_peak_bytes_segments,
            ),
        ];
        for (f, vs_time, vs_peak) in rows {
            t.add_row(vec![
                p.trace.clone(),
                p.events.to_string(),
                f.policy.to_string(),
                format!("{:.2} ms", f.seconds * 1e3),
                fmt_bytes(f.peak_physical_bytes),
                opt(f.ratio_peak_vs_lower_bound, |x| format!("{x:.3}")),
                f.mappings_created.to_string(),
                match (f.mem_free_before, f.mem_free_after) {
                    (Some(b), Some(a)) => format!("{} / {}", fmt_bytes(b), fmt_bytes(a)),
                    _ => "n/a".to_string(),
                },
                opt(so, |s| match &s.error {
                    Some(e) => format!("failed: {e}"),
                    None => format!("{:.2} ms", s.seconds * 1e3),
                }),
                opt(so, |s| fmt_bytes(s.reserved_high_bytes)),
                opt(vs_time, |x| format!("{x:.3}")),
                opt(vs_peak, |x| format!("{x:.3}")),
            ]);
        }
    }
    println!("{t}\n");

    print_threads(r);
    print_sleep_wake(&r.sleep_wake);

    let mut t = Table::new();
    t.set_header(vec![
        "segment pair",
        "scope median / p99",
        "stream median / p99",
        "stream-ordered median / p99",
        "batched: scope / stream / stream-ordered",
        "scope/stream-ordered (median)",
        "stream/stream-ordered (median)",
        "batched ratios (scope, stream)",
    ]);
    let pair = |s: &Stats| format!("{} / {}", us(s.median_ns), us(s.p99_ns));
    for p in &r.segment_pair {
        t.add_row(vec![
            fmt_bytes(p.size_bytes),
            pair(&p.flare_sync),
            pair(&p.flare_stream),
            opt(p.stream_ordered.as_ref(), pair),
            format!(
                "{} / {} / {}",
                us(p.flare_sync_batched.median_ns),
                us(p.flare_stream_batched.median_ns),
                opt(p.stream_ordered_batched, |s| us(s.median_ns))
            ),
            opt(p.ratio_median_sync_vs_stream_ordered, |x| format!("{x:.3}")),
            opt(p.ratio_median_stream_vs_stream_ordered, |x| {
                format!("{x:.3}")
            }),
            match (
                p.ratio_batched_sync_vs_stream_ordered,
                p.ratio_batched_stream_vs_stream_ordered,
            ) {
                (Some(a), Some(b)) => format!("{a:.3}, {b:.3}"),
                _ => "n/a".to_string(),
            },
        ]);
    }
    println!("{t}\n");

    let mut t = Table::new();
    t.set_header(vec!["target", "measured", "met"]);
    for x in &r.targets {
        t.add_row(vec![
            x.what.clone(),
            opt(x.measured, |m| {
                if m.abs() >= 1e5 {
                    format!("{m:.3e}")
                } else {
                    format!("{m:.3}")
                }
            }),
            opt(x.met, |m| if m { "yes" } else { "NO" }.to_string()),
        ]);
    }
    println!("{t}");
}

/// Section 8's table.
fn print_sleep_wake(s: &SleepWake) {
    let gbs = |v: Option<f64>| opt(v, |b| format!("{:.1} GB/s", b / 1e9));
    println!(
        "host copy bandwidth (1 GiB, pinned): to host {}, to device {}",
        gbs(s.copy_to_host_bytes_per_second),
        gbs(s.copy_to_device_bytes_per_second)
    );
    let secs = |v: Option<f64>| opt(v, |x| format!("{:.0} ms", x * 1e3));
    let rate = |x: f64| format!("{:.1} GB/s", s.host_bytes as f64 / x / 1e9);
    println!(
        "host memory of {} apart from the copy: cuMemHostAlloc {}, cuMemFreeHost {}; \
         pageable, one thread: first touch (copy into fresh memory) {} ({}), warm copy {} ({})",
        fmt_bytes(s.host_bytes),
        secs(s.pinned_alloc_seconds),
        secs(s.pinned_free_seconds),
        secs(Some(s.pageable_first_touch_seconds)),
        rate(s.pageable_first_touch_seconds),
        secs(Some(s.pageable_warm_copy_seconds)),
        rate(s.pageable_warm_copy_seconds)
    );
    let mut t = Table::new();
    t.set_header(vec![
        "sleep / wake",
        "policy",
        "mode",
        "first sleep / wake",
        "sleep",
        "wake",
        "free memory rose by",
        "sleep bandwidth (of copy)",
        "wake bandwidth (of copy)",
    ]);
    for r in &s.rows {
        let of = |bw: Option<f64>, x: Option<f64>| {
            format!("{} ({})", gbs(bw), opt(x, |v| format!("{:.0}%", v * 100.0)))
        };
        t.add_row(vec![
            format!("{} x {}", r.allocations, fmt_bytes(r.allocation_bytes)),
            r.policy.to_string(),
            r.mode.to_string(),
            format!(
                "{:.1} / {:.1} ms",
                r.first_sleep_seconds * 1e3,
                r.first_wake_seconds * 1e3
            ),
            format!("{:.1} ms", r.sleep_seconds * 1e3),
            format!("{:.1} ms", r.wake_seconds * 1e3),
            opt(r.free_rise_bytes, fmt_bytes),
            of(r.sleep_bytes_per_second, r.sleep_vs_copy),
            of(r.wake_bytes_per_second, r.wake_vs_copy),
        ]);
    }
    println!("{t}\n");
}

/// Section 6's tables and issue 13's ratios.
fn print_threads(r: &Report) {
    println!(
        "thread caches: {} entries, {} per thread{}",
        r.thread_cache_entries,
        fmt_bytes(r.thread_cache_bytes),
        if r.thread_cache_entries == 0 {
            " (off)"
        } else {
            ""
        }
    );
    let counters = ["misses", "thread-cache hits", "remote frees"];
    let mut t = Table::new();
    let mut header = vec!["threads (own sizes)", "pairs", "pairs per second"];
    header.extend(counters);
    t.set_header(header);
    for x in &r.threads {
        t.add_row(vec![
            x.threads.to_string(),
            x.pairs.to_string(),
            format!("{:.3e}", x.pairs_per_second),
            x.misses.to_string(),
            x.thread_cache_hits.to_string(),
            x.remote_frees.to_string(),
        ]);
    }
    println!("{t}\n");

    println!(
        "shared sizes, cross-thread frees: thread t allocates {} in turn and hands each \
         to thread t + 1 (a queue of {SHARED_QUEUE}), which frees it; one thread frees \
         its own, through its queue",
        SHARED_SIZES.map(fmt_bytes).join(", ")
    );
    let mut t = Table::new();
    let mut header = vec!["threads (shared sizes)", "pairs", "pairs per second"];
    header.extend(counters);
    t.set_header(header);
    for x in &r.threads_shared {
        t.add_row(vec![
            format!(
                "{}{}",
                x.threads,
                if x.cross_thread { "" } else { " (same thread)" }
            ),
            x.pairs.to_string(),
            format!("{:.3e}", x.pairs_per_second),
            x.misses.to_string(),
            x.thread_cache_hits.to_string(),
            x.remote_frees.to_string(),
        ]);
    }
    println!("{t}\n");

    match &r.threads_stream_ordered {
        None => println!(
            "stream-ordered pool, one stream per thread: not measured (--backend {:?})\n",
            r.backend
        ),
        Some(rows) => {
            let mut t = Table::new();
            t.set_header(vec![
                "threads (stream-ordered pool, a stream each)",
                "pairs",
                "pairs per second",
            ]);
            for x in rows {
                t.add_row(vec![
                    x.threads.to_string(),
                    x.pairs.to_string(),
                    format!("{:.3e}", x.pairs_per_second),
                ]);
            }
            println!("{t}\n");
        }
    }

    let tr = &r.thread_ratios;
    let per_threads: Vec<String> = tr
        .own_sizes_vs_stream_ordered
        .iter()
        .map(|x| format!("{}: {}", x.threads, opt(x.ratio, |v| format!("{v:.2}"))))
        .collect();
    let ns = |v: Option<f64>| opt(v, |v| format!("{v:.1} ns"));
    println!(
        "ratios (issue 13): own sizes, flare / stream-ordered pairs per second by threads: \
         {}; one thread's reuse pair {} / stream-ordered warm pair: median {} ({} / {}), \
         batched {} ({} / {})\n",
        per_threads.join(", "),
        fmt_bytes(tr.reuse_pair_bytes),
        opt(tr.ratio_reuse_pair_vs_stream_ordered, |v| format!("{v:.3}")),
        ns(tr.reuse_pair_median_ns),
        ns(tr.stream_ordered_pair_median_ns),
        opt(tr.ratio_reuse_pair_batched_vs_stream_ordered, |v| {
            format!("{v:.3}")
        }),
        ns(tr.reuse_pair_batched_ns),
        ns(tr.stream_ordered_pair_batched_ns),
    );
}
