//! Thread caches on the simulated driver.
#![cfg(not(flare_loom))] // the loom build runs tests/loom/ alone

#[path = "../common/mod.rs"]
mod common;

mod caching;
