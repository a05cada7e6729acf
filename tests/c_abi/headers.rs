//! The three C headers, as cbindgen generates them from `src/ffi/` with
//! `cbindgen.toml` (shared by `header.rs`, which checks the committed ones, and
//! `abi.rs`, which records the ABI they declare).
//!
//! - `include/flare_package.h`: what engines use (pools, allocation, stream order,
//!   tags, snapshots, errors, the version);
//! - `include/flare_package_torch.h`: PyTorch's glue (`flare_torch_*`, the
//!   out-of-memory handler type), which the Python package calls through ctypes;
//! - `include/flare_package_sim.h`: the simulated backend's test hooks
//!   (`flare_sim_*`, `flare_torch_sim_*`, `flare_torch_use_simulated`, and
//!   `FlareDriverCall`, which only `flare_sim_inject_failure` takes).
//!
//! Each item belongs to one header by its name ([`header_of`]). Every header is
//! generated from the same sources, with cbindgen's `[export] exclude` naming the
//! items of the other headers (and `[export] include` only this header's), so an item
//! is declared once; the torch and sim headers `#include "flare_package.h"` for the
//! core types they use.
//!
//! cbindgen does not expand macros, and the C types are made by macros from the
//! crate's lists (`src/ffi/generate.rs`), so their Rust source, which the macros record
//! (`flare_package::ffi::cbindgen_sources`), is written to a file that cbindgen reads
//! too.
//!
//! The version macros come from Cargo.toml (`CARGO_PKG_VERSION_*`), set here in the
//! core header's `after_includes`: cbindgen.toml holds no version number.

use std::path::{Path, PathBuf};

/// The headers, in the order `FLARE_BLESS_HEADER=1` writes them.
pub const HEADERS: [Header; 3] = [Header::Core, Header::Torch, Header::Sim];

/// One of the generated headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Header {
    /// `flare_package.h`, what engines use.
    Core,
    /// `flare_package_torch.h`, PyTorch's glue.
    Torch,
    /// `flare_package_sim.h`, the simulated backend's test hooks.
    Sim,
}

impl Header {
    /// The file name, in `include/`.
    pub fn file_name(self) -> &'static str {
        match self {
            Header::Core => "flare_package.h",
            Header::Torch => "flare_package_torch.h",
            Header::Sim => "flare_package_sim.h",
        }
    }

    /// The committed header's path.
    pub fn path(self) -> PathBuf {
        root().join("include").join(self.file_name())
    }

    fn include_guard(self) -> &'static str {
        match self {
            Header::Core => "FLARE_PACKAGE_H",
            Header::Torch => "FLARE_PACKAGE_TORCH_H",
            Header::Sim => "FLARE_PACKAGE_SIM_H",
        }
    }

    /// The comment at the top (cbindgen's `header`); the core header's is
    /// cbindgen.toml's.
    fn top_comment(self) -> Option<&'static str> {
        match self {
            Header::Core => None,
            Header::Torch => Some(
                "/*\n * flare_package_torch.h: PyTorch's entry points of flare-package (the functions\n \
                 * CUDAPluggableAllocator and its hooks call, and the controls the Python package\n \
                 * calls through ctypes). Engines do not need it: see flare_package.h.\n \
                 * Includes flare_package.h; link as flare_package.h says.\n \
                 * SPDX-License-Identifier: MIT OR Apache-2.0\n */",
            ),
            Header::Sim => Some(
                "/*\n * flare_package_sim.h: the simulated backend's test hooks of flare-package (fault\n \
                 * and panic injection, simulated streams, captures and kernels, contract faults),\n \
                 * for tests only. Includes flare_package.h; link as flare_package.h says.\n \
                 * SPDX-License-Identifier: MIT OR Apache-2.0\n */",
            ),
        }
    }
}

/// The header an item of the C ABI (a function, type or constant, by its Rust name)
/// belongs to: the simulated backend's hooks, then PyTorch's glue, then the core.
pub fn header_of(name: &str) -> Header {
    if name.starts_with("flare_sim_")
        || name.starts_with("flare_torch_sim_")
        || name == "flare_torch_use_simulated"
        || name == "FlareDriverCall"
        || name == "RawDriverCall"
    {
        Header::Sim
    } else if name.starts_with("flare_torch_") || name.starts_with("FlareTorch") {
        Header::Torch
    } else {
        Header::Core
    }
}

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The generated C types' Rust source, in a file of its own (one per process: the
/// tests run in parallel).
fn generated_types_file() -> PathBuf {
    static FILE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    FILE.get_or_init(|| {
        let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("flare_ffi_types_{}.rs", std::process::id()));
        std::fs::write(&path, generated_types_source())
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        path
    })
    .clone()
}

