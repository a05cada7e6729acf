//! Segment mode on the simulated driver: blocks carved from segments, split and
//! coalesced, handles released whole, stream order per heap.
#![cfg(not(flare_loom))] // the loom build runs tests/loom/ alone

#[path = "../common/mod.rs"]
mod common;

mod blocks_and_handles;
mod growth;
mod lending;
mod pools;
mod release;
mod requests;
mod retreat;
mod stream_heaps;
