//! One memory_viz snapshot of the allocator (issue 38): the tensor pool's and every
//! graph pool's segments, each with its pool id, and their events merged in the order
//! the calls were made; `FLARE_TORCH_HISTORY` read.

#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;
use crate::{Backend, CuResult, SimConfig, Stream};
use serde_pickle::{DeOptions, HashableValue, Value};

const MIB: u64 = 1 << 20;

fn get<'a>(v: &'a Value, key: &str) -> &'a Value {
    match v {
        Value::Dict(d) => d.get(&HashableValue::String(key.into())).expect(key),
        _ => panic!("not a dict"),
    }
}

fn list(v: &Value) -> &[Value] {
    match v {
        Value::List(l) => l,
        _ => panic!("not a list"),
    }
}

fn int(v: &Value) -> i64 {
    match v {
        Value::I64(i) => *i,
        _ => panic!("not an int: {v:?}"),
    }
}

#[test]
fn history_events_come_from_the_environment() {
    let c = TorchConfig::from_lookup(|n| (n == "FLARE_TORCH_HISTORY").then(|| "5000".into()))
        .expect("valid");
    assert_eq!(c.history_events, 5000);
    let e = TorchConfig::from_lookup(|n| (n == "FLARE_TORCH_HISTORY").then(|| "many".into()))
        .expect_err("not a number");
    assert!(e.to_string().contains("FLARE_TORCH_HISTORY"), "{e}");
    assert_eq!(TorchConfig::default().history_events, 0);
}

#[test]
fn one_snapshot_holds_the_tensor_pool_and_every_graph_pool() {
    let a = TorchAllocator::new(TorchConfig {
        backend: Backend::Simulated(SimConfig::default()),
        history_events: 1000,
        ..TorchConfig::default()
    });
    let sim = a.sim_driver(0).expect("sim");
    let s = Stream(sim.stream_create().expect("stream"));
    let eager = a.alloc(MIB, 0, s).expect("eager");
    let id = (3, 0);
    a.begin_allocate_to_pool(0, id).expect("begin");
    assert!(sim
        .stream_begin_capture(s.0, crate::CaptureMode::Global)
        .is_success());
    let out = a.alloc(5 * MIB, 0, s).expect("in the capture");
    assert_eq!(sim.stream_end_capture(s.0), CuResult::SUCCESS);
    a.end_allocate_to_pool(0, id).expect("end");

    let v: Value =
        serde_pickle::value_from_slice(&a.snapshot_pickle().expect("pickle"), DeOptions::new())
            .expect("decodes");
    let segs = list(get(&v, "segments"));
    // The tensor pool's segment (the eager block) and the graph pool's (the capture's).
    let ids: Vec<Value> = segs
        .iter()
        .map(|s| get(s, "segment_pool_id").clone())
        .collect();
    assert_eq!(
        ids,
        vec![
            Value::Tuple(vec![Value::I64(0), Value::I64(0)]),
            Value::Tuple(vec![Value::I64(3), Value::I64(0)]),
        ]
    );
    let owner = |p: u64| {
        segs.iter()
            .find(|s| {
                let a = int(get(s, "address")) as u64;
                a <= p && p < a + int(get(s, "total_size")) as u64
            })
            .map(|s| get(s, "segment_pool_id").clone())
    };
    assert_eq!(
        owner(eager),
        Some(Value::Tuple(vec![Value::I64(0), Value::I64(0)]))
    );
    assert_eq!(
        owner(out),
        Some(Value::Tuple(vec![Value::I64(3), Value::I64(0)]))
    );
    // The trace: both pools' events, in call order: the eager block's, then the
    // capture's.
    let trace = list(&list(get(&v, "device_traces"))[0]);
    let allocs: Vec<i64> = trace
        .iter()
        .filter(|e| get(e, "action") == &Value::String("alloc".into()))
        .map(|e| int(get(e, "addr")))
        .collect();
    assert_eq!(allocs, vec![eager as i64, out as i64]);
    a.free(out, 0, s).expect("free");
    a.free(eager, 0, s).expect("free");
}
