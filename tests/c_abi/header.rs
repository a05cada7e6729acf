//! The committed C headers (`include/flare_package.h`, `flare_package_torch.h`,
//! `flare_package_sim.h`) must be exactly what cbindgen generates from the module
//! `src/ffi/` with `cbindgen.toml` (`headers.rs` says how, and which item goes to
//! which header), and must declare the contract.
//!
//! Regenerate all three with:
//!
//! ```sh
//! FLARE_BLESS_HEADER=1 cargo test --test c_abi header
//! ```

use crate::abi_record::without_comments;
use crate::headers::{self, generated, header_of, Header, HEADERS};

const BLESS_VAR: &str = "FLARE_BLESS_HEADER";

fn first_difference(a: &str, b: &str) -> String {
    for (i, (la, lb)) in a.lines().zip(b.lines()).enumerate() {
        if la != lb {
            return format!(
                "first difference at line {}:\n  committed: {la}\n  generated: {lb}",
                i + 1
            );
        }
    }
    format!(
        "one is a prefix of the other ({} vs {} lines)",
        a.lines().count(),
        b.lines().count()
    )
}

#[test]
fn committed_headers_are_what_cbindgen_generates() {
    let bless = std::env::var_os(BLESS_VAR).is_some_and(|v| !v.is_empty() && v != "0");
    let mut stale = Vec::new();
    for (header, generated) in HEADERS.iter().zip(generated()) {
        let path = header.path();
        if bless {
            std::fs::write(&path, generated)
                .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
            eprintln!("wrote {}", path.display());
            continue;
        }
        match std::fs::read_to_string(&path) {
            Ok(committed) if committed == *generated => {}
            Ok(committed) => stale.push(format!(
                "{} is stale: it is not what cbindgen generates from src/ffi/ and cbindgen.toml.\n{}",
                path.display(),
                first_difference(&committed, generated)
            )),
            Err(e) => stale.push(format!("cannot read {}: {e}", path.display())),
        }
    }
    assert!(
        stale.is_empty(),
        "{}\nRegenerate them with: {BLESS_VAR}=1 cargo test --test c_abi header  (then review and commit them)",
        stale.join("\n")
    );
}

fn define(header: &str, name: &str) -> Option<String> {
    header.lines().find_map(|l| {
        let mut words = l.split_whitespace();
        (words.next() == Some("#define") && words.next() == Some(name))
            .then(|| words.next().unwrap_or("").to_string())
    })
}

#[test]
fn version_macros_match_cargo_toml() {
    // Checked on the generated text and on the committed header: the macros are made
    // from CARGO_PKG_VERSION_* (headers::version_macros), so a version bump without
    // regenerating the header fails here.
    for header in [
        generate_core(),
        std::fs::read_to_string(Header::Core.path()).unwrap_or_default(),
    ] {
        for (name, want) in [
            (
                "FLARE_PACKAGE_VERSION_MAJOR",
                env!("CARGO_PKG_VERSION_MAJOR"),
            ),
            (
                "FLARE_PACKAGE_VERSION_MINOR",
                env!("CARGO_PKG_VERSION_MINOR"),
            ),
            (
                "FLARE_PACKAGE_VERSION_PATCH",
                env!("CARGO_PKG_VERSION_PATCH"),
            ),
            (
                "FLARE_PACKAGE_VERSION_STRING",
                &format!("\"{}\"", env!("CARGO_PKG_VERSION")),
            ),
        ] {
            assert_eq!(
                define(&header, name).as_deref(),
                Some(want),
                "{name} in the header must be Cargo.toml's {want}: run \
                 {BLESS_VAR}=1 cargo test --test c_abi header"
            );
        }
        // cbindgen.toml holds no number of its own.
        let toml =
            std::fs::read_to_string(headers::root().join("cbindgen.toml")).unwrap_or_default();
        assert!(
            !toml.contains("#define FLARE_PACKAGE_VERSION"),
            "cbindgen.toml must not hold the version macros (tests/c_abi/headers.rs makes them)"
        );
    }
}

