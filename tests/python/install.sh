#!/usr/bin/env bash
# The Python package installed as a user installs it (issue 36), each step in a fresh
# virtual environment under a temporary folder:
#   1. `pip install ./python` (pip fetches maturin and cffi into its build
#      environment, maturin builds the library): `library_path()` is the library
#      inside the package in that environment's site-packages, the installed version
#      is Cargo.toml's, and the package's unit tests pass against the installed
#      package (python/tests/test_flare_package.py with FLARE_PACKAGE_TEST_INSTALLED=1,
#      run from outside the checkout, FLARE_PACKAGE_LIB unset);
#   2. `pip wheel ./python`: one wheel, tagged py3-none-manylinux_*_<arch> (every
#      Python 3, this platform), holding the library; the library crate is built
#      without the `testing` feature;
#   3. that wheel installed into another Python 3 (when pyenv or the system has one
#      of another minor version) and the unit tests run there;
#   4. offline: maturin and cffi installed first, then
#      `pip install --no-index --no-build-isolation ./python` with no network at all
#      (a network namespace of its own, `unshare -n`, where it can make one);
#   5. when the library does not build (a `cargo rustc` that fails), `pip install
#      ./python` fails, shows cargo's error and never says "Successfully
#      installed" (the package is never installed without its library);
#   6. `pip install .` from the repository root installs the same package (the root
#      pyproject.toml is python/'s with the paths moved: compared here).
# Needs python3 with venv and pip, cargo, and PyPI for the build environments of
# steps 1, 2, 4, 5 and 6. Prints each step's time.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
work=$(mktemp -d "${TMPDIR:-/tmp}/flare-python.XXXXXX")
trap 'rm -rf "$work"' EXIT
unset FLARE_PACKAGE_LIB
export PIP_DISABLE_PIP_VERSION_CHECK=1
# maturin builds flare-package as a dependency of python/Cargo.toml; in target/ that
# build and the checkout's `cargo rustc -p flare-package --crate-type ...` undo each
# other's fingerprint and rebuild the library each time (25 to 30 s each on 2 cores).
# A target folder of its own: about 40 s the first time, a few seconds after.
export CARGO_TARGET_DIR=$root/target/python

fail() {
  echo "tests/python/install.sh: $*" >&2
  exit 1
}
python3 -c 'import venv, ensurepip' 2>/dev/null ||
  fail "python3 cannot make virtual environments (Debian: apt-get install python3-venv)"
step() {
  echo "-- $*"
  t0=$SECONDS
}
took() { echo "   ($((SECONDS - t0)) s)"; }

version=$(cargo metadata --no-deps --format-version 1 --manifest-path python/Cargo.toml |
  python3 -c 'import json, sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "flare-package"))')
arch=$(uname -m)

# Runs the unit tests against the package installed in venv $1.
unit_tests() {
  (cd "$work" && FLARE_PACKAGE_TEST_INSTALLED=1 "$1/bin/python" -m unittest discover -s "$root/python/tests" 2>&1) >"$work/unittest.log" ||
    { cat "$work/unittest.log" >&2; fail "the unit tests failed against the package installed in $1"; }
  tail -n 3 "$work/unittest.log"
}

# Checks that venv $1's flare_package is installed in its site-packages with the
# library inside it, of version $version.
check_installed() {
  "$1/bin/python" - "$version" <<'EOF'
import importlib.metadata, pathlib, sys, sysconfig
import flare_package
site = pathlib.Path(sysconfig.get_paths()["platlib"]).resolve()
path = flare_package.library_path()
print("   library_path():", path)
assert path == site / "flare_package" / "_native" / "lib_native.so", f"{path} is not the library inside the package in {site}"
assert path.is_file() and path.stat().st_size > 100_000, path
got = importlib.metadata.version("flare-package")
assert got == sys.argv[1], f"installed version {got}, Cargo.toml says {sys.argv[1]}"
flare_package.use_simulated(1 << 30, 1)
lib = flare_package.load()
ptr = lib.flare_torch_alloc(1 << 20, 0, None)  # on the simulated driver
assert ptr, "flare_torch_alloc returned NULL"
lib.flare_torch_free(ptr, 1 << 20, 0, None)
print(f"   version {got}; the library loads and allocates")
EOF
}

step "1. pip install ./python in a fresh venv"
python3 -m venv "$work/online"
"$work/online/bin/python" -m pip install -q ./python >"$work/pip.log" 2>&1 || { cat "$work/pip.log" >&2; fail "pip install ./python failed"; }
took
check_installed "$work/online"
unit_tests "$work/online"

