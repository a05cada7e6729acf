#!/usr/bin/env bash
# Runs every test of the project that needs no GPU: formatting and lints, the Rust
# unit and integration tests (simulated driver, property tests, header check), the
# loom models, the C and C++ programs and examples against the static library (plain,
# under AddressSanitizer + UndefinedBehaviorSanitizer, under valgrind, and through
# CMake), the Python package's tests (unittest, no PyTorch, no GPU), the Rust and
# Python examples (examples/), the replay of every shipped trace and a short pass of
# each fuzz target (scripts/fuzz.sh). Installs the system tools it needs (cmake,
# valgrind) with apt-get when they are missing and it runs as root.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v cmake >/dev/null || need+=(cmake)
command -v valgrind >/dev/null || need+=(valgrind)
command -v g++ >/dev/null || need+=(g++)
command -v python3 >/dev/null || need+=(python3)
command -v pkg-config >/dev/null || need+=(pkg-config)
# cargo-c's build links OpenSSL (through cargo's own crates).
[ -f /usr/include/openssl/ssl.h ] || need+=(libssl-dev)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "== installing ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "missing tools: ${need[*]} (install them, e.g. apt-get install ${need[*]})" >&2
    exit 1
  fi
fi

# cargo-c (cargo cinstall), the installer of the C library (tests/install/run.sh). Its
# version follows the toolchain's: 0.10.24 is the last built on cargo 0.98 (Rust 1.95;
# newer ones need a newer Rust). A first build of it takes about 10 minutes on 2 cores.
if ! cargo cinstall --version >/dev/null 2>&1; then
  echo "== installing cargo-c"
  cargo install cargo-c --locked --version 0.10.24 --quiet
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
cargo fmt --manifest-path fuzz/Cargo.toml -- --check
echo "== cargo clippy -D warnings (the workspace; the library alone, without the testing feature)"
cargo clippy --release --workspace --all-targets -- -D warnings
cargo clippy --release -p flare-package --lib -- -D warnings
cargo check --release -p flare-package --lib --features std-mutex
echo "== documentation builds without a broken link"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --quiet
echo "== a crate depending on flare-package compiles none of the tools' dependencies"
if cargo tree -p flare-package -e normal --prefix none | grep -E '^(clap|serde_json|comfy-table|indicatif|criterion) '; then
  echo "flare-package's own dependency tree has a command-line tool's dependency" >&2
  exit 1
fi
echo "== cargo test (the library and the tools; simulated driver; GPU tests are ignored)"
cargo test --release --workspace
echo "== the package's tests again with overflow checks on (issue 16: an arithmetic mutant can hide behind wrapping; opt-level 1 to build faster)"
CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=true CARGO_PROFILE_RELEASE_OPT_LEVEL=1 CARGO_TARGET_DIR=target/overflow \
  cargo test --release -p flare-package
echo "== loom models (the whole workspace's tests under --cfg flare_loom: the models run, every other test is left out, nothing fails)"
RUSTFLAGS="--cfg flare_loom" CARGO_TARGET_DIR=target/loom cargo test --release --workspace -- --nocapture --test-threads=1
echo "== C and C++ programs and examples (examples/c, examples/cpp) linking the static library"
bash tests/ffi/run.sh
echo "== the crate as crates.io would take it (cargo publish --dry-run: metadata, licences, README, what is packaged, a build from the package alone)"
# (The test targets are left out of the package, and cargo says so once per target.)
publish=$(cargo publish --dry-run -p flare-package --allow-dirty 2>&1) || { printf '%s\n' "$publish"; exit 1; }
printf '%s\n' "$publish" | grep -v "^warning: ignoring test .* is not included in the published package$" | tail -n 4
echo "== builds of the library with and without the testing feature have files of their own"
# A C crate type in Cargo.toml's [lib] makes every build of the library write the same
# unhashed target/release/deps/libflare_package.rlib, whichever features it has (issue
# 36: a build without `testing` broke the tools' doctests, built with it).
if [ -e target/release/deps/libflare_package.rlib ]; then
  echo "target/release/deps/libflare_package.rlib exists: a build gave the library unhashed file names" >&2
  exit 1
fi
echo "== the C library installed into a prefix (cargo cinstall), used by out-of-tree CMake, pkg-config and cc consumers"
bash tests/install/run.sh
echo "== the Python package (python/): loading, the missing-library error, the PyTorch entry points on the simulated driver (no torch, no GPU)"
cargo clib --quiet
python3 -m unittest discover -s python/tests -v
bash tests/python/install.sh  # pip install ./python in fresh venvs (online, offline), the wheel's tag, the tests against the installed package
echo "== the Rust and Python examples on the simulated driver (examples/warmup.rs, examples/python/warmup.py)"
cargo run --release --quiet -p flare-package --example warmup
python3 examples/python/warmup.py --simulated
echo "== flare-replay on every shipped trace"
cargo run --release --quiet --bin flare-replay -- tests/data/*.trace
echo "== fuzzing, a short pass: 20 s per target (docs/development.md has the long run)"
bash scripts/fuzz.sh all 20
echo "all tests passed"
