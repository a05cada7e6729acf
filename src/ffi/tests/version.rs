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
