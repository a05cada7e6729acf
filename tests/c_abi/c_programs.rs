//! The C and C++ programs of `tests/ffi/` as a Rust test, for mutation testing
//! (issue 16, `scripts/mutants.sh`): a mutant of the C ABI must face the programs
//! that call it from C. Runs only with `FLARE_MUTANTS_C=1` (the programs are run by
//! `scripts/test.sh` itself, plainly, under sanitizers and valgrind; here only the
//! plain build, which is what catches a mutant): it builds the static library of
//! this tree (the mutated one, in cargo-mutants' copy) and runs `tests/ffi/run.sh`.

use std::process::Command;

#[test]
fn c_and_cpp_programs_pass_against_this_tree() {
    if std::env::var("FLARE_MUTANTS_C").as_deref() != Ok("1") {
        return; // scripts/test.sh runs them in CI
    }
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new("bash")
        .arg("tests/ffi/run.sh")
        .current_dir(root)
        .env("SKIP_VALGRIND", "1")
        .env("SKIP_SANITIZERS", "1")
        .output()
        .expect("run tests/ffi/run.sh");
    assert!(
        out.status.success(),
        "tests/ffi/run.sh failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
