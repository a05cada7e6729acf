#!/usr/bin/env bash
# Fuzzing (issue 34): builds the libFuzzer targets of fuzz/ with the stable toolchain
# and runs each for SECONDS seconds.
#
#   scripts/fuzz.sh [TARGET|all] [SECONDS]     (default: all, 60 s per target)
#
# Targets: trace_parse (the trace parser), torch_snapshot (the PyTorch snapshot
# importer), c_abi (the C ABI's argument checks on simulated pools). Each starts
# from its committed seeds (fuzz/seeds/TARGET) and the corpus of earlier runs
# (fuzz/corpus/TARGET, not committed); a finding (a panic, a crash, an input slower
# than FUZZ_TIMEOUT seconds, more than 4 GiB of memory) stops the run, is written to
# fuzz/artifacts/TARGET/ and fails the script. Reproduce one with
#   fuzz/target/HOST/release/TARGET fuzz/artifacts/TARGET/crash-...
# (FLARE_FUZZ_TRACE=1 makes c_abi print each call it makes and its status).
#
# Environment: FUZZ_JOBS=N runs N processes per target (libFuzzer's -fork);
# FUZZ_TIMEOUT (default 10) seconds per input; FUZZ_BUILD_ONLY=1 builds only.
#
# Needs a C++ compiler (libFuzzer is C++, built by the libfuzzer-sys crate) and no
# toolchain but the stable one: the coverage instrumentation is LLVM's
# sanitizer-coverage, set with stable -C flags. The binaries need no Rust and no C++
# library (only the C library, libm and libgcc_s), so they run on another machine:
#   fuzz/target/HOST/release/{trace_parse,torch_snapshot,c_abi}
set -euo pipefail
cd "$(dirname "$0")/.."

target=${1:-all}
seconds=${2:-60}
all=(trace_parse torch_snapshot c_abi)
if [ "$target" = all ]; then
  targets=("${all[@]}")
elif [[ " ${all[*]} " == *" $target "* ]]; then
  targets=("$target")
else
  echo "unknown target '$target': one of ${all[*]}, or all" >&2
  exit 2
fi
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -lt 1 ]; then
  echo "SECONDS must be a whole number of seconds, 1 or more (got '$seconds')" >&2
  exit 2
fi

host=$(rustc -vV | sed -n 's/^host: //p')
# --target makes RUSTFLAGS reach the targets' crates only, not build scripts and
# proc macros (which have no libFuzzer runtime to link).
export RUSTFLAGS="-Cpasses=sancov-module \
 -Cllvm-args=-sanitizer-coverage-level=4 \
 -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
 -Cllvm-args=-sanitizer-coverage-pc-table \
 -Cllvm-args=-sanitizer-coverage-trace-compares"
# libFuzzer's C++ standard library linked statically (libstdc++.a, next to g++'s
# own files): the binaries need only the C library, libm and libgcc_s, as any Rust
# program. (Not a wholly static binary: libFuzzer finds the C library's memcmp and
# the like with dlsym, which a static binary does not have.)
stdcxx_dir=$(dirname "$(${CXX:-g++} -print-file-name=libstdc++.a)")
export RUSTFLAGS="$RUSTFLAGS -Lnative=$stdcxx_dir"
export CXXSTDLIB="static:-bundle=stdc++"
echo "== building the fuzz targets (fuzz/, $host)"
# Not --locked: fuzz/Cargo.lock pins what it has, and a dependency the package
# gains later is added to it rather than failing the build.
cargo build --release --manifest-path fuzz/Cargo.toml --target "$host" \
  $(printf -- '--bin %s ' "${targets[@]}")
bin=fuzz/target/$host/release
if [ "${FUZZ_BUILD_ONLY:-0}" = 1 ]; then
  for t in "${targets[@]}"; do echo "$bin/$t"; done
  exit 0
fi

# Per target: the longest input (bytes) and a dictionary of the format's words.
max_len() {
  case $1 in
    trace_parse) echo 16384 ;;
    torch_snapshot) echo 65536 ;;
    c_abi) echo 4096 ;;
  esac
}

status=0
for t in "${targets[@]}"; do
  mkdir -p "fuzz/corpus/$t" "fuzz/artifacts/$t"
  args=(
    "fuzz/corpus/$t" "fuzz/seeds/$t"
    -max_total_time="$seconds"
    -timeout="${FUZZ_TIMEOUT:-10}"
    # 4 GiB: the c_abi target's simulated devices keep their bytes, and an offload
    # sleep of ~1.3 GB live copies them to a host buffer (2.3 GB resident, no leak).
    -rss_limit_mb=4096
    -max_len="$(max_len "$t")"
    -artifact_prefix="fuzz/artifacts/$t/"
    -print_final_stats=1
  )
  if [ -f "fuzz/dicts/$t.dict" ]; then
    args+=(-dict="fuzz/dicts/$t.dict")
  fi
  if [ -n "${FUZZ_JOBS:-}" ]; then
    args+=(-fork="$FUZZ_JOBS")
  fi
  echo "== fuzzing $t for $seconds s"
  log=fuzz/artifacts/$t/last-run.log
  if "$bin/$t" "${args[@]}" >"$log" 2>&1; then
    # The count of inputs run: the final stats line, or with -fork the last
    # progress line ("#N: cov: ...").
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    if [ -z "$runs" ]; then
      runs=$(sed -n 's/^#\([0-9][0-9]*\): .*/\1/p' "$log" | tail -n 1)
    fi
    echo "$t: no finding in $seconds s (${runs:-?} inputs run; log $log)"
  else
    status=1
    tail -n 60 "$log" >&2
    echo "$t: FINDING (above; the input is in fuzz/artifacts/$t/, the log in $log)" >&2
  fi
done
exit $status
