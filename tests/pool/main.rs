//! The pool's contracts on the simulated driver: each operation's contract, the
//! driver calls made outside the pool's lock, the refusal of a request larger than the
//! device, work in flight never unmapped, and many threads on one pool.
#![cfg(not(flare_loom))] // the loom build runs tests/loom/ alone

#[path = "../common/mod.rs"]
mod common;

mod best_fit;
mod configuration;
mod driver_calls_outside_the_lock;
mod forced_reuse;
mod gated;
mod growth_report;
mod guards;
mod history_ring;
mod many_threads;
mod memory_viz;
mod operation_contracts;
mod out_of_memory;
mod peer_release;
mod request_too_large;
mod retention_scope;
mod slot_recycling;
mod snapshot_invariants;
mod work_in_flight;
