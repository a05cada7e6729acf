#!/usr/bin/env bash
# Mutation testing of the core (issue 16): cargo-mutants on the pool (src/pool), the
# simulated driver (src/driver/sim) and the C ABI (src/ffi), each area with the test
# command that can catch its mutants; prints caught / missed / timeout / unviable per
# area and exits non-zero when an area's score (caught over viable mutants: caught,
# missed and timed out, less the equivalent ones listed in scripts/mutants-equivalent.txt)
# falls below the bar.
#
#   bash scripts/mutants.sh                 # every area (about 3,000 mutants: hours)
#   bash scripts/mutants.sh pool            # one area: pool, sim or ffi
#   MUTANTS_JOBS=4 bash scripts/mutants.sh  # parallel builds (cargo-mutants --jobs)
#   MUTANTS_BAR=95                          # the bar, percent (default 95)
#   MUTANTS_SHARD=1/4                       # one shard of each area (cargo-mutants --shard)
#   MUTANTS_ITERATE=1                       # keep mutants.out/<area> and skip the mutants
#                                           # it already saw caught (cargo-mutants --iterate)
#   MUTANTS_ARGS='-F grow'                  # more cargo-mutants arguments (a subset)
#
# Speed: a mutant costs an incremental build plus the CPU test binaries. The release
# profile is overridden for the run (opt-level 1, incremental, 256 codegen units):
# an edit of one pool function rebuilds in about 5 s on 2 cores instead of 51 s, and
# the tests run in about 15 s instead of 12 s. Overflow checks are on for the pass
# (issue 16: some mutants are caught only so). The GPU tests (all #[ignore]d), the
# loom model and the header check (its input is the source's signatures, which no
# mutant changes) are not built; the test modules themselves are not mutated.
#
# Not part of .ci/run (too slow); run it before resolving an issue that changes
# these files. Results: mutants.out/<area>/ (cargo-mutants' own output) and
# mutants.out/summary.txt.
set -euo pipefail
cd "$(dirname "$0")/.."

want_version=27
if ! cargo mutants --version 2>/dev/null | grep -q "cargo-mutants ${want_version}\."; then
  echo "== installing cargo-mutants ${want_version}"
  cargo install cargo-mutants --locked --version "^${want_version}"
fi

bar=${MUTANTS_BAR:-95}
jobs=${MUTANTS_JOBS:-1}
extra=()
[ -n "${MUTANTS_SHARD:-}" ] && extra+=(--shard "$MUTANTS_SHARD")
[ "${MUTANTS_ITERATE:-0}" = 1 ] && extra+=(--iterate)

# The CPU test binaries of the package: every tests/*.rs but the GPU ones, the loom
# model, the header check and the C programs (added for the ffi area).
cpu_tests=(--cargo-test-arg=--lib)
for t in tests/*.rs; do
  name=$(basename "$t" .rs)
  case "$name" in
    gpu_* | cuda_driver | loom | header | c_programs) ;;
    *) cpu_tests+=(--cargo-test-arg=--test --cargo-test-arg="$name") ;;
  esac
done
export CARGO_PROFILE_RELEASE_OPT_LEVEL=1 CARGO_PROFILE_RELEASE_INCREMENTAL=true \
  CARGO_PROFILE_RELEASE_CODEGEN_UNITS=256 CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=true
areas=("$@")
[ ${#areas[@]} -eq 0 ] && areas=(pool sim ffi)

equivalent=scripts/mutants-equivalent.txt
mkdir -p mutants.out
summary=mutants.out/summary.txt
: >"$summary"
failed=0

for area in "${areas[@]}"; do
  case "$area" in
    pool) files=(-f 'src/pool/*.rs') ;;
    sim) files=(-f 'src/driver/sim/*.rs') ;;
    # The C ABI's mutants also face the C and C++ programs: the test
    # tests/c_programs.rs builds the mutated static library and runs them when
    # FLARE_MUTANTS_C=1.
    ffi) files=(-f 'src/ffi/*.rs' -e src/ffi/tests.rs -e src/ffi/abi_tests.rs) ;;
    *) echo "unknown area $area (pool, sim or ffi)" >&2; exit 2 ;;
  esac
  echo "== $area"
  out=mutants.out/$area
  tests=("${cpu_tests[@]}")
  [ "$area" = ffi ] && tests+=(--cargo-test-arg=--test --cargo-test-arg=c_programs)
  if [ "${MUTANTS_ITERATE:-0}" = 1 ] && [ -d "$out" ]; then
    rm -rf "$out.tmp" && mkdir -p "$out.tmp" && cp -r "$out" "$out.tmp/mutants.out"
  else
    rm -rf "$out" "$out.tmp"
  fi
  # shellcheck disable=SC2086
  FLARE_MUTANTS_C=$([ "$area" = ffi ] && echo 1 || echo 0) \
    cargo mutants "${files[@]}" --output "$out.tmp" --jobs "$jobs" \
      --test-workspace=false --features testing --profile release \
      "${tests[@]}" "${extra[@]}" --minimum-test-timeout 60 \
      ${MUTANTS_ARGS:-} >/dev/null || true
  rm -rf "$out"
  mv "$out.tmp/mutants.out" "$out" 2>/dev/null || mv "$out.tmp" "$out"
  rm -rf "$out.tmp"
  python3 - "$out/outcomes.json" "$equivalent" "$area" "$bar" >>"$summary" <<'EOF' || failed=1
import json, sys
outcomes, equivalent, area, bar = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
eq = set()
try:
    for line in open(equivalent):
        line = line.split("#", 1)[0].strip()
        if line:
            eq.add(line.split(" -- ")[0].strip())
except FileNotFoundError:
    pass
counts = {"caught": 0, "missed": 0, "timeout": 0, "unviable": 0, "equivalent": 0}
missed = []
for o in json.load(open(outcomes))["outcomes"]:
    scenario = o.get("scenario")
    if not isinstance(scenario, dict):
        continue  # the baseline
    name = scenario["Mutant"]["name"] if "Mutant" in scenario else str(scenario)
    summary = o["summary"]
    kind = {"CaughtMutant": "caught", "MissedMutant": "missed", "Timeout": "timeout", "Unviable": "unviable"}.get(summary)
    if kind is None:
        continue
    if kind == "missed" and any(name.startswith(e) for e in eq):
        kind = "equivalent"
    counts[kind] += 1
    if kind == "missed":
        missed.append(name)
viable = counts["caught"] + counts["missed"] + counts["timeout"]
score = 100.0 * counts["caught"] / viable if viable else 100.0
ok = score >= bar
print(f"{area}: caught {counts['caught']}, missed {counts['missed']}, timeout {counts['timeout']}, "
      f"unviable {counts['unviable']}, equivalent {counts['equivalent']}: {score:.1f}% of {viable} viable "
      f"({'meets' if ok else 'below'} the bar of {bar:.0f}%)")
for m in missed:
    print(f"  missed: {m}")
sys.exit(0 if ok else 1)
EOF
done

cat "$summary"
exit $failed
