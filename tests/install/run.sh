#!/usr/bin/env bash
# Installs the C library into a temporary prefix the way an engine team would
# (`cargo cinstall`, cargo-c), checks what landed there, then builds the consumer
# (consumer.c, and as C++ consumer.cpp) out of tree three ways and runs it on the
# simulated backend:
#   - CMake, find_package(flare_package VERSION CONFIG): static and shared, C and C++,
#     and a request for a newer minor version refused;
#   - pkg-config: `--cflags --libs` (shared) and `--static` (a prefix holding the
#     static library alone, as `cargo cinstall --library-type staticlib` makes);
#   - a plain cc line naming the static library;
# and builds it from source inside a CMake tree (cmake-source/, ExternalProject).
# A shared consumer runs with the prefix's lib/ as its only loader path, and must fail
# to start without it. The last line is "N passed, M failed"; exit 0 only when M is 0.
#
#   bash tests/install/run.sh            # needs cargo-c, cmake, pkg-config, cc, c++
#   KEEP=1 bash tests/install/run.sh     # keep the temporary prefix and builds
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"

for tool in cargo-cinstall cmake pkg-config cc c++ readelf; do
  command -v "$tool" >/dev/null || { echo "missing $tool (scripts/test.sh installs it)" >&2; exit 2; }
done

