//! A test in a process of its own: PyTorch's entry points share one allocator per
//! process, made by the first call (`flare_torch_use_simulated` must be that call),
//! and a test that measures the process's heap (a counting global allocator) must
//! be alone in its process; such tests share their area's binary with others. Each
//! runs its steps in a child process of the test binary that runs only that test,
//! by its exact name.

use std::process::Command;

/// Set in the child to the name of the one test it runs.
const CHILD: &str = "FLARE_TEST_OWN_PROCESS";

/// Runs `steps` in a child process of this test binary that runs only the test
/// `name` (a function of the module `module`, given as `module_path!()`), and fails
/// when the child fails or ran no test. In that child, runs `steps`.
pub fn run(module: &str, name: &str, steps: fn()) {
    // The name as the harness knows it: the module path less the crate's name.
    let name = match module.split_once("::") {
        Some((_, module)) => format!("{module}::{name}"),
        None => name.to_string(),
    };
    if std::env::var_os(CHILD).is_some_and(|v| v == name.as_str()) {
        steps();
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &name, "--nocapture", "--test-threads=1"])
        .env(CHILD, &name)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("1 passed"),
        "the child ran the test: {stdout}"
    );
}
