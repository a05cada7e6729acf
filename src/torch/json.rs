//! The allocator's stats as JSON (`stats()` in Python).

use std::sync::OnceLock;

use super::TorchAllocator;
use crate::pool::{Backend, Snapshot};

impl TorchAllocator {
    /// The stats of `device` as one JSON object (`stats()` in Python): `device`,
    /// `backend` (`"cuda"` / `"sim"`), `created` (false: nothing else), `tensor` and
    /// `mempool` (every snapshot counter by name), `graph_pools` (a list of
    /// `{"id": [a, b], "live": n, "snapshot": {...}}`) and `physical_bytes` (the sum
    /// over all the device's pools). A device outside `0..MAX_DEVICES` (or, simulated,
    /// one the machine does not have) gives `{"error": "..."}`.
    pub fn stats_json(&self, device: i32) -> String {
        let backend = match self.config.backend {
            Backend::Cuda => "cuda",
            Backend::Simulated(_) => "sim",
        };
        let d = match self.known(device).map(OnceLock::get) {
            Ok(Some(d)) => d,
            Ok(None) => {
                return format!(
                    "{{\"device\":{device},\"backend\":\"{backend}\",\"created\":false}}"
                )
            }
            Err(e) => return format!("{{\"error\":{:?}}}", e.to_string()),
        };
        let tensor = d.tensor.snapshot();
        let mempool = d.mempool.snapshot();
        let graphs = self.graph_snapshots(device);
        let physical = tensor.physical_bytes
            + mempool.physical_bytes
            + graphs.iter().map(|(_, _, s)| s.physical_bytes).sum::<u64>();
        let graph_list: Vec<String> = graphs
            .iter()
            .map(|((a, b), live, s)| {
                format!(
                    "{{\"id\":[{a},{b}],\"live\":{live},\"snapshot\":{}}}",
                    snapshot_json(s)
                )
            })
            .collect();
        format!(
            "{{\"device\":{device},\"backend\":\"{backend}\",\"created\":true,\
             \"physical_bytes\":{physical},\"tensor\":{},\"mempool\":{},\"graph_pools\":[{}]}}",
            snapshot_json(&tensor),
            snapshot_json(&mempool),
            graph_list.join(",")
        )
    }
}

/// Every counter of the snapshot, by name, as a JSON object (`scope_open` as a
/// boolean).
pub fn snapshot_json(s: &Snapshot) -> String {
    macro_rules! json_fields {
        ( $( $(#[doc = $fdoc:literal])* $f:ident $(counts $call:ident)?, )* ) => {{
            let mut out = format!("{{\"scope_open\":{}", s.scope_open);
            $( out.push_str(&format!(",\"{}\":{}", stringify!($f), s.$f)); )*
            out.push('}');
            out
        }};
    }
    crate::pool::snapshot_counters!(json_fields! {})
}
