//! Tags on the simulated driver: the census, sleep and wake, the zeroing wake.
#![cfg(not(flare_loom))] // the loom build runs tests/loom/ alone

#[path = "../common/mod.rs"]
mod common;

mod sleep_and_wake;
mod wake_zeroed;