fn generated_types_source() -> String {
    flare_package::ffi::cbindgen_sources().join("\n\n")
}

/// The names of the items a Rust source declares that cbindgen may export: `extern
/// "C"` (and `"C-unwind"`) functions, `pub struct`, `pub enum`, `pub type` and `pub
/// const` (a superset: a name cbindgen does not export is harmless in `exclude`).
pub fn item_names(source: &str) -> Vec<String> {
    let mut names = Vec::new();
    for (i, _) in source.match_indices("fn ") {
        let before = source[..i].trim_end();
        if before.ends_with("extern \"C\"") || before.ends_with("extern \"C-unwind\"") {
            names.push(identifier(&source[i + 3..]));
        }
    }
    for keyword in ["pub struct ", "pub enum ", "pub type ", "pub const "] {
        for (i, _) in source.match_indices(keyword) {
            names.push(identifier(&source[i + keyword.len()..]));
        }
    }
    names.retain(|n| !n.is_empty());
    names.sort();
    names.dedup();
    names
}

fn identifier(s: &str) -> String {
    s.trim_start()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every item name of `src/ffi/` and of the generated types ([`item_names`]).
pub fn all_item_names() -> Vec<String> {
    let mut files = Vec::new();
    rust_files(&root().join("src").join("ffi"), &mut files);
    let mut names: Vec<String> = files
        .iter()
        .flat_map(|f| {
            let text = std::fs::read_to_string(f)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", f.display()));
            item_names(&text)
        })
        .chain(item_names(&generated_types_source()))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The core header's version macros, from Cargo.toml's version.
pub fn version_macros() -> String {
    let (major, minor, patch) = (
        env!("CARGO_PKG_VERSION_MAJOR"),
        env!("CARGO_PKG_VERSION_MINOR"),
        env!("CARGO_PKG_VERSION_PATCH"),
    );
    format!(
        "\n/* The version of flare-package this header belongs to (Cargo.toml's version);\n   \
         flare_package_version() gives the library's, to compare at run time. */\n\
         #define FLARE_PACKAGE_VERSION_MAJOR {major}\n\
         #define FLARE_PACKAGE_VERSION_MINOR {minor}\n\
         #define FLARE_PACKAGE_VERSION_PATCH {patch}\n\
         /* MAJOR * 10000 + MINOR * 100 + PATCH, as flare_package_version() returns it. */\n\
         #define FLARE_PACKAGE_VERSION (FLARE_PACKAGE_VERSION_MAJOR * 10000 + \\\n    \
         FLARE_PACKAGE_VERSION_MINOR * 100 + FLARE_PACKAGE_VERSION_PATCH)\n\
         /* \"MAJOR.MINOR.PATCH\", as flare_package_version_string() returns it. */\n\
         #define FLARE_PACKAGE_VERSION_STRING \"{major}.{minor}.{patch}\""
    )
}

/// `header`'s text as cbindgen generates it.
pub fn generate(header: Header) -> String {
    let root = root();
    let mut config = cbindgen::Config::from_file(root.join("cbindgen.toml"))
        .unwrap_or_else(|e| panic!("cannot read cbindgen.toml: {e}"));
    let all = all_item_names();
    config
        .export
        .exclude
        .extend(all.into_iter().filter(|n| header_of(n) != header));
    config.export.include.retain(|n| header_of(n) == header);
    config.include_guard = Some(header.include_guard().to_string());
    match header {
        Header::Core => config.after_includes = Some(version_macros()),
        Header::Torch | Header::Sim => {
            config.header = header.top_comment().map(str::to_string);
            config.includes = vec![Header::Core.file_name().to_string()];
            config.after_includes = None;
        }
    }
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(root.join("src").join("ffi").join("mod.rs"))
        .with_src(generated_types_file())
        .generate()
        .unwrap_or_else(|e| panic!("cbindgen failed on src/ffi/: {e}"));
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).unwrap_or_else(|e| panic!("cbindgen wrote non-UTF-8: {e}"))
}

/// Every header's text, in [`HEADERS`] order, generated once per process.
pub fn generated() -> &'static [String; 3] {
    static ALL: std::sync::OnceLock<[String; 3]> = std::sync::OnceLock::new();
    ALL.get_or_init(|| HEADERS.map(generate))
}