step "2. pip wheel ./python"
"$work/online/bin/python" -m pip wheel -q --no-deps -w "$work/wheels" ./python >"$work/pip.log" 2>&1 || { cat "$work/pip.log" >&2; fail "pip wheel ./python failed"; }
took
wheels=("$work"/wheels/*.whl)
[ ${#wheels[@]} = 1 ] || fail "pip wheel made ${#wheels[@]} wheels: ${wheels[*]}"
wheel=$(basename "${wheels[0]}")
echo "   $wheel"
[[ $wheel =~ ^flare_package-${version//./\\.}-py3-none-manylinux_[0-9]+_[0-9]+_${arch}\.whl$ ]] ||
  fail "the wheel $wheel is not flare_package-$version-py3-none-manylinux_*_$arch.whl"
listing=$(python3 -m zipfile -l "${wheels[0]}")
grep -q '^flare_package/_native/lib_native.so ' <<<"$listing" ||
  fail "the wheel $wheel has no flare_package/_native/lib_native.so"
if cargo tree -q -p flare-package-python -e features --prefix none | grep -F 'flare-package feature "testing"'; then
  fail "the wheel's library is built with flare-package's testing feature"
fi

step "3. the wheel in another Python 3"
other=""
current=$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
for v in 3.13 3.12 3.10 3.9 3.8; do
  [ "$v" = "$current" ] && continue
  for c in "$(command -v "python$v" || true)" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$v".*/bin/python3; do
    if [ -x "$c" ] && "$c" -c 'import venv, ensurepip' 2>/dev/null; then other=$c && break 2; fi
  done
done
if [ -n "$other" ]; then
  echo "   $("$other" --version) ($other)"
  "$other" -m venv "$work/other"
  "$work/other/bin/python" -m pip install -q --no-index "${wheels[0]}"
  took
  check_installed "$work/other"
  unit_tests "$work/other"
else
  echo "   skipped: no Python 3 of another minor version than $current here"
fi

step "4. offline: pip install maturin cffi, then pip install --no-index --no-build-isolation ./python without network (the venv not activated)"
python3 -m venv "$work/offline"
"$work/offline/bin/python" -m pip install -q "maturin>=1.8,<2.0" cffi
t_build=$SECONDS
offline=(env)
if unshare -n true 2>/dev/null; then
  offline=(unshare -n)
  echo "   in a network namespace of its own (unshare -n)"
else
  echo "   unshare -n is not permitted here: --no-index alone"
fi
"${offline[@]}" "$work/offline/bin/python" -m pip install -q --no-index --no-build-isolation ./python >"$work/pip.log" 2>&1 ||
  { cat "$work/pip.log" >&2; fail "the offline install failed"; }
echo "   (the build: $((SECONDS - t_build)) s)"
took
check_installed "$work/offline"

step "5. a library that does not build: pip install ./python fails and installs nothing"
# cargo as found on PATH, except that `cargo rustc` (maturin's build of the library)
# fails as a compile error would.
real_cargo=$(command -v cargo)
mkdir -p "$work/failing-cargo"
printf '#!/bin/sh\nif [ "$1" = rustc ]; then echo "error: a compile error (tests/python/install.sh)" >&2; exit 101; fi\nexec "%s" "$@"\n' \
  "$real_cargo" >"$work/failing-cargo/cargo"
chmod +x "$work/failing-cargo/cargo"
python3 -m venv "$work/failing"
if PATH=$work/failing-cargo:$PATH "$work/failing/bin/python" -m pip install ./python >"$work/pip.log" 2>&1; then
  cat "$work/pip.log" >&2
  fail "pip install ./python succeeded although the library did not build"
fi
if grep -q "Successfully installed" "$work/pip.log"; then
  cat "$work/pip.log" >&2
  fail "pip said 'Successfully installed' without the library"
fi
grep -q "a compile error (tests/python/install.sh)" "$work/pip.log" ||
  { cat "$work/pip.log" >&2; fail "pip's failure does not show cargo's error"; }
if "$work/failing/bin/python" -c 'import flare_package' 2>/dev/null; then
  fail "flare_package is importable after the failed install"
fi
echo "   failed as it must, with cargo's error: $(grep -m1 'a compile error' "$work/pip.log" | sed 's/^ *//')"
took

step "6. pip install . from the repository root (pyproject.toml there: the same package)"
python3 - pyproject.toml python/pyproject.toml <<'EOF'
import sys
try:
    import tomllib
except ImportError:  # Python < 3.11
    print("   (no tomllib in this Python: the two pyproject.toml files not compared)")
    sys.exit(0)
root, python = (tomllib.load(open(p, "rb")) for p in sys.argv[1:])
# The root's paths are python/'s with python/ in front; everything else is equal.
moved = {"manifest-path": "python/Cargo.toml", "python-source": "python"}
want = dict(python["tool"]["maturin"], **moved)
assert root["tool"]["maturin"] == want, f"[tool.maturin]: {root['tool']['maturin']} != {want}"
assert root["project"] == python["project"], "[project] differs between pyproject.toml and python/pyproject.toml"
want = dict(python["build-system"], **{"backend-path": ["python/build_backend"]})
assert root["build-system"] == want, f"[build-system]: {root['build-system']} != {want}"
print("   pyproject.toml and python/pyproject.toml describe the same package")
EOF
"$work/online/bin/python" -m pip install -q --force-reinstall --no-deps . >"$work/pip.log" 2>&1 ||
  { cat "$work/pip.log" >&2; fail "pip install . failed"; }
took
check_installed "$work/online"

echo "the Python package installs (pip install ./python online and offline, pip install ., pip wheel $wheel)"
