//! memory_viz snapshots (issue 38): a pool's memory and recent history as the pickle
//! that PyTorch's memory_viz reads (`pytorch.org/memory_viz`, or
//! `torch.cuda._memory_viz` offline: `segment_plot`, `trace_plot`, `segsum`, `trace`).
//!
//! The pickle is a dict of two keys, as `torch.cuda.memory._snapshot()` writes it:
//! - `segments`: one dict per segment ([`Pool::memory_layout`]: a whole mapping, or
//!   in segment mode a run of handles mapped back to back) with `device`, `address`,
//!   `total_size`, `allocated_size`, `active_size`, `requested_size`, `stream`,
//!   `segment_type` (`"small"`, `"large"`), `segment_pool_id` (a pair of ints),
//!   `is_expandable`, `frames` (empty) and `blocks`, which tile it in address order:
//!   each with `address`, `size`, `requested_size`, `state` (`"active_allocated"`,
//!   `"inactive"`), `frames` (empty) and `category` (the tag).
//! - `device_traces`: one list per device ordinal up to the highest of the pools, of
//!   the history ring's events ([`Pool::history`]) in the order they happened (every
//!   pool of a device merged), each a dict with `action`, `addr`, `size`, `stream`,
//!   `time_us`, `frames` (`[{"filename": "flare_package", "line": 0, "name":
//!   FRAME}]` for an event whose thread set a frame, else empty), `category` and, for
//!   `oom`, `device_free`.
//!
//! A category is a tag's name: `"untagged"` for tag 0, `"tag N"` otherwise.
//! MemoryViz.js collects the categories of the trace events and, when there are some
//! and none is named `"unknown"`, adds `"unknown"` to a misspelled list
//! (`snapshot.categores.push`), which throws and leaves the page empty. So when the
//! events name categories and none is `"unknown"`, each device's trace ends with a
//! `snapshot` event (PyTorch's own action for the moment a snapshot was taken,
//! which the page lists and skips) of category `"unknown"`.
//!
//! The page's reader takes only the opcodes of protocols 2 to 4 that PyTorch's
//! pickles use; serde-pickle's protocol 3 with plain values (no bytes, no sets)
//! writes only those: ints (addresses are below 2^63), strings, lists, dicts,
//! tuples, bools.

use std::collections::BTreeMap;
use std::path::Path;

use serde_pickle::{HashableValue, SerOptions, Value};

use crate::error::{Error, Result};
use crate::pool::{HistoryAction, HistoryEvent, LayoutSegment, Pool};

/// One pool of a snapshot and its `segment_pool_id`.
#[derive(Clone, Copy)]
pub struct SnapshotPool<'a> {
    /// The pool.
    pub pool: &'a Pool,
    /// The pair memory_viz shows as the segment's pool (PyTorch's `MempoolId_t`;
    /// `(0, 0)` for a lone pool).
    pub pool_id: (u64, u64),
}

/// The category of tag `tag`: `"untagged"` for 0, `"tag N"` otherwise.
pub fn tag_category(tag: u32) -> String {
    if tag == 0 {
        "untagged".to_string()
    } else {
        format!("tag {tag}")
    }
}

/// An int (addresses, sizes, streams and times are below 2^63; a larger value is
/// written as `i64::MAX`).
fn int(v: u64) -> Value {
    Value::I64(i64::try_from(v).unwrap_or(i64::MAX))
}

fn s(v: &str) -> Value {
    Value::String(v.to_string())
}

fn dict(entries: Vec<(&str, Value)>) -> Value {
    Value::Dict(
        entries
            .into_iter()
            .map(|(k, v)| (HashableValue::String(k.to_string()), v))
            .collect::<BTreeMap<_, _>>(),
    )
}

/// The frames of an event: the thread's frame as one frame, or none.
fn frames(frame: Option<&str>) -> Value {
    Value::List(
        frame
            .map(|f| {
                dict(vec![
                    ("filename", s("flare_package")),
                    ("line", int(0)),
                    ("name", s(f)),
                ])
            })
            .into_iter()
            .collect(),
    )
}

/// One segment of device `device` as memory_viz reads it.
fn segment(seg: &LayoutSegment, device: i32, pool_id: (u64, u64)) -> Value {
    let blocks = seg
        .blocks
        .iter()
        .map(|b| {
            dict(vec![
                ("address", int(b.address)),
                ("size", int(b.size)),
                ("requested_size", int(b.requested_size)),
                ("state", s(b.state.name())),
                ("frames", Value::List(Vec::new())),
                ("category", Value::String(tag_category(b.tag))),
            ])
        })
        .collect();
    let allocated = seg.allocated_size();
    dict(vec![
        ("device", Value::I64(i64::from(device))),
        ("address", int(seg.address)),
        ("total_size", int(seg.total_size)),
        ("allocated_size", int(allocated)),
        ("active_size", int(allocated)),
        ("requested_size", int(seg.requested_size())),
        ("stream", int(seg.stream)),
        ("segment_type", s(seg.segment_type)),
        (
            "segment_pool_id",
            Value::Tuple(vec![int(pool_id.0), int(pool_id.1)]),
        ),
        ("is_expandable", Value::Bool(seg.is_expandable)),
        ("frames", Value::List(Vec::new())),
        ("blocks", Value::List(blocks)),
    ])
}

