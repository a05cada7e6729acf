//! The committed C header `include/flare_package.h` must be exactly what cbindgen
//! generates from the module `src/ffi/` with `cbindgen.toml`.
//!
//! cbindgen reads `src/ffi/mod.rs` and the files of its submodules. It does not
//! expand macros, and the C types are made by macros from the crate's lists
//! (`src/ffi/generate.rs`), so their Rust source, which the macros record
//! (`flare_package::ffi::cbindgen_sources`), is written to a file that cbindgen reads
//! too.
//!
//! Regenerate it with:
//!
//! ```sh
//! FLARE_BLESS_HEADER=1 cargo test --test c_abi header
//! ```

use std::path::PathBuf;

const BLESS_VAR: &str = "FLARE_BLESS_HEADER";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn header_path() -> PathBuf {
    root().join("include").join("flare_package.h")
}

/// The generated C types' Rust source, in a file of its own (one per process: the
/// tests of this file run in parallel).
fn generated_types_file() -> PathBuf {
    static FILE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    FILE.get_or_init(|| {
        let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("flare_ffi_types_{}.rs", std::process::id()));
        let source = flare_package::ffi::cbindgen_sources().join("\n\n");
        std::fs::write(&path, source)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        path
    })
    .clone()
}

fn generate() -> String {
    let root = root();
    let config = cbindgen::Config::from_file(root.join("cbindgen.toml"))
        .unwrap_or_else(|e| panic!("cannot read cbindgen.toml: {e}"));
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
fn committed_header_is_what_cbindgen_generates() {
    let generated = generate();
    let path = header_path();
    if std::env::var_os(BLESS_VAR).is_some_and(|v| !v.is_empty() && v != "0") {
        std::fs::write(&path, &generated)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        eprintln!("wrote {}", path.display());
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read {}: {e}\nGenerate it with: {BLESS_VAR}=1 cargo test --test c_abi header",
            path.display()
        )
    });
    assert!(
        committed == generated,
        "{} is stale: it is not what cbindgen generates from src/ffi/ and cbindgen.toml.\n{}\n\
         Regenerate it with: {BLESS_VAR}=1 cargo test --test c_abi header  (then review and commit it)",
        path.display(),
        first_difference(&committed, &generated)
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
    // Checked on the generated text, so that a stale cbindgen.toml fails here even
    // when the committed header was blessed from it.
    for header in [
        generate(),
        std::fs::read_to_string(header_path()).unwrap_or_default(),
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
        ] {
            assert_eq!(
                define(&header, name).as_deref(),
                Some(want),
                "{name} in the header must be Cargo.toml's {want}: edit after_includes in \
                 cbindgen.toml, then run {BLESS_VAR}=1 cargo test --test c_abi header"
            );
        }
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

/// The header with its `/* ... */` comments left out.
fn without_comments(header: &str) -> String {
    let mut out = String::with_capacity(header.len());
    let mut rest = header;
    while let Some(start) = rest.find("/*") {
        out.push_str(&rest[..start]);
        match rest[start..].find("*/") {
            Some(end) => rest = &rest[start + end + 2..],
            None => return out,
        }
    }
    out.push_str(rest);
    out
}

#[test]
fn header_declares_the_whole_contract() {
    let header = generate();
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
        "const char *record_path; } FlarePoolConfig;",
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
         uint32_t thread_cache_entries; uint64_t thread_cache_bytes; const char *record_path; } FlarePoolConfig;",
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
