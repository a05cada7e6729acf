//! The simulated driver reproduces the measured rows of `docs/vmm-semantics.md`:
//! the VMM calls, streams, events and captures, memsets, and its own contract.
#![cfg(not(flare_loom))] // the loom build runs tests/loom/ alone

#[path = "../common/mod.rs"]
mod common;

mod call_errors;
mod capacity_and_counts;
mod capture_queries;
mod contract_faults;
mod copies;
mod driver_trait;
mod injected_failures;
mod memset;
mod stream_capture;
mod streams_and_work;
mod vmm_rows;
mod work_in_flight;
