//! The simulated driver reproduces the measured rows of `docs/vmm-semantics.md`:
//! the VMM calls, streams, events and captures, memsets, and its own contract.
#![cfg(not(flare_loom))] // the loom build runs tests/loom/ alone

#[path = "../common/mod.rs"]
mod common;

mod capture_queries;
mod memset;
mod vmm_rows;
