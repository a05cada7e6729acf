//! Stream order on the simulated driver: stream-ordered allocation and free, fences,
//! cross-stream reuse, captures, and a stream's end.
#![cfg(not(flare_loom))] // the loom build runs tests/loom/ alone

#[path = "../common/mod.rs"]
mod common;

mod captures;
mod cross_stream_reuse;
mod destroyed_streams;
mod failed_fences;
mod fence_release;
mod record_stream;
mod scope_barrier;
mod stream_lifetime;
mod stream_order;
