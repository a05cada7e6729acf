//! `--json`: one object per replay with exactly the documented keys, the
//! out-of-memory line included.

use crate::cli::{flare_replay, stderr, stdout};
use crate::common::data;
use crate::s;

pub(crate) const JSON_KEYS: [&str; 10] = [
    "allocations",
    "backend",
    "final_physical_bytes",
    "mappings_created",
    "out_of_memory_at_line",
    "peak_physical_bytes",
    "policy",
    "reuse_hits",
    "seconds",
    "trace",
];

#[test]
fn json_has_exactly_the_keys() {
    let a = data("eager-prefill-20shapes.segment.trace");
    let b = data("graph-warmup-20sizes.segment.trace");
    let o = flare_replay(&["--json", s(&a), s(&b)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 8, "two traces x four policies: {out}");
    let mut policies = Vec::new();
    for line in &lines {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let obj = v.as_object().unwrap();
        let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, JSON_KEYS);
        assert_eq!(obj["backend"], "sim");
        assert!(obj["out_of_memory_at_line"].is_null());
        assert_eq!(obj["final_physical_bytes"], 0);
        assert!(obj["seconds"].is_f64());
        policies.push(obj["policy"].as_str().unwrap().to_string());
    }
    assert_eq!(
        policies,
        ["none", "exact", "best-fit", "segments", "none", "exact", "best-fit", "segments"]
    );
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(lines[0]).unwrap()["trace"],
        s(&a)
    );
}

#[test]
fn json_reports_out_of_memory_with_its_line() {
    let t = data("graph-warmup-20sizes.tensor.trace");
    let o = flare_replay(&["--json", "--policy", "none", "--capacity", "96GiB", s(&t)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["policy"], "none");
    assert!(v["out_of_memory_at_line"].as_u64().unwrap() > 1);
    assert_eq!(v["final_physical_bytes"], 0);
    assert!(v["peak_physical_bytes"].as_u64().unwrap() <= 96 << 30);
}
