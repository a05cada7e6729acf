//! Build script of flare-package:
//! - passes the loom switch on to rustdoc. `RUSTFLAGS="--cfg flare_loom"` reaches
//!   rustc but not rustdoc, so without this the crate documentation's doctests would
//!   be collected in the loom build and run against loom's locks outside a loom model
//!   (which panics). Re-emitting the cfg from here gives it to both;
//! - writes the CMake package files (`OUT_DIR/cmake/`, from `cmake/*.cmake.in`) with
//!   Cargo.toml's version, which `cargo cinstall` installs
//!   (`[package.metadata.capi.install.data]` in Cargo.toml).

use std::path::PathBuf;

const TEMPLATES: [&str; 2] = [
    "flare_package-config.cmake",
    "flare_package-config-version.cmake",
];

fn main() {
    // Only these files decide what the script prints (cfgs come from RUSTFLAGS, which
    // Cargo tracks itself): without this, any new file in the package reruns it.
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rustc-check-cfg=cfg(flare_loom)");
    if std::env::var_os("CARGO_CFG_FLARE_LOOM").is_some() {
        println!("cargo::rustc-cfg=flare_loom");
    }

    let major = env("CARGO_PKG_VERSION_MAJOR");
    let version = env("CARGO_PKG_VERSION");
    let minor = env("CARGO_PKG_VERSION_MINOR");
    let next_minor = minor
        .parse::<u64>()
        .map(|m| (m + 1).to_string())
        .unwrap_or_else(|e| panic!("CARGO_PKG_VERSION_MINOR {minor:?}: {e}"));
    let out = PathBuf::from(env("OUT_DIR")).join("cmake");
    std::fs::create_dir_all(&out).unwrap_or_else(|e| panic!("{}: {e}", out.display()));
    for name in TEMPLATES {
        let template = PathBuf::from("cmake").join(format!("{name}.in"));
        println!("cargo::rerun-if-changed={}", template.display());
        let text = std::fs::read_to_string(&template)
            .unwrap_or_else(|e| panic!("{}: {e}", template.display()));
        let text = text
            .replace("@VERSION@", &version)
            .replace("@MAJOR@", &major)
            .replace("@MINOR@", &minor)
            .replace("@NEXT_MINOR@", &next_minor)
            .replace("@PATCH@", &env("CARGO_PKG_VERSION_PATCH"));
        let path = out.join(name);
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|e| panic!("{name}: {e}"))
}
