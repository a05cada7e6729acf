//! Tags on the simulated driver: the census, sleep and wake, the zeroing wake.
#![cfg(not(flare_loom))] // the loom build runs tests/loom/ alone

#[path = "../common/mod.rs"]
mod common;

mod census;
mod failing_driver_calls;
mod scopes_and_captures;
mod segment_tags;
mod sleep_and_wake;
mod sleep_in_flight;
mod sleep_refusals;
mod tag_heaps;
mod tagged_requests;
mod wake_refusals;
mod wake_zeroed;
