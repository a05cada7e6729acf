//! The driver functions a source file calls, and the tests that every one the
//! backend calls is checked when libcuda is loaded.

/// Every CUDA driver function a Rust source file calls: the names after `sys::` that
/// start with `cu` and an upper-case letter (`sys::culib` is cudarc's loader, not a
/// driver function), sorted, each once. For the tests that check each symbol list
/// ([`REQUIRED_SYMBOLS`](crate::driver::cuda::REQUIRED_SYMBOLS), the benchmark baseline's) covers
/// every call, so that no call can hit cudarc's panic on a missing symbol.
pub fn driver_functions_called(source: &str) -> Vec<&str> {
    let mut names: Vec<&str> = source
        .match_indices("sys::cu")
        .filter_map(|(at, _)| {
            let rest = &source[at + "sys::".len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            let name = &rest[..end];
            name.chars()
                .nth(2)
                .is_some_and(|c| c.is_ascii_uppercase())
                .then_some(name)
        })
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use super::driver_functions_called;
    use crate::driver::cuda::{CAPTURE_INFO_SYMBOLS, REQUIRED_SYMBOLS};

    fn backend_calls() -> Vec<&'static str> {
        let mut backend = Vec::new();
        for source in [
            include_str!("../mod.rs"),
            include_str!("../context.rs"),
            include_str!("../conversions.rs"),
            include_str!("../open.rs"),
            include_str!("../trait_impl.rs"),
            include_str!("mod.rs"),
            include_str!("graphs.rs"),
            include_str!("kernels.rs"),
            include_str!("memory.rs"),
            include_str!("streams.rs"),
            include_str!("symbols.rs"),
        ] {
            backend.extend(driver_functions_called(source));
        }
        backend
    }

    #[test]
    fn every_driver_function_called_is_checked_at_load() {
        let backend = backend_calls();
        // The scan itself works: these calls are in these files.
        for known in [
            "cuMemCreate",
            "cuCtxSynchronize",
            "cuLaunchKernel",
            "cuEventQuery",
            "cuStreamGetCaptureInfo_v3",
        ] {
            assert!(backend.contains(&known), "scan missed {known}: {backend:?}");
        }
        for name in &backend {
            assert!(
                REQUIRED_SYMBOLS.contains(name) || CAPTURE_INFO_SYMBOLS.contains(name),
                "the CUDA backend calls {name}, which neither REQUIRED_SYMBOLS nor \
                 CAPTURE_INFO_SYMBOLS checks"
            );
        }
    }

    /// The load check demands nothing the backend does not call: a listed symbol
    /// that nothing calls would only make `CudaDriver::new` fail on a driver without
    /// it, for no use.
    #[test]
    fn every_symbol_checked_at_load_is_called() {
        let backend = backend_calls();
        for name in REQUIRED_SYMBOLS.iter().chain(&CAPTURE_INFO_SYMBOLS) {
            assert!(
                backend.contains(name),
                "{name} is checked at load, but the CUDA backend never calls it"
            );
        }
    }
}