# The version, from Cargo.toml alone (cargo's own reading of it).
version=$(cargo pkgid -p flare-package | sed 's/.*[@#]//')
major=${version%%.*}
rest=${version#*.}
minor=${rest%%.*}
echo "== flare-package $version"

work=$(mktemp -d "${TMPDIR:-/tmp}/flare-install.XXXXXX")
if [ "${KEEP:-0}" = 1 ]; then echo "== keeping $work"; else trap 'rm -rf "$work"' EXIT; fi
prefix=$work/prefix

passed=0
failed=0
# check NAME COMMAND...: a check passes when COMMAND exits 0.
check() {
  local name=$1; shift
  local out
  if out=$("$@" 2>&1); then
    passed=$((passed + 1)); echo "ok - $name"
  else
    failed=$((failed + 1)); echo "FAILED - $name"; printf '%s\n' "$out" | tail -n 20 | sed 's/^/   /'
  fi
}
# refuse NAME COMMAND...: a check passes when COMMAND fails.
refuse() {
  local name=$1; shift
  if "$@" >/dev/null 2>&1; then
    failed=$((failed + 1)); echo "FAILED - $name (it succeeded)"
  else
    passed=$((passed + 1)); echo "ok - $name"
  fi
}
same() { [ "$1" = "$2" ] || { echo "got '$1', want '$2'"; return 1; }; }

# The README's command, as it is written there (with /opt/flare for the prefix).
readme_cmd='cargo cinstall --release -p flare-package --prefix /opt/flare --libdir /opt/flare/lib'
check "README.md and docs/c-guide.md show the command this test runs" \
  sh -c "grep -qxF '$readme_cmd' README.md && grep -qxF '$readme_cmd' docs/c-guide.md"
read -ra cmd <<<"${readme_cmd//\/opt\/flare/$prefix}"
echo "== ${cmd[*]}"
"${cmd[@]}"

# What landed in the prefix.
inc=$prefix/include/flare_package
for h in include/*.h; do
  check "$(basename "$h") is installed as it is in include/" cmp "$h" "$inc/$(basename "$h")"
done
check "the static library is installed" test -f "$prefix/lib/libflare_package.a"
check "libflare_package.so -> .so.$major -> .so.$version" \
  same "$(readlink "$prefix/lib/libflare_package.so") $(readlink "$prefix/lib/libflare_package.so.$major")" \
  "libflare_package.so.$version libflare_package.so.$version"
check "the shared library's soname is libflare_package.so.$major" \
  same "$(readelf -d "$prefix/lib/libflare_package.so.$version" | sed -n 's/.*soname: \[\(.*\)\]/\1/p')" \
  "libflare_package.so.$major"
check "flare_package.pc has Cargo.toml's version" \
  same "$(PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --modversion flare_package)" "$version"
check "the CMake version file has Cargo.toml's version" \
  grep -qx "set(PACKAGE_VERSION \"$version\")" "$prefix/share/flare_package/cmake/flare_package-config-version.cmake"

# run_shared NAME EXE: the shared consumer runs with only the prefix on its loader
# path, and does not start without it.
run_shared() {
  local name=$1 exe=$2
  check "$name: needs libflare_package.so.$major" \
    sh -c "readelf -d '$exe' | grep -q 'NEEDED.*\[libflare_package.so.$major\]'"
  check "$name: runs with LD_LIBRARY_PATH=PREFIX/lib alone" env -u LD_PRELOAD LD_LIBRARY_PATH="$prefix/lib" "$exe"
  refuse "$name: does not start without the prefix on its loader path" \
    sh -c "test -x '$exe' || exit 0; env -u LD_LIBRARY_PATH '$exe'"
}
# run_shared_rpath NAME EXE: a CMake-built shared consumer, whose run path CMake sets to
# the prefix's lib/ (and nothing else): it runs with no LD_LIBRARY_PATH, and does not
# start while that directory is away.
run_shared_rpath() {
  local name=$1 exe=$2
  check "$name: needs libflare_package.so.$major" \
    sh -c "readelf -d '$exe' | grep -q 'NEEDED.*\[libflare_package.so.$major\]'"
  check "$name: its run path is PREFIX/lib alone" \
    same "$(readelf -d "$exe" | sed -n 's/.*R[UN]*PATH.*\[\(.*\)\]/\1/p')" "$prefix/lib"
  check "$name: runs with no LD_LIBRARY_PATH" env -u LD_LIBRARY_PATH "$exe"
  mv "$prefix/lib" "$prefix/lib.away"
  refuse "$name: does not start while PREFIX/lib is away" \
    sh -c "test -x '$exe' || exit 0; env -u LD_LIBRARY_PATH '$exe'"
  mv "$prefix/lib.away" "$prefix/lib"
}
# run_static NAME EXE: the static consumer names no flare-package shared library.
run_static() {
  local name=$1 exe=$2
  refuse "$name: links no libflare_package.so" sh -c "! test -x '$exe' || readelf -d '$exe' | grep -q libflare_package"
  check "$name: runs" env -u LD_LIBRARY_PATH "$exe"
}

# 1. CMake: find_package, static (the default) and shared.
for kind in static shared; do
  build=$work/cmake-$kind
  opt=ON; [ "$kind" = shared ] && opt=OFF
  check "cmake ($kind): configure with find_package(flare_package $version)" \
    cmake -S "$here/cmake" -B "$build" -DCMAKE_PREFIX_PATH="$prefix" \
    -DFLARE_EXPECT_VERSION="$version" -DFLARE_PACKAGE_STATIC=$opt
  check "cmake ($kind): build" cmake --build "$build"
  for lang in c cpp; do
    if [ "$kind" = static ]; then
      run_static "cmake static $lang" "$build/consumer_$lang"
    else
      run_shared_rpath "cmake shared $lang" "$build/consumer_$lang"
    fi
  done
done
refuse "cmake: find_package(flare_package $major.$((minor + 1))) is refused by the version file" \
  cmake -S "$here/cmake" -B "$work/cmake-newer" -DCMAKE_PREFIX_PATH="$prefix" \
  -DFLARE_EXPECT_VERSION="$major.$((minor + 1)).0"

# 2. pkg-config: shared from the full prefix; --static from a static-only prefix.
cflags=(-std=c11 -Wall -Wextra -Werror -pedantic "-DFLARE_EXPECT_VERSION=\"$version\"")
check "pkg-config: cc \$(pkg-config --cflags --libs flare_package)" \
  sh -c "cc ${cflags[*]@Q} '$here/consumer.c' -o '$work/pc_shared' \
    \$(PKG_CONFIG_PATH='$prefix/lib/pkgconfig' pkg-config --cflags --libs flare_package)"
run_shared "pkg-config shared" "$work/pc_shared"
static_prefix=$work/static-prefix
cp -a "$prefix" "$static_prefix"
rm -f "$static_prefix"/lib/libflare_package.so*
sed -i "s|^prefix=.*|prefix=$static_prefix|" "$static_prefix/lib/pkgconfig/flare_package.pc"
check "pkg-config: cc \$(pkg-config --cflags --libs --static flare_package)" \
  sh -c "cc ${cflags[*]@Q} '$here/consumer.c' -o '$work/pc_static' \
    \$(PKG_CONFIG_PATH='$static_prefix/lib/pkgconfig' pkg-config --cflags --libs --static flare_package)"
run_static "pkg-config static" "$work/pc_static"

# 3. A plain cc line (docs/c-guide.md): the header directory and the static library.
check "cc: a plain line with the static library" \
  cc "${cflags[@]}" -I"$inc" "$here/consumer.c" "$prefix/lib/libflare_package.a" \
  -lpthread -ldl -lm -o "$work/cc_static"
run_static "cc static" "$work/cc_static"

# 4. From source inside a CMake tree: ExternalProject runs cargo cinstall at build time
# (this checkout's target directory, so nothing is built twice).
check "cmake from source (ExternalProject): configure" \
  cmake -S "$here/cmake-source" -B "$work/cmake-source" -DFLARE_PACKAGE_SOURCE="$root" \
  -DFLARE_PACKAGE_TARGET_DIR="$root/target" -DFLARE_EXPECT_VERSION="$version"
check "cmake from source (ExternalProject): build" cmake --build "$work/cmake-source"
run_static "cmake from source" "$work/cmake-source/consumer_c"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
