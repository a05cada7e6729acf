//! flare-trace v1: parsing and its checks, replay, recording, tags.
#![cfg(not(flare_loom))] // the loom build runs tests/loom/ alone

#[path = "../common/mod.rs"]
mod common;

mod figures;
mod growth;
mod parse_errors;
mod parse_time_checks;
mod recorded_lines;
mod recording_failures;
mod recording_replays;
mod recording_threads;
mod recording_writer;
mod replay;
mod tags;
