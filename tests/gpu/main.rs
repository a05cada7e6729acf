//! The tests on the real CUDA driver. Every test that needs a GPU is ignored by default
//! (CI has no GPU); run them on the GPU machine with `--include-ignored`. Each fails
//! loudly without a GPU. The tests that use the GPU run one at a time
//! ([`one_at_a_time`]).
#![cfg(not(flare_loom))] // the loom build runs tests/loom/ alone

#[path = "../common/mod.rs"]
mod common;

mod cuda_driver;
mod many_threads;
mod one_at_a_time;
mod peer_release;
mod pool;
mod segments;
mod stream_lifetime;
mod streams;
mod tags;
mod wake_zeroed;
mod work_in_flight;
