//! The C ABI's stability, made checkable: the committed record `abi/flare_package.abi`
//! (`abi_record.rs` says what it holds and how it is measured) must be the ABI this
//! tree builds, at Cargo.toml's version, and every change from it must come with the
//! version bump it needs.
//!
//! The rule (also in docs/c-guide.md, "ABI stability"). The shared library's soname is
//! `libflare_package.so.MAJOR` (`.so.0` for every 0.y: cargo-c's
//! `version_suffix_components = 1`), so within one MAJOR a program built against an
//! older header must keep working with a newer library:
//! - an incompatible change (a function removed or its signature changed, a struct's
//!   field moved, resized, retyped or removed, a struct shrunk or a non-versioned
//!   struct grown, an alignment changed, an enum value renumbered or removed, a
//!   typedef or constant changed) needs a new MAJOR (0.y -> 1.0.0: within 0.y, y counts
//!   as the minor here, not as cargo's breaking component);
//! - an additive change (a new function, type, constant or enum value, a new field
//!   appended to a `struct_size`-versioned struct) needs at least a new MINOR;
//! - a PATCH bump changes nothing in the ABI.
//!
//! The test fails when the ABI differs from the record while Cargo.toml's version is
//! the record's (bump the version, then re-record), when Cargo.toml's version differs
//! from the record's (re-record), and when the bump is smaller than the changes need
//! (re-recording is refused then). Re-record with:
//!
//! ```sh
//! FLARE_BLESS_ABI=1 cargo test --test c_abi abi
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::abi_record::{current, format, parse};
use crate::headers::root;

const BLESS_VAR: &str = "FLARE_BLESS_ABI";

fn record_path() -> PathBuf {
    root().join("abi").join("flare_package.abi")
}

/// How large a version bump a change needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Needs {
    /// An additive change: a new MINOR.
    Minor,
    /// An incompatible change: a new MAJOR.
    Major,
}

/// One difference between the record and the current ABI.
#[derive(Debug)]
struct Change {
    needs: Needs,
    text: String,
}

/// `struct X.field` -> `X`, `struct X` -> `X` (for struct keys only).
fn struct_of(key: &str) -> Option<&str> {
    let rest = key.strip_prefix("struct ")?;
    Some(rest.split('.').next().unwrap_or(rest))
}

/// A `size N ...` or `offset N ...` value's number after `word`.
fn number_after(value: &str, word: &str) -> Option<u64> {
    let mut words = value.split_whitespace();
    while let Some(w) = words.next() {
        if w == word {
            return words.next()?.parse().ok();
        }
    }
    None
}

/// Every difference from `old` to `new`, with the bump each needs.
fn changes(old: &BTreeMap<String, String>, new: &BTreeMap<String, String>) -> Vec<Change> {
    let versioned = |s: &str| old.contains_key(&format!("struct {s}.struct_size"));
    let old_size = |s: &str| {
        old.get(&format!("struct {s}"))
            .and_then(|v| number_after(v, "size"))
    };
    let mut out = Vec::new();
    for (key, was) in old {
        match new.get(key) {
            None => out.push(Change {
                needs: Needs::Major,
                text: format!("removed: {key}: {was}"),
            }),
            Some(now) if now != was => {
                // A versioned struct may grow, keeping its alignment.
                let grown = key.starts_with("struct ")
                    && !key.contains('.')
                    && struct_of(key).is_some_and(versioned)
                    && number_after(now, "size") > number_after(was, "size")
                    && number_after(now, "align") == number_after(was, "align");
                out.push(Change {
                    needs: if grown { Needs::Minor } else { Needs::Major },
                    text: format!("changed: {key}: {was} -> {now}"),
                });
            }
            Some(_) => {}
        }
    }
    for (key, now) in new {
        if old.contains_key(key) {
            continue;
        }
        // A new field of an existing struct: additive only when appended (past the
        // old end) to a versioned struct.
        let needs = match (struct_of(key), key.contains('.')) {
            (Some(s), true) if old_size(s).is_some() => {
                let appended = versioned(s)
                    && number_after(now, "offset")
                        .zip(old_size(s))
                        .is_some_and(|(offset, size)| offset >= size);
                if appended {
                    Needs::Minor
                } else {
                    Needs::Major
                }
            }
            _ => Needs::Minor,
        };
        out.push(Change {
            needs,
            text: format!("added: {key}: {now}"),
        });
    }
    out
}

