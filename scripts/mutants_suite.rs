//! Every CPU test file of tests/ as a module of one test binary, for
//! scripts/mutants.sh only (which writes this file): a mutant then rebuilds one test
//! crate instead of one per file. Built only with the `mutants-suite` feature.

#[path = "../tests/failure_classes.rs"]
mod failure_classes;
#[path = "../tests/fault_injection.rs"]
mod fault_injection;
#[path = "../tests/inflight_sim.rs"]
mod inflight_sim;
#[path = "../tests/lock_free_driver_calls.rs"]
mod lock_free_driver_calls;
#[path = "../tests/mutants_cover.rs"]
mod mutants_cover;
#[path = "../tests/mutants_pool.rs"]
mod mutants_pool;
#[path = "../tests/mutants_segments.rs"]
mod mutants_segments;
#[path = "../tests/mutants_sim.rs"]
mod mutants_sim;
#[path = "../tests/mutants_tags.rs"]
mod mutants_tags;
#[path = "../tests/pool_segments.rs"]
mod pool_segments;
#[path = "../tests/pool_sim.rs"]
mod pool_sim;
#[path = "../tests/pool_streams.rs"]
mod pool_streams;
#[path = "../tests/review_faults.rs"]
mod review_faults;
#[path = "../tests/review_segments.rs"]
mod review_segments;
#[path = "../tests/review_streams.rs"]
mod review_streams;
#[path = "../tests/review_threads.rs"]
mod review_threads;
#[path = "../tests/sim_semantics.rs"]
mod sim_semantics;
#[path = "../tests/sim_streams.rs"]
mod sim_streams;
#[path = "../tests/stream_lifetime.rs"]
mod stream_lifetime;
#[path = "../tests/stress.rs"]
mod stress;
#[path = "../tests/tags.rs"]
mod tags;
#[path = "../tests/thread_cache.rs"]
mod thread_cache;
#[path = "../tests/torch_abi.rs"]
mod torch_abi;
#[path = "../tests/trace_parse.rs"]
mod trace_parse;
#[path = "../tests/trace_record.rs"]
mod trace_record;
#[path = "../tests/trace_replay.rs"]
mod trace_replay;
#[path = "../tests/trace_tags.rs"]
mod trace_tags;
