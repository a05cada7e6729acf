//! Every CPU test file of tests/ as a module of one test binary, for
//! scripts/mutants.sh only (which writes this file): a mutant then rebuilds one test
//! crate instead of one per file. Built only with the `mutants-suite` feature.

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
#[path = "../tests/review_faults.rs"]
mod review_faults;
#[path = "../tests/review_segments.rs"]
mod review_segments;
#[path = "../tests/review_streams.rs"]
mod review_streams;
#[path = "../tests/review_threads.rs"]
mod review_threads;