/// One trace event as memory_viz reads it.
fn event(e: &HistoryEvent) -> Value {
    let mut d = vec![
        ("action", s(e.action.name())),
        ("addr", int(e.addr)),
        ("size", int(e.size)),
        ("stream", int(e.stream)),
        ("time_us", int(e.time_us)),
        ("frames", frames(e.frame.as_deref())),
        ("category", Value::String(tag_category(e.tag))),
    ];
    if e.action == HistoryAction::Oom {
        d.push(("device_free", int(e.device_free)));
    }
    dict(d)
}

/// The snapshot of `pools` as a pickle value (see the module documentation).
pub fn snapshot_value(pools: &[SnapshotPool<'_>]) -> Value {
    let devices = pools
        .iter()
        .map(|p| usize::try_from(p.pool.device()).unwrap_or(0) + 1)
        .max()
        .unwrap_or(1);
    let mut segments = Vec::new();
    let mut traces: Vec<Vec<HistoryEvent>> = vec![Vec::new(); devices];
    for p in pools {
        let device = p.pool.device();
        for seg in p.pool.memory_layout() {
            segments.push(segment(&seg, device, p.pool_id));
        }
        let (events, _) = p.pool.history();
        if let Some(t) = traces.get_mut(usize::try_from(device).unwrap_or(0)) {
            t.extend(events);
        }
    }
    let mut categories = std::collections::BTreeSet::new();
    for t in &mut traces {
        t.sort_by_key(|e| e.seq);
        categories.extend(t.iter().map(|e| tag_category(e.tag)));
    }
    let guard = !categories.is_empty() && !categories.contains("unknown");
    let device_traces = traces
        .iter()
        .map(|t| {
            let mut list: Vec<Value> = t.iter().map(event).collect();
            if guard && !t.is_empty() {
                list.push(dict(vec![
                    ("action", s("snapshot")),
                    ("addr", int(0)),
                    ("size", int(0)),
                    ("stream", int(0)),
                    ("time_us", int(t.last().map_or(0, |e| e.time_us))),
                    ("frames", Value::List(Vec::new())),
                    ("category", s("unknown")),
                ]));
            }
            Value::List(list)
        })
        .collect();
    dict(vec![
        ("segments", Value::List(segments)),
        ("device_traces", Value::List(device_traces)),
    ])
}

/// The snapshot of `pools` as pickle bytes (protocol 3).
///
/// Errors: [`Error::InvalidArgument`] if the value cannot be written (not expected:
/// every value is plain data).
pub fn snapshot_pickle(pools: &[SnapshotPool<'_>]) -> Result<Vec<u8>> {
    serde_pickle::value_to_vec(&snapshot_value(pools), SerOptions::new())
        .map_err(|e| Error::InvalidArgument(format!("memory_viz snapshot: {e}")))
}

/// Writes the snapshot of `pools` to `path` (created or truncated).
///
/// Errors: [`Error::Io`] when the file cannot be written.
pub fn write_snapshot(pools: &[SnapshotPool<'_>], path: &Path) -> Result<()> {
    let bytes = snapshot_pickle(pools)?;
    std::fs::write(path, bytes).map_err(|e| Error::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}

impl Pool {
    /// This pool's memory_viz snapshot as pickle bytes: its segments and blocks now
    /// and, when [`PoolConfig::history_events`](crate::PoolConfig::history_events) is
    /// on, its recent events (`crate::viz` documents the format).
    ///
    /// Errors: as [`snapshot_pickle`].
    pub fn snapshot_pickle(&self) -> Result<Vec<u8>> {
        snapshot_pickle(&[SnapshotPool {
            pool: self,
            pool_id: (0, 0),
        }])
    }

    /// Writes [`Pool::snapshot_pickle`] to `path` (created or truncated): open it at
    /// `pytorch.org/memory_viz`, or render it with `torch.cuda._memory_viz`.
    ///
    /// Errors: [`Error::Io`] when the file cannot be written.
    pub fn dump_snapshot(&self, path: impl AsRef<Path>) -> Result<()> {
        write_snapshot(
            &[SnapshotPool {
                pool: self,
                pool_id: (0, 0),
            }],
            path.as_ref(),
        )
    }
}
