//! The C ABI's argument checks: the input as a sequence of C calls on simulated
//! pools, each checked against the header's promises (`flare_fuzz::c_abi`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| flare_fuzz::c_abi::run(data));