fn parse_version(v: &str) -> (u64, u64, u64) {
    let mut parts = v.split('.').map(|p| {
        p.parse::<u64>()
            .unwrap_or_else(|_| panic!("version {v} is not MAJOR.MINOR.PATCH"))
    });
    let mut next = || {
        parts
            .next()
            .unwrap_or_else(|| panic!("version {v} is not MAJOR.MINOR.PATCH"))
    };
    (next(), next(), next())
}

/// Why the changes from the record at `old_version` to the ABI at `new_version` are
/// not allowed, if they are not.
fn refusal(old_version: &str, new_version: &str, changes: &[Change]) -> Option<String> {
    let (old, new) = (parse_version(old_version), parse_version(new_version));
    let needs = changes.iter().map(|c| c.needs).max();
    let list = || {
        changes
            .iter()
            .map(|c| format!("  [{:?}] {}", c.needs, c.text))
            .collect::<Vec<_>>()
            .join("\n")
    };
    if new < old {
        return Some(format!(
            "Cargo.toml's version {new_version} is older than the ABI record's {old_version}"
        ));
    }
    let ok = match needs {
        None => true,
        Some(Needs::Minor) => new.0 > old.0 || (new.0 == old.0 && new.1 > old.1),
        Some(Needs::Major) => new.0 > old.0,
    };
    if ok {
        return None;
    }
    Some(if new == old {
        format!(
            "the C ABI differs from abi/flare_package.abi while Cargo.toml's version is still \
             the record's ({old_version}):\n{}\nBump the version ({}) and re-record with \
             {BLESS_VAR}=1 cargo test --test c_abi abi",
            list(),
            if needs == Some(Needs::Major) {
                "a new MAJOR: an incompatible change"
            } else {
                "at least a new MINOR: an additive change"
            }
        )
    } else {
        format!(
            "the C ABI changes incompatibly from {old_version} to {new_version}, which keeps \
             MAJOR {} (the soname libflare_package.so.{}): a caller built against the \
             {old_version} header would break. Incompatible changes need a new MAJOR, \
             additive ones a new MINOR:\n{}\nBump the version accordingly and re-record \
             with {BLESS_VAR}=1 cargo test --test c_abi abi",
            old.0,
            old.0,
            list()
        )
    })
}

