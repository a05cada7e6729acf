//! The C ABI as a record (`abi/flare_package.abi`, compared by `abi.rs`): what the
//! generated headers declare, with the layouts and values a C compiler gives them.
//!
//! The headers ([`crate::headers::generated`]) give the names: every function with
//! its C signature, every struct with its fields' names and types, every enum's
//! enumerators, typedefs, opaque types and `#define` constants. A C probe, compiled
//! with `cc` against the three headers and run, gives the real layouts and values:
//! `sizeof`/`_Alignof` of each struct, typedef and enum, `offsetof` and `sizeof` of
//! each field, each enumerator's and constant's value. So a layout change shows even
//! where the header's text would not tell it (a field's type changed behind a typedef,
//! an alignment).
//!
//! The record is one line per fact, `KEY: VALUE`, sorted by key:
//!
//! ```text
//! const FLARE_THREAD_CACHE_OFF: 4294967295
//! enum FlareStatus: size 4
//! enum FlareStatus.FLARE_STATUS_SUCCESS: 0
//! fn flare_pool_trim: FlareStatus flare_pool_trim(FlarePool *pool)
//! opaque FlarePool: incomplete
//! struct FlarePoolConfig: size 104 align 8
//! struct FlarePoolConfig.device: offset 8 size 4 type int32_t
//! typedef FlareStream: size 8 void *FlareStream
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use crate::headers::{generated, HEADERS};

/// One C declaration of the headers.
#[derive(Debug)]
enum Decl {
    Function {
        name: String,
        signature: String,
    },
    Struct {
        name: String,
        fields: Vec<(String, String)>,
    },
    Enum {
        name: String,
        enumerators: Vec<String>,
    },
    Opaque {
        name: String,
    },
    Typedef {
        name: String,
        text: String,
    },
}

/// `text` with its `/* */` and `//` comments left out (a header's, for the ABI
/// record and the header check).
pub(crate) fn without_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("/*") {
        out.push_str(&rest[..start]);
        match rest[start..].find("*/") {
            Some(end) => rest = &rest[start + end + 2..],
            None => return out,
        }
    }
    out.push_str(rest);
    out.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whitespace collapsed, `struct `/`enum ` tags dropped, no space before `;`, `,`,
/// `)` or after `(`.
fn normalized(text: &str) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    flat.replace("struct ", "")
        .replace("enum ", "")
        .replace(" ;", ";")
        .replace(" ,", ",")
        .replace(" )", ")")
        .replace("( ", "(")
}

/// The last identifier of `s` (a declarator's name).
fn last_identifier(s: &str) -> String {
    let tail: String = s
        .chars()
        .rev()
        .skip_while(|c| !(c.is_alphanumeric() || *c == '_'))
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    tail.chars().rev().collect()
}

/// The `#define NAME VALUE` constants of a header (the include guards, which have no
/// value, and the version macros, which change with every version, left out), and its
/// code with every preprocessor line and the `#ifdef __cplusplus` blocks left out.
fn split_preprocessor(header: &str) -> (Vec<String>, String) {
    let mut defines = Vec::new();
    let mut code = String::new();
    let mut in_cplusplus = false;
    let mut continued = false;
    for line in header.lines() {
        let t = line.trim();
        if continued {
            continued = t.ends_with('\\');
            continue;
        }
        if t.starts_with("#ifdef __cplusplus") {
            in_cplusplus = true;
        } else if in_cplusplus {
            in_cplusplus = !t.starts_with("#endif");
        } else if let Some(rest) = t.strip_prefix('#') {
            continued = t.ends_with('\\');
            let mut words = rest.split_whitespace();
            if words.next() == Some("define") {
                let name = words.next().unwrap_or("");
                if words.next().is_some() && !name.starts_with("FLARE_PACKAGE_VERSION") {
                    defines.push(name.to_string());
                }
            }
        } else {
            code.push_str(line);
            code.push('\n');
        }
    }
    (defines, code)
}

