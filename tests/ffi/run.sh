#!/usr/bin/env bash
# Builds the release static library, then compiles and runs the C11 and C++17 ABI
# tests, the C++17 tag program (tags.cpp), a caller compiled against the 0.1 header
# (abi/struct_size_0_1.c: struct_size compatibility), the out-of-memory path of flare_torch_alloc
# (torch_oom.cpp with a stand-in for PyTorch's torchCheckFail, fake_c10.cpp) and the
# C and C++ examples (examples/c/warmup.c, examples/cpp/warmup.cpp; README.md's C
# lines must be lines of the C example, so that the README cannot drift) against it:
# plainly, under AddressSanitizer + UndefinedBehaviorSanitizer
# (leak detection on) and under valgrind (memcheck, definite leaks are errors). The
# installed library's consumers (CMake, pkg-config, cc) are tests/install/run.sh's.
# Exits non-zero on any failure.
#
#   bash tests/ffi/run.sh
#
# Needs: cargo, gcc, g++ (with libasan/libubsan, as Debian's gcc ships them),
# valgrind. On Debian/Ubuntu:
#   apt-get install -y gcc g++ valgrind
# Set SKIP_VALGRIND=1 or SKIP_SANITIZERS=1 to leave a stage out (not in CI).
#
# Leak suppressions: none. Both LeakSanitizer and valgrind report no leak: every
# allocation of the library (Rust's per-thread last-error string and std's own
# allocations included) is freed by exit.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build="$here/build"
mkdir -p "$build"
cd "$root"

echo "== cargo clib (target/release/libflare_package.a: .cargo/config.toml)"
cargo clib --quiet
lib="$root/target/release/libflare_package.a"
[ -f "$lib" ] || { echo "missing $lib" >&2; exit 1; }

warn=(-Wall -Wextra -Werror -pedantic)
syslibs=(-lpthread -ldl -lm)
failures=()
# test_poisoned injects a panic: its message is enough, no backtrace.
export RUST_BACKTRACE=0

# run NAME COMMAND...: runs a test program; it must exit 0 and its last line must be
# "N passed, 0 failed".
run() {
  local name=$1; shift
  echo "-- $name"
  local out rc=0
  out=$("$@" 2>&1) || rc=$?
  printf '%s\n' "$out" | sed 's/^/   /' | tail -n 25
  local last
  last=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -n 1 || true)
  if [ "$rc" -ne 0 ] || [ -z "$last" ] || [[ "$last" != *" 0 failed" ]]; then
    echo "   => FAILED (exit $rc)"
    failures+=("$name")
  fi
}

# run_exit0 NAME COMMAND...: runs a program that must exit 0 (the examples).
run_exit0() {
  local name=$1; shift
  echo "-- $name"
  local out rc=0
  out=$("$@" 2>&1) || rc=$?
  printf '%s\n' "$out" | sed 's/^/   /' | tail -n 25
  if [ "$rc" -ne 0 ]; then
    echo "   => FAILED (exit $rc)"
    failures+=("$name")
  fi
}

compile() { # compile OUT LANG(c|cpp|tags) EXTRA_FLAGS...
  local out=$1 lang=$2; shift 2
  if [ "$lang" = c ]; then
    gcc -std=c11 "${warn[@]}" -g "$@" -I"$root/include" "$here/lifecycle.c" "$lib" "${syslibs[@]}" -o "$out"
  elif [ "$lang" = tags ]; then
    g++ -std=c++17 "${warn[@]}" -g "$@" -I"$root/include" "$here/tags.cpp" "$lib" "${syslibs[@]}" -o "$out"
  else
    g++ -std=c++17 "${warn[@]}" -g "$@" -I"$root/include" "$here/lifecycle.cpp" "$lib" "${syslibs[@]}" -o "$out"
  fi
}

# abi/struct_size_0_1.c (issue 36): compiled against the 0.1 header
# (tests/ffi/abi/flare_package-0.1.h, never include/), linked with this library.
compile_0_1() { # compile_0_1 OUT EXTRA_FLAGS...
  local out=$1; shift
  gcc -std=c11 "${warn[@]}" -g "$@" -I"$here/abi" "$here/abi/struct_size_0_1.c" "$lib" "${syslibs[@]}" -o "$out"
}

# torch_oom.cpp (issue 34) in four processes (its handler lookup is once per process):
# the stand-in torchCheckFail in the program (exported, as a program linked with
# libc10 has it), with and without FLARE_TORCH_OOM=null; in a library whose SONAME is
# libc10.so that the program dlopens RTLD_LOCAL (as Python imports PyTorch's); nowhere.
build_torch_oom() { # build_torch_oom SUFFIX EXTRA_FLAGS...
  local sfx=$1; shift
  mkdir -p "$build/c10$sfx"
  g++ -std=c++17 "${warn[@]}" -g "$@" -shared -fPIC -Wl,-soname,libc10.so "$here/fake_c10.cpp" -o "$build/c10$sfx/libc10.so"
  g++ -std=c++17 "${warn[@]}" -g "$@" -rdynamic -I"$root/include" "$here/torch_oom.cpp" "$here/fake_c10.cpp" "$lib" "${syslibs[@]}" -o "$build/torch_oom_exe$sfx"
  g++ -std=c++17 "${warn[@]}" -g "$@" -I"$root/include" "$here/torch_oom.cpp" "$lib" "${syslibs[@]}" -o "$build/torch_oom$sfx"
}
run_torch_oom() { # run_torch_oom LABEL SUFFIX [WRAPPER...]
  local label=$1 sfx=$2; shift 2
  run "torch OOM, torchCheckFail in the program$label" "$@" "$build/torch_oom_exe$sfx" throws
  run "torch OOM, FLARE_TORCH_OOM=null$label" env FLARE_TORCH_OOM=null "$@" "$build/torch_oom_exe$sfx" null
  run "torch OOM, libc10.so loaded RTLD_LOCAL$label" "$@" "$build/torch_oom$sfx" throws "$build/c10$sfx/libc10.so"
  run "torch OOM, no torchCheckFail$label" "$@" "$build/torch_oom$sfx" null
}

