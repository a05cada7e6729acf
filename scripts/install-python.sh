#!/usr/bin/env bash
# Installs the Python package (python/) with the shared library built from this
# checkout inside it: cargo build, copy target/release/libflare_package.so into
# python/flare_package/lib/, pip install. Extra arguments go to pip (e.g. --user).
# Without network, pip needs setuptools and wheel installed already
# (--no-build-isolation is passed when they are); when pip cannot build the package
# (no network, no wheel), the package is pure Python, so it is copied into the
# interpreter's site-packages instead (or the user's, with --user), and the script
# says so.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p flare-package
mkdir -p python/flare_package/lib
cp target/release/libflare_package.so python/flare_package/lib/
extra=()
if python3 -c "import setuptools, wheel" 2>/dev/null; then extra+=(--no-build-isolation); fi
if python3 -m pip install "${extra[@]}" "$@" ./python; then
  exit 0
fi
user=0
for a in "$@"; do [ "$a" = --user ] && user=1; done
if [ "$user" = 1 ]; then
  dest=$(python3 -c 'import site; print(site.getusersitepackages())')
else
  dest=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
fi
echo "pip could not build the package (offline without setuptools and wheel?); copying the pure-Python package into $dest instead" >&2
mkdir -p "$dest"
rm -rf "$dest/flare_package"
cp -r python/flare_package "$dest/"
python3 -c 'import flare_package, sys; print("installed", flare_package.__file__, "library", flare_package.library_path())' 
