//! Driver failures: one regression test per failure class, and random operations
//! with random driver failures injected (a property test).
#![cfg(not(flare_loom))] // the loom build runs tests/loom/ alone

#[path = "../common/mod.rs"]
mod common;

mod failure_classes;
mod random_failures;
mod refused_releases;