/// The declarations of a header's code: its top-level statements.
fn declarations(code: &str) -> Vec<Decl> {
    let mut statements = Vec::new();
    let mut current = String::new();
    let mut depth = 0usize;
    for c in code.chars() {
        current.push(c);
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ';' if depth == 0 => {
                statements.push(normalized(&current));
                current.clear();
            }
            _ => {}
        }
    }
    assert!(
        normalized(&current).is_empty(),
        "unparsed header text: {current}"
    );
    statements.iter().map(|s| declaration(s)).collect()
}

fn declaration(s: &str) -> Decl {
    let body = |s: &str| -> (String, String) {
        let open = s.find('{').unwrap_or_else(|| panic!("no body in `{s}`"));
        let close = s.rfind('}').unwrap_or_else(|| panic!("no body in `{s}`"));
        (s[open + 1..close].to_string(), last_identifier(&s[close..]))
    };
    if s.starts_with("typedef") && s.contains('{') {
        let (inside, name) = body(s);
        let items: Vec<&str> = inside
            .split([';', ','])
            .map(str::trim)
            .filter(|i| !i.is_empty())
            .collect();
        if items.iter().all(|i| i.contains('=')) {
            let enumerators = items
                .iter()
                .map(|i| i.split('=').next().unwrap_or("").trim().to_string())
                .collect();
            Decl::Enum { name, enumerators }
        } else {
            let fields = items
                .iter()
                .map(|i| {
                    assert!(
                        !i.contains('['),
                        "array field `{i}`: the probe cannot size it"
                    );
                    let name = last_identifier(i);
                    let ty = i[..i.len() - name.len()].trim().to_string();
                    (name, ty)
                })
                .collect();
            Decl::Struct { name, fields }
        }
    } else if let Some(rest) = s.strip_prefix("typedef ") {
        let rest = rest.trim_end_matches(';');
        let words: Vec<&str> = rest.split_whitespace().collect();
        if words.len() == 2 && words[0] == words[1] {
            Decl::Opaque {
                name: words[1].to_string(),
            }
        } else {
            let name = match rest.find("(*") {
                Some(i) => {
                    last_identifier(&rest[..rest[i..].find(')').map_or(rest.len(), |j| i + j)])
                }
                None => last_identifier(rest),
            };
            Decl::Typedef {
                name,
                text: rest.to_string(),
            }
        }
    } else {
        let open = s
            .find('(')
            .unwrap_or_else(|| panic!("not a declaration: `{s}`"));
        let close = s
            .rfind(')')
            .unwrap_or_else(|| panic!("not a declaration: `{s}`"));
        assert!(
            !s[open + 1..close].contains('('),
            "a function pointer parameter in `{s}`: give it a typedef"
        );
        // The parameters' names are not the ABI: each parameter is its type.
        let params: Vec<String> = s[open + 1..close]
            .split(',')
            .map(|p| {
                let p = p.trim();
                match p {
                    "void" | "" => p.to_string(),
                    _ => p[..p.len() - last_identifier(p).len()].trim().to_string(),
                }
            })
            .collect();
        Decl::Function {
            name: last_identifier(&s[..open]),
            signature: format!("{}({})", &s[..open], params.join(", ")),
        }
    }
}

/// The C probe's source: prints `KEY: VALUE` lines of sizes, offsets and values.
fn probe_source(decls: &[Decl], defines: &[String]) -> String {
    let mut c = String::from("#include <stddef.h>\n#include <stdio.h>\n");
    for h in HEADERS {
        c.push_str(&format!("#include \"{}\"\n", h.file_name()));
    }
    c.push_str("#define P(...) printf(__VA_ARGS__)\nint main(void) {\n");
    for d in decls {
        match d {
            Decl::Struct { name, fields } => {
                c.push_str(&format!(
                    "P(\"struct {name}: size %zu align %zu\\n\", sizeof({name}), _Alignof({name}));\n"
                ));
                for (f, ty) in fields {
                    c.push_str(&format!(
                        "P(\"struct {name}.{f}: offset %zu size %zu type {ty}\\n\", \
                         offsetof({name}, {f}), sizeof((({name} *)0)->{f}));\n"
                    ));
                }
            }
            Decl::Enum { name, enumerators } => {
                c.push_str(&format!(
                    "P(\"enum {name}: size %zu\\n\", sizeof({name}));\n"
                ));
                for e in enumerators {
                    c.push_str(&format!(
                        "P(\"enum {name}.{e}: %lld\\n\", (long long){e});\n"
                    ));
                }
            }
            Decl::Typedef { name, text } => c.push_str(&format!(
                "P(\"typedef {name}: size %zu {text}\\n\", sizeof({name}));\n"
            )),
            Decl::Opaque { name } => c.push_str(&format!("P(\"opaque {name}: incomplete\\n\");\n")),
            Decl::Function { .. } => {}
        }
    }
    for name in defines {
        c.push_str(&format!(
            "P(\"const {name}: %llu\\n\", (unsigned long long)({name}));\n"
        ));
    }
    c.push_str("return 0;\n}\n");
    c
}

