//! The figures of parsed traces: a small trace's, and the shipped traces' against
//! `tests/data/README.md`.

use crate::common;

use common::{data, GIB, GRANULARITY, SHIPPED};
use flare_package::trace::{self};

#[test]
fn figures_of_a_small_trace() {
    let mib = 1 << 20;
    // live: 2, 2+4 = 6 (peak), then 4, then 4+2 = 6; no reuse: 2 + 4 + 2 = 8
    let t = trace::parse_str("small", "a 1 1\na 2 3145728\nf 1\na 3 2097152\n").unwrap();
    assert_eq!(t.lower_bound_bytes(GRANULARITY), 6 * mib);
    assert_eq!(t.no_reuse_bytes(GRANULARITY), 8 * mib);
    // granularity 0 or 1: no rounding (1 + 3 MiB, then 3 + 2 MiB)
    assert_eq!(t.lower_bound_bytes(1), 5 * mib);
    assert_eq!(t.lower_bound_bytes(0), 5 * mib);
    assert_eq!(t.no_reuse_bytes(1), 1 + 5 * mib);
    // explicit scopes: retained memory is dropped at finish/abort, and frees outside
    // a scope are released
    let t = trace::parse_str(
        "scoped",
        "a w 4194304\nbegin\na 1 2097152\nf 1\na 2 2097152\nf 2\nfinish\na 3 2097152\nf 3\na 4 2097152\nf 4\nbegin\na 5 2097152\nabort\n",
    )
    .unwrap();
    assert_eq!(t.lower_bound_bytes(GRANULARITY), 6 * mib);
    // first scope: 4 live + 2 + 2 = 8; outside: 6; second: 4 + 2 = 6
    assert_eq!(t.no_reuse_bytes(GRANULARITY), 8 * mib);
}

#[test]
fn shipped_traces_match_the_readme_figures() {
    for (file, lower_gib, no_reuse_gib) in SHIPPED {
        let t = trace::parse(data(file)).unwrap_or_else(|e| panic!("{e}"));
        assert!(!t.has_scope_events(), "{file}");
        let lower = t.lower_bound_bytes(GRANULARITY) as f64 / GIB as f64;
        let no_reuse = t.no_reuse_bytes(GRANULARITY) as f64 / GIB as f64;
        assert!(
            (lower - lower_gib).abs() <= 0.01,
            "{file}: lower bound {lower:.4} GiB, README {lower_gib}"
        );
        assert!(
            (no_reuse - no_reuse_gib).abs() <= 0.01,
            "{file}: no reuse {no_reuse:.4} GiB, README {no_reuse_gib}"
        );
    }
}

#[test]
fn shipped_trace_allocation_counts_match_the_readme() {
    for (file, allocations) in [
        ("eager-prefill-20shapes.tensor.trace", 11781),
        ("eager-prefill-20shapes.segment.trace", 21),
        ("graph-warmup-20sizes.tensor.trace", 35323),
        ("graph-warmup-20sizes.segment.trace", 524),
    ] {
        let t = trace::parse(data(file)).unwrap();
        assert_eq!(t.allocations(), allocations, "{file}");
        assert!(t.name().ends_with(file));
    }
}
