//! Passes the loom switch on to rustdoc. `RUSTFLAGS="--cfg flare_loom"` reaches
//! rustc but not rustdoc, so without this the crate documentation's doctests would
//! be collected in the loom build and run against loom's locks outside a loom model
//! (which panics). Re-emitting the cfg from here gives it to both.

fn main() {
    // Only this file decides what the script prints (cfgs come from RUSTFLAGS, which
    // Cargo tracks itself): without this, any new file in the package reruns it.
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rustc-check-cfg=cfg(flare_loom)");
    if std::env::var_os("CARGO_CFG_FLARE_LOOM").is_some() {
        println!("cargo::rustc-cfg=flare_loom");
    }
}