/// Compiles and runs `source` with `cc` against the generated headers (written to a
/// directory of their own), returns its output.
fn run_probe(source: &str) -> String {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("abi_probe_{}", std::process::id()));
    let include = dir.join("include");
    std::fs::create_dir_all(&include)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", include.display()));
    for (h, text) in HEADERS.iter().zip(generated()) {
        std::fs::write(include.join(h.file_name()), text)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", h.file_name()));
    }
    let src = dir.join("abi_probe.c");
    let exe = dir.join("abi_probe");
    std::fs::write(&src, source).unwrap_or_else(|e| panic!("cannot write {}: {e}", src.display()));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let out = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Werror", "-I"])
        .arg(&include)
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cc} (the ABI probe needs a C compiler): {e}"));
    assert!(
        out.status.success(),
        "the ABI probe {} does not compile:\n{}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", exe.display()));
    assert!(run.status.success(), "the ABI probe failed");
    let _ = std::fs::remove_dir_all(&dir);
    String::from_utf8(run.stdout).unwrap_or_else(|e| panic!("probe wrote non-UTF-8: {e}"))
}

/// The C ABI of the generated headers (as this tree generates them, not as
/// committed: `header.rs` checks those are the same), as `KEY -> VALUE`; measured
/// once per process.
pub fn current() -> BTreeMap<String, String> {
    static RECORD: std::sync::OnceLock<BTreeMap<String, String>> = std::sync::OnceLock::new();
    RECORD.get_or_init(measure).clone()
}

fn measure() -> BTreeMap<String, String> {
    let mut decls = Vec::new();
    let mut defines = Vec::new();
    for text in generated() {
        let (d, code) = split_preprocessor(&without_comments(text));
        defines.extend(d);
        decls.extend(declarations(&code));
    }
    let mut record = BTreeMap::new();
    for d in &decls {
        if let Decl::Function { name, signature } = d {
            let previous = record.insert(format!("fn {name}"), signature.clone());
            assert!(previous.is_none(), "{name} declared twice");
        }
    }
    for line in run_probe(&probe_source(&decls, &defines)).lines() {
        let (key, value) = line
            .split_once(": ")
            .unwrap_or_else(|| panic!("probe line without `: `: {line}"));
        let previous = record.insert(key.to_string(), value.to_string());
        assert!(previous.is_none(), "{key} twice in the ABI");
    }
    record
}

/// The record's text: a comment, the version, then the facts.
pub fn format(version: &str, record: &BTreeMap<String, String>) -> String {
    let mut out = String::from(
        "# The C ABI of flare-package (include/flare_package*.h), checked by tests/c_abi/abi.rs:\n\
         # every function's C signature; every struct's size, alignment and fields (offset, size,\n\
         # type); every enum's size and values; typedefs and constants, as cc lays them out.\n\
         # Re-record (after a version bump) with: FLARE_BLESS_ABI=1 cargo test --test c_abi abi\n",
    );
    out.push_str(&format!("version: {version}\n"));
    for (k, v) in record {
        out.push_str(&format!("{k}: {v}\n"));
    }
    out
}

/// A record's text parsed back: its version and facts.
pub fn parse(text: &str) -> (String, BTreeMap<String, String>) {
    let mut version = String::new();
    let mut record = BTreeMap::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (k, v) = line
            .split_once(": ")
            .unwrap_or_else(|| panic!("ABI record line without `: `: {line}"));
        if k == "version" {
            version = v.to_string();
        } else {
            record.insert(k.to_string(), v.to_string());
        }
    }
    (version, record)
}