/// Whether `code` has `name(` with no identifier character before it.
fn declares(code: &str, name: &str) -> bool {
    code.match_indices(&format!("{name}(")).any(|(i, _)| {
        !code[..i]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

fn generate_core() -> String {
    generated()[0].clone()
}

/// Every function cbindgen exports, each declared in exactly the header its name
/// gives it (`headers::header_of`), none lost by the split: the names come from the
/// Rust source (every `extern "C"` function of `src/ffi/`) and must each be declared
/// once in all three headers together.
#[test]
fn each_function_is_declared_in_its_own_header_only() {
    let functions: Vec<String> = headers::all_item_names()
        .into_iter()
        .filter(|n| n.starts_with("flare_"))
        .collect();
    assert!(
        functions.len() >= 60,
        "only {} functions found",
        functions.len()
    );
    let mut counts = [0usize; 3];
    for name in &functions {
        for (i, (header, text)) in HEADERS.iter().zip(generated()).enumerate() {
            let declared = declares(&without_comments(text), name);
            assert_eq!(
                declared,
                header_of(name) == *header,
                "{name} is {} {}",
                if declared {
                    "declared in"
                } else {
                    "missing from"
                },
                header.file_name()
            );
            counts[i] += usize::from(declared);
        }
    }
    // The PyTorch glue and the test hooks are out of the core header.
    assert!(
        counts[0] >= 20 && counts[1] >= 20 && counts[2] >= 15,
        "{counts:?}"
    );
    for (header, text) in HEADERS.iter().zip(generated()).skip(1) {
        assert!(
            text.contains("#include \"flare_package.h\""),
            "{} must include flare_package.h",
            header.file_name()
        );
        assert!(
            !text.contains("typedef enum FlareStatus"),
            "{} redeclares a core type",
            header.file_name()
        );
    }
}

/// The header with `struct `/`enum ` tags dropped and whitespace collapsed, so that
/// declarations compare with the contract's spelling.
fn normalized(header: &str) -> String {
    header
        .replace("struct ", "")
        .replace("enum ", "")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn header_declares_the_whole_contract() {
    let header = generated().join("\n");
    for item in [
        "typedef struct FlarePool FlarePool;",
        "typedef enum FlareStatus {",
        "typedef enum FlareBackend {",
        "typedef enum FlareReusePolicy {",
        "typedef enum FlareCrossStreamReuse {",
        "typedef enum FlareDriverCall {",
        "typedef struct FlarePoolConfig {",
        "typedef struct FlareSnapshot {",
        "typedef struct FlareDestroyReport {",
        "typedef void *FlareStream;",
        "#ifndef FLARE_PACKAGE_H",
        "extern \"C\" {",
    ] {
        assert!(header.contains(item), "the generated header lacks `{item}`");
    }
    let flat = normalized(&header);
    for decl in [
        "void flare_pool_config_init(FlarePoolConfig *config, size_t config_size);",
        "FlareStatus flare_pool_create(const FlarePoolConfig *config, FlarePool **out_pool);",
        "FlareStatus flare_pool_destroy(FlarePool *pool);",
        "FlareStatus flare_pool_destroy_report(FlarePool *pool, FlareDestroyReport *out_report);",
        "FlareStatus flare_package_allocate(FlarePool *pool, size_t size, void **out_ptr);",
        "FlareStatus flare_package_free(FlarePool *pool, void *ptr);",
        "FlareStatus flare_retention_begin(FlarePool *pool);",
        "FlareStatus flare_retention_finish(FlarePool *pool);",
        "FlareStatus flare_retention_abort(FlarePool *pool);",
        "FlareStatus flare_pool_trim(FlarePool *pool);",
        "FlareStatus flare_pool_snapshot(const FlarePool *pool, FlareSnapshot *out);",
        "const char *flare_status_name(FlareStatus status);",
        "size_t flare_last_error_message(char *buf, size_t len);",
        "FlareStatus flare_sim_inject_failure(FlarePool *pool, FlareDriverCall call, uint32_t nth, int32_t cuda_error);",
        "FlareStatus flare_sim_inject_panic(FlarePool *pool);",
        // Stream order (issue 11), the contract's spelling.
        "FlareStatus flare_package_allocate_async(FlarePool *pool, size_t size, FlareStream stream, void **out_ptr);",
        "FlareStatus flare_package_free_async(FlarePool *pool, void *ptr, FlareStream stream);",
        "FlareStatus flare_package_record_stream(FlarePool *pool, void *ptr, FlareStream stream);",
        "FlareStatus flare_sim_stream_create(FlarePool *pool, FlareStream *out_stream);",
        "FlareStatus flare_sim_launch(FlarePool *pool, FlareStream stream, const void *ptr, size_t bytes);",
        "FlareStatus flare_sim_stream_complete(FlarePool *pool, FlareStream stream);",
        "FlareStatus flare_sim_begin_capture(FlarePool *pool, FlareStream stream);",
        "FlareStatus flare_sim_end_capture(FlarePool *pool, FlareStream stream, int *out_valid);",
        "FlareStatus flare_sim_faults(const FlarePool *pool, uint64_t *out_faults);",
        "FLARE_CROSS_STREAM_WHEN_COMPLETE = 0,",
        "FLARE_CROSS_STREAM_NEVER = 1,",
        "FLARE_CROSS_STREAM_WAIT = 2,",
        "FLARE_STATUS_REQUEST_TOO_LARGE = 9,",
        // Enum-valued struct fields are fixed-width integers: a C enum's size is the
        // compiler's choice, a struct's layout must not be.
        "uint32_t backend;",
        "uint32_t reuse_policy;",
        "uint32_t best_fit_max_waste_percent;",
        "uint64_t thread_cache_bytes;",
        "const char *record_path;",
        // The history ring (issue 38), at the end of the configuration.
        "uint64_t history_events; } FlarePoolConfig;",
        "FlareStatus flare_pool_dump_snapshot(const FlarePool *pool, const char *path);",
        "FlareStatus flare_history_set_frame(const char *frame);",
        "FLARE_STATUS_IO = 12,",
        // Thread caches (issue 13): the value of thread_cache_entries that turns them
        // off (0 is the default), in the header's own spelling of UINT32_MAX.
        "#define FLARE_THREAD_CACHE_OFF UINT32_MAX",
    ] {
        assert!(flat.contains(decl), "the generated header lacks `{decl}`");
    }
    // Segment mode (issue 12), then thread caches (issue 13), in the code with the
    // comments left out: the policy's number; the configuration's fields in their
    // order (segment_whole_threshold_bytes after cross_stream_reuse, the two thread
    // cache fields after it, at the end of the struct); the snapshot's eight segment
    // counters in their order, then the four thread-cache counters, at its end.
    let code = normalized(&without_comments(&header));
    for decl in [
        "FLARE_REUSE_NONE = 2, FLARE_REUSE_SEGMENTS = 3, } FlareReusePolicy;",
        "uint32_t cross_stream_reuse; uint64_t segment_whole_threshold_bytes; \
         uint32_t thread_cache_entries; uint64_t thread_cache_bytes; const char *record_path; uint64_t history_events; } FlarePoolConfig;",
        "uint64_t stream_call_failures; uint64_t segment_count; uint64_t segment_handles; \
         uint64_t segment_mapped_bytes; uint64_t block_live_count; uint64_t block_live_bytes; \
         uint64_t block_free_bytes; uint64_t segment_handles_lent; uint64_t segment_lent_bytes; \
         uint64_t thread_cache_count; uint64_t thread_cache_bytes; uint64_t thread_cache_hits; \
         uint64_t remote_frees; uint64_t tags_sleeping; uint64_t sleeping_count; \
         uint64_t sleeping_bytes; uint64_t sleeping_held_count; uint64_t sleeping_held_bytes; \
         uint64_t offloaded_bytes; uint64_t sleeping_block_count; \
         uint64_t sleeping_block_bytes; uint64_t host_kept_bytes; } FlareSnapshot;",
        // Tags (issue 15): the interface the issue names.
        "FLARE_SLEEP_DISCARD = 0, FLARE_SLEEP_OFFLOAD = 1, } FlareSleepMode;",
        "typedef FlareTagCensus { uint32_t struct_size; uint32_t sleeping; uint64_t live_count; uint64_t live_bytes; \
         uint64_t peak_live_bytes; uint64_t idle_bytes; uint64_t physical_bytes; \
         uint64_t offloaded_bytes; uint64_t zeroed_bytes; uint64_t zero_memsets; } FlareTagCensus;",
        "FlareStatus flare_package_allocate_tagged(FlarePool *pool, size_t size, \
         FlareStream stream, uint32_t tag, void **out_ptr);",
        "FlareStatus flare_pool_sleep(FlarePool *pool, uint32_t tag, FlareSleepMode mode);",
        "FlareStatus flare_pool_wake(FlarePool *pool, uint32_t tag);",
        // The zeroing wake (issue 34).
        "FlareStatus flare_pool_wake_zeroed(FlarePool *pool, uint32_t tag, FlareStream stream);",
        "FlareStatus flare_pool_tag_census(const FlarePool *pool, uint32_t tag, \
         FlareTagCensus *out);",
    ] {
        assert!(code.contains(decl), "the generated header lacks `{decl}`");
    }
    assert!(
        !header.contains("Raw"),
        "a Raw* Rust type leaked into the header"
    );
    // No struct field has an enum type.
    for line in header.lines() {
        let l = line.trim_start();
        for enum_type in [
            "FlareStatus ",
            "FlareBackend ",
            "FlareReusePolicy ",
            "FlareCrossStreamReuse ",
            "FlareDriverCall ",
        ] {
            let field = l.starts_with(&format!("enum {enum_type}")) || l.starts_with(enum_type);
            assert!(
                !(field && l.ends_with(';') && !l.contains('(')),
                "a struct field has an enum type: `{l}`"
            );
        }
    }
}