#[test]
fn abi_record_is_current_and_version_bumps_cover_its_changes() {
    let version = env!("CARGO_PKG_VERSION");
    let now = current();
    let path = record_path();
    let recorded = std::fs::read_to_string(&path).ok().map(|t| parse(&t));
    let bless = std::env::var_os(BLESS_VAR).is_some_and(|v| !v.is_empty() && v != "0");
    if let Some((old_version, old)) = &recorded {
        if let Some(why) = refusal(old_version, version, &changes(old, &now)) {
            panic!("{why}");
        }
    }
    if bless {
        std::fs::create_dir_all(path.parent().unwrap_or(&root()))
            .unwrap_or_else(|e| panic!("cannot create abi/: {e}"));
        std::fs::write(&path, format(version, &now))
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        eprintln!("wrote {}", path.display());
        return;
    }
    let Some((old_version, old)) = recorded else {
        panic!(
            "cannot read {}: record it with {BLESS_VAR}=1 cargo test --test c_abi abi",
            path.display()
        );
    };
    let diff = changes(&old, &now);
    assert!(
        old_version == version && diff.is_empty(),
        "abi/flare_package.abi records {old_version}, Cargo.toml is at {version}; the changes \
         (allowed by that bump):\n{}\nRe-record with {BLESS_VAR}=1 cargo test --test c_abi abi",
        diff.iter()
            .map(|c| format!("  [{:?}] {}", c.needs, c.text))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// The rule itself, on the current ABI with one change made by hand each: what each
/// change needs, and which bumps the test accepts for it.
#[test]
fn each_kind_of_change_needs_its_bump() {
    let base = current();
    let with = |f: &dyn Fn(&mut BTreeMap<String, String>)| {
        let mut m = base.clone();
        f(&mut m);
        changes(&base, &m)
    };
    let needs = |c: &[Change]| c.iter().map(|c| c.needs).max();
    let field = "struct FlareSnapshot.allocations";
    let snapshot_size = number_after(&base["struct FlareSnapshot"], "size").unwrap_or(0);
    assert!(snapshot_size >= 472, "{}", base["struct FlareSnapshot"]);
    // A field moved.
    let moved = with(&|m| {
        let v = m[field].replace("offset ", "offset 1");
        m.insert(field.to_string(), v);
    });
    assert_eq!(needs(&moved), Some(Needs::Major), "{moved:?}");
    // A field appended to a versioned struct that grows.
    let appended = with(&|m| {
        m.insert(
            "struct FlareSnapshot.new_counter".to_string(),
            format!("offset {snapshot_size} size 8 type uint64_t"),
        );
        m.insert(
            "struct FlareSnapshot".to_string(),
            format!("size {} align 8", snapshot_size + 8),
        );
    });
    assert_eq!(needs(&appended), Some(Needs::Minor), "{appended:?}");
    // A struct shrunk; a function removed, added, changed; an enum value added,
    // renumbered.
    let shrunk = with(&|m| {
        m.insert(
            "struct FlareSnapshot".to_string(),
            "size 8 align 8".to_string(),
        );
    });
    assert_eq!(needs(&shrunk), Some(Needs::Major));
    let removed = with(&|m| {
        m.remove("fn flare_pool_trim");
    });
    assert_eq!(needs(&removed), Some(Needs::Major));
    let added = with(&|m| {
        m.insert(
            "fn flare_pool_new".to_string(),
            "void flare_pool_new(void)".to_string(),
        );
    });
    assert_eq!(needs(&added), Some(Needs::Minor));
    let retyped = with(&|m| {
        m.insert(
            "fn flare_pool_trim".to_string(),
            "FlareStatus flare_pool_trim(const FlarePool *)".to_string(),
        );
    });
    assert_eq!(needs(&retyped), Some(Needs::Major));
    let new_value = with(&|m| {
        m.insert(
            "enum FlareStatus.FLARE_STATUS_NEW".to_string(),
            "99".to_string(),
        );
    });
    assert_eq!(needs(&new_value), Some(Needs::Minor));
    let renumbered = with(&|m| {
        m.insert(
            "enum FlareStatus.FLARE_STATUS_SUCCESS".to_string(),
            "7".to_string(),
        );
    });
    assert_eq!(needs(&renumbered), Some(Needs::Major));
    // Which bumps each accepts.
    assert!(refusal("0.2.0", "0.2.0", &[]).is_none());
    assert!(refusal("0.2.0", "0.2.1", &[]).is_none());
    assert!(refusal("0.2.0", "0.2.0", &added).is_some());
    assert!(refusal("0.2.0", "0.2.1", &added).is_some());
    assert!(refusal("0.2.0", "0.3.0", &added).is_none());
    assert!(refusal("0.2.0", "0.3.0", &moved).is_some());
    assert!(refusal("0.2.0", "1.0.0", &moved).is_none());
    assert!(refusal("1.4.2", "1.5.0", &appended).is_none());
    assert!(refusal("0.2.0", "0.1.9", &[]).is_some());
    let message = refusal("0.2.0", "0.2.0", &moved).unwrap_or_default();
    assert!(
        message.contains("changed: struct FlareSnapshot.allocations")
            && message.contains("Bump the version")
            && message.contains(BLESS_VAR),
        "{message}"
    );
}
