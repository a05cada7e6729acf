//! The shared library of the Python package `flare_package` (python/), built by
//! maturin as a cdylib: flare-package's C ABI, re-exported whole. A cdylib exports
//! the `#[no_mangle] extern "C"` functions of the crates it links, so linking
//! flare-package is all it takes; the Python package calls them through ctypes
//! (python/flare_package/__init__.py). `pyproject.toml` beside this crate says how
//! the wheel is laid out.

/// The library crate, linked whole into the cdylib so that its C ABI is exported.
pub use flare_package;