echo "== each header alone (twice: its include guard) compiles as C11 and C++17"
for h in flare_package.h flare_package_torch.h flare_package_sim.h; do
  printf '#include "%s"\n#include "%s"\nint main(void) { return 0; }\n' "$h" "$h" > "$build/header_only.c"
  gcc -std=c11 "${warn[@]}" -I"$root/include" -fsyntax-only "$build/header_only.c"
  g++ -std=c++17 "${warn[@]}" -I"$root/include" -fsyntax-only -x c++ "$build/header_only.c"
done

echo "== README.md's C lines (its first \`\`\`c block) are lines of examples/c/warmup.c"
awk '/^```c$/ { inside = 1; next }
     inside && /^```$/ { exit }
     inside { print }' "$root/README.md" > "$build/readme_lines.c"
[ -s "$build/readme_lines.c" ] || { echo "no \`\`\`c block found in README.md" >&2; exit 1; }
while IFS= read -r line; do
  [ -z "$line" ] && continue
  grep -Fxq -- "$line" "$root/examples/c/warmup.c" ||
    { echo "README.md's C line is not a line of examples/c/warmup.c: $line" >&2; exit 1; }
done < "$build/readme_lines.c"
# The examples' own build lines (their first comment), with the paths of this checkout.
compile_example() { # compile_example OUT c|cpp EXTRA_FLAGS...
  local out=$1 lang=$2; shift 2
  if [ "$lang" = c ]; then
    gcc -std=c11 "${warn[@]}" "$@" -I"$root/include" "$root/examples/c/warmup.c" "$lib" "${syslibs[@]}" -o "$out"
  else
    g++ -std=c++17 "${warn[@]}" "$@" -I"$root/include" "$root/examples/cpp/warmup.cpp" "$lib" "${syslibs[@]}" -o "$out"
  fi
}

echo "== plain"
compile "$build/lifecycle_c" c -O2
compile "$build/lifecycle_cpp" cpp -O2
compile "$build/tags_cpp" tags -O2
compile_example "$build/example_c" c -O2
compile_example "$build/example_cpp" cpp -O2
build_torch_oom "" -O2
compile_0_1 "$build/struct_size_0_1" -O2
run "C11" "$build/lifecycle_c"
run "C++17" "$build/lifecycle_cpp"
run "C++17 tags" "$build/tags_cpp"
run_exit0 "C example" "$build/example_c"
run_exit0 "C++ example" "$build/example_cpp"
run_torch_oom "" ""
run "0.1 caller's structs" "$build/struct_size_0_1"

if [ "${SKIP_SANITIZERS:-0}" != 1 ]; then
  echo "== AddressSanitizer + UndefinedBehaviorSanitizer (detect_leaks=1)"
  san=(-O1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  compile "$build/lifecycle_c_asan" c "${san[@]}"
  compile "$build/lifecycle_cpp_asan" cpp "${san[@]}"
  compile "$build/tags_cpp_asan" tags "${san[@]}"
  compile_example "$build/example_c_asan" c -g "${san[@]}"
  compile_example "$build/example_cpp_asan" cpp -g "${san[@]}"
  build_torch_oom _asan "${san[@]}"
  compile_0_1 "$build/struct_size_0_1_asan" "${san[@]}"
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  run "C11 asan+ubsan" "$build/lifecycle_c_asan"
  run "C++17 asan+ubsan" "$build/lifecycle_cpp_asan"
  run "C++17 tags asan+ubsan" "$build/tags_cpp_asan"
  run_exit0 "C example asan+ubsan" "$build/example_c_asan"
  run_exit0 "C++ example asan+ubsan" "$build/example_cpp_asan"
  run_torch_oom " asan+ubsan" _asan
  run "0.1 caller's structs asan+ubsan" "$build/struct_size_0_1_asan"
  unset ASAN_OPTIONS UBSAN_OPTIONS
fi

if [ "${SKIP_VALGRIND:-0}" != 1 ]; then
  echo "== valgrind (memcheck, definite leaks are errors)"
  command -v valgrind >/dev/null || { echo "valgrind is missing: apt-get install -y valgrind" >&2; exit 1; }
  vg=(valgrind -q --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite)
  run "C11 valgrind" "${vg[@]}" "$build/lifecycle_c"
  run "C++17 valgrind" "${vg[@]}" "$build/lifecycle_cpp"
  run "C++17 tags valgrind" "${vg[@]}" "$build/tags_cpp"
  run_exit0 "C example valgrind" "${vg[@]}" "$build/example_c"
  run_exit0 "C++ example valgrind" "${vg[@]}" "$build/example_cpp"
  run "0.1 caller's structs valgrind" "${vg[@]}" "$build/struct_size_0_1"
  # The process-wide PyTorch allocator is never destroyed: its tables show as
  # "possibly lost" (interior pointers); definite leaks are still errors.
  run_torch_oom " valgrind" "" "${vg[@]}" --show-possibly-lost=no
fi

echo "== GPU smoke program compiles (run it on a GPU machine with tests/ffi/gpu/run.sh)"
gcc -std=c11 "${warn[@]}" -I"$root/include" -c "$here/gpu/cuda_smoke.c" -o "$build/cuda_smoke.o"

if [ ${#failures[@]} -ne 0 ]; then
  echo "tests/ffi FAILED: ${failures[*]}"
  exit 1
fi
echo "tests/ffi: all passed"
