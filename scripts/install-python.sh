#!/usr/bin/env bash
# Installs the Python package (python/) with the shared library built from this
# checkout inside it: cargo build, copy target/release/libflare_package.so into
# python/flare_package/lib/, pip install. Extra arguments go to pip (e.g. --user).
# Without network, pip needs setuptools installed already: --no-build-isolation is
# passed when it is.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p flare-package
mkdir -p python/flare_package/lib
cp target/release/libflare_package.so python/flare_package/lib/
extra=()
if python3 -c "import setuptools" 2>/dev/null; then extra+=(--no-build-isolation); fi
python3 -m pip install "${extra[@]}" "$@" ./python
