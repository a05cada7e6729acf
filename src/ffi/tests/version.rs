//! `flare_package_version` and `flare_package_version_string` against Cargo.toml's
//! version (`CARGO_PKG_VERSION`, split here independently of `version.rs`).

use super::*;

#[test]
fn version_number_is_cargo_toml_version_encoded() {
    let parts: Vec<u32> = env!("CARGO_PKG_VERSION")
        .split(['.', '-', '+'])
        .take(3)
        .map(|p| p.parse().unwrap_or(u32::MAX))
        .collect();
    assert!(
        parts.len() == 3 && parts.iter().all(|&p| p < 100),
        "{parts:?}"
    );
    assert_eq!(
        flare_package_version(),
        parts[0] * 10000 + parts[1] * 100 + parts[2]
    );
    // 0.2.0 is 200 (the encoding's example in the header), and never 0.
    assert!(flare_package_version() >= 200);
}

#[test]
fn version_string_is_cargo_toml_version() {
    let s = flare_package_version_string();
    assert!(!s.is_null());
    // SAFETY: a static NUL-terminated string, by the function's contract.
    let text = unsafe { CStr::from_ptr(s) }.to_bytes();
    assert_eq!(text, env!("CARGO_PKG_VERSION").as_bytes());
    // Static storage: the same pointer every time.
    assert_eq!(flare_package_version_string(), s);
}

#[test]
fn version_components_and_their_encoding_take_every_digit() {
    use crate::ffi::version::{component, encode};
    // Several digits, so that each digit's place counts (Cargo.toml's 0.2.0 has one
    // digit each and cannot tell).
    assert_eq!(component("0"), 0);
    assert_eq!(component("7"), 7);
    assert_eq!(component("12"), 12);
    assert_eq!(component("99"), 99);
    assert_eq!(component("305"), 305);
    // zstd's encoding, each component in its own decimal places.
    assert_eq!(encode(0, 2, 0), 200);
    assert_eq!(encode(1, 2, 3), 10203);
    assert_eq!(encode(3, 0, 7), 30007);
    assert_eq!(encode(12, 34, 56), 123456);
}
