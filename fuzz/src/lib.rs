//! The fuzz targets' logic, shared by the binaries in `fuzz_targets/` (built and run
//! by `scripts/fuzz.sh`): [`c_abi`], the C ABI as sequences of calls on simulated
//! pools. The other targets are a few lines each, in their binaries.

pub mod c_abi;
