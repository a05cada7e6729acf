//! The options and their values: bad arguments exit 2, policy names are exact, the
//! capacity and the best-fit waste percent are read as documented, and the CUDA
//! backend without CUDA is a clear error.

use std::path::Path;

use crate::cli::{flare_replay, stderr, stdout};
use crate::common::data;
use crate::{s, scratch};

#[test]
fn bad_arguments_exit_2() {
    let good = data("eager-prefill-20shapes.segment.trace");
    for args in [
        vec!["--policy", "first-fit", s(&good)],
        vec!["--capacity", "12XB", s(&good)],
        vec!["--capacity", "0", s(&good)],
        vec!["--backend", "rocm", s(&good)],
        vec!["--backend", "cuda", "--capacity", "96GiB", s(&good)],
        vec![],
    ] {
        let o = flare_replay(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(!stderr(&o).is_empty(), "{args:?}");
        assert!(stdout(&o).is_empty(), "{args:?}");
    }
}

#[test]
fn cuda_backend_without_cuda_is_a_clear_error() {
    let t = data("eager-prefill-20shapes.segment.trace");
    let o = flare_replay(&["--backend", "cuda", "--policy", "exact", s(&t)]);
    if o.status.success() {
        return; // a machine with CUDA
    }
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("no CUDA driver"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(stdout(&o).is_empty());
}

#[test]
fn policy_names_are_exact() {
    let t = scratch("one.trace", "a 1 4096\nf 1\n");
    for name in [
        "best_fit",
        "bestfit",
        "Best-Fit",
        "EXACT",
        "All",
        " none",
        "best-fit,exact",
        "Segments",
        "segment",
    ] {
        let o = flare_replay(&["--policy", name, s(&t)]);
        assert_eq!(o.status.code(), Some(2), "{name:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("none, exact, best-fit, segments or all"),
            "{name:?}: {}",
            stderr(&o)
        );
        assert!(stdout(&o).is_empty(), "{name:?}");
    }
    for (name, rows) in [
        ("none", 1),
        ("exact", 1),
        ("best-fit", 1),
        ("segments", 1),
        ("all", 4),
    ] {
        let o = flare_replay(&["--json", "--policy", name, s(&t)]);
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        assert_eq!(stdout(&o).lines().count(), rows, "{name}");
    }
}

#[test]
fn capacity_below_one_granule_is_rejected_with_the_granularity() {
    // The simulated device's granularity is 2 MiB (an H200's, SimConfig): a smaller
    // device could not map anything, so every policy would run out of memory at once.
    let t = scratch("granule.trace", "a 1 4096\nf 1\n");
    for capacity in ["1", "1M", "0", "2097151", "1.9999M", "0.001G"] {
        let o = flare_replay(&["--capacity", capacity, s(&t)]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{capacity}: {err}");
        assert!(err.contains("granularity"), "{capacity}: {err}");
        assert!(err.contains("2097152 B (2.0 MiB)"), "{capacity}: {err}");
        assert!(stdout(&o).is_empty(), "{capacity}");
    }
    // one granule is enough for this trace (4 KiB rounds up to one 2 MiB mapping)
    for capacity in ["2097152", "2M", "2MiB"] {
        let o = flare_replay(&["--json", "--policy", "exact", "--capacity", capacity, s(&t)]);
        assert!(o.status.success(), "{capacity}: {}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
        assert!(v["out_of_memory_at_line"].is_null(), "{capacity}: {v}");
        assert_eq!(v["peak_physical_bytes"], 2 << 20, "{capacity}");
    }
}

/// The out-of-memory line of a one-policy JSON replay of `trace` on a device of
/// `capacity`.
fn oom_line(capacity: &str, trace: &Path) -> Option<u64> {
    let o = flare_replay(&[
        "--json",
        "--policy",
        "exact",
        "--capacity",
        capacity,
        s(trace),
    ]);
    assert!(o.status.success(), "{capacity}: {}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    v["out_of_memory_at_line"].as_u64()
}

#[test]
fn decimal_capacity_is_that_many_bytes() {
    // 1.5G is 1.5 * 2^30 = 1610612736 bytes = 768 granules of 2 MiB: a 1.5 GiB
    // allocation fits, one more granule does not.
    let t = scratch("one-and-a-half.trace", "a 1 1610612736\na 2 1\n");
    assert_eq!(oom_line("1.5G", &t), Some(2));
    assert_eq!(oom_line("1.5GiB", &t), Some(2));
    assert_eq!(oom_line("1536M", &t), Some(2));
    // 1.5 GB is 1.5e9 bytes, less than the first allocation
    assert_eq!(oom_line("1.5GB", &t), Some(1));
    // one granule more holds both
    assert_eq!(oom_line("1.502G", &t), None);
    for bad in ["1.5.G", ".G", "1,5G", "1.5e9"] {
        let o = flare_replay(&["--capacity", bad, s(&t)]);
        assert_eq!(o.status.code(), Some(2), "{bad}: {}", stderr(&o));
        assert!(stdout(&o).is_empty(), "{bad}");
    }
}

#[test]
fn fractional_waste_percent_is_a_clear_error() {
    let t = scratch("waste.trace", "a 1 4096\nf 1\n");
    for bad in ["1.5", "30%", "abc", ""] {
        let o = flare_replay(&["--best-fit-waste-percent", bad, s(&t)]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {err}");
        assert!(
            err.contains("is not a whole number of percent"),
            "{bad:?}: {err}"
        );
        assert!(!err.contains("invalid digit"), "{bad:?}: {err}");
    }
    let o = flare_replay(&["--best-fit-waste-percent", "4294967296", s(&t)]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("is more than 4294967295 percent"),
        "{}",
        stderr(&o)
    );
    for good in ["0", "30", "4294967295"] {
        let o = flare_replay(&["--json", "--best-fit-waste-percent", good, s(&t)]);
        assert!(o.status.success(), "{good}: {}", stderr(&o));
    }
}
