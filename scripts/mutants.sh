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
#   MUTANTS_SHARD=0/4                       # one shard of each area (cargo-mutants --shard,
#                                           # 0-based); the summary counts every shard run
#   MUTANTS_ITERATE=1                       # keep mutants.out/<area> and skip the mutants
#                                           # it already saw caught (cargo-mutants --iterate;
#                                           # not with MUTANTS_SHARD: it shards what is left,
#                                           # another subset)
#   MUTANTS_RETRY=1                         # only the mutants the area's earlier runs
#                                           # (every shard) missed, into
#                                           # mutants.out/<area>-retry: after new tests
#                                           # (a timeout, a hang, is not run again: it
#                                           # costs the whole test timeout each time;
#                                           # MUTANTS_RETRY=2 runs the timeouts too)
#   MUTANTS_REST=0/3                        # only the mutants no run has seen yet (the
#                                           # summary's "not run"), part K of N (by a hash
#                                           # of the name: a mutant's part does not change
#                                           # as other parts finish), into
#                                           # mutants.out/<area>-shard-rest-K-of-N; parts
#                                           # can run at once on different machines
#   MUTANTS_ARGS='-F grow'                  # more cargo-mutants arguments (a subset)
#   MUTANTS_REPORT=1                        # only the summary of what mutants.out holds
#
# Speed: a mutant costs an incremental build plus the CPU tests. The release profile
# is overridden for the run (opt-level 1, incremental, 256 codegen units); overflow
# checks are on (issue 16: some mutants are caught only so). The CPU tests are the
# area test binaries (tests/<area>/main.rs, below), run by nextest where it is
# installed, which stops at the first failing test. Measured on 2 cores with two jobs
# when the CPU tests were one binary: a pool mutant's build about 20 to 40 s, its
# tests about 2 s when caught and 22 s when not (about 3.5 mutants a minute); not
# measured since with the area binaries. The GPU tests (all #[ignore]d) and the loom
# model are not built; the test modules themselves (tests/, src/ffi/tests/) are not
# mutated. The ffi area's mutants that the Rust tests miss are tried again against
# the C and C++ programs (a second pass); the other areas' against the library's
# unit tests.
#
# Not part of .ci/run (too slow); run it before resolving an issue that changes
# these files. Results: mutants.out/<area>/ (cargo-mutants' own output; its lists,
# *.txt, and commit.txt, the commit it ran on) and mutants.out/summary.txt, run
# output that git ignores (docs/mutation-testing.md is the record of the scores). Where an area's source changed since a run, the summary
# says STALE and does not count that run's results on the changed lines (a change only
# to a file's trailing test module, which is not mutated and can only catch more,
# leaves it current); those mutants count as not run until a run sees them.
set -euo pipefail
cd "$(dirname "$0")/.."

want_version=27
if ! cargo mutants --version 2>/dev/null | grep -q "cargo-mutants ${want_version}\."; then
  echo "== installing cargo-mutants ${want_version}"
  cargo install cargo-mutants --locked --version "^${want_version}"
fi

bar=${MUTANTS_BAR:-95}
# K/N with 0 <= K < N (a part or shard), checked before anything runs.
for v in MUTANTS_REST MUTANTS_SHARD; do
  val=${!v:-}
  [ -z "$val" ] && continue
  if ! [[ "$val" =~ ^([0-9]+)/([1-9][0-9]*)$ ]] || [ "${BASH_REMATCH[1]}" -ge "${BASH_REMATCH[2]}" ]; then
    echo "$v=$val: expected K/N with 0 <= K < N (0-based part K of N)" >&2
    exit 2
  fi
done
jobs=${MUTANTS_JOBS:-1}
extra=()
# nextest, where installed (MUTANTS_TOOL=cargo for cargo test): it runs the binaries'
# tests side by side and stops at the first failure, where cargo test finishes every
# test of the failing binary. Measured here (2 cores, the run's profile): the whole
# CPU suite in 24 s against 30 s, and a caught mutant stops at its first failing test.
# At the first failure the tests still running are stopped (--max-fail=1:immediate),
# so a mutant that makes one test hang and another fail is caught, not a timeout.
# Its profile `mutants` (.config/nextest.toml) stops and fails a test that runs past
# 40 s (8 times the slowest): a mutant that makes a test hang is caught by that test, as
# by a watchdog test, not left to cargo-mutants' timeout of the whole run (which
# counts as not caught, and costs a minute or more).
if [ "${MUTANTS_TOOL:-}" != cargo ] && cargo nextest --version >/dev/null 2>&1; then
  extra+=(--test-tool=nextest --cargo-test-arg=--max-fail=1:immediate)
  export NEXTEST_PROFILE=mutants
fi
# Round-robin: each shard samples every file alike (mutant i on shard i % N).
# Not for an --iterate pass (a second pass over what the first missed: all of it).
shard=()
[ -n "${MUTANTS_SHARD:-}" ] && shard=(--shard "$MUTANTS_SHARD" --sharding round-robin)

# The CPU tests of the package: the test binary of every area (tests/<area>/main.rs:
# pool, segments, streams, thread_cache, tags, faults, sim, trace, c_abi) but the GPU
# one and the loom models, named to cargo test (--test AREA); a mutant rebuilds those
# test crates, not the GPU one. In c_abi, the C programs run only when
# FLARE_MUTANTS_C=1 (the ffi area's second pass, `pass` below), and the header check
# passes under every mutant outside src/ffi (its input is the source's signatures and
# cbindgen_sources in src/ffi). (Until issue 35 every CPU test file was a module of
# one generated binary, scripts/mutants_suite.rs: 23 s to rebuild against 178 s for
# the 26 binaries then, measured with cargo --timings on a one-line pool edit.)
# The library's own unit tests (--lib) are a second compile of the whole library in
# test mode (116 s of those 178): outside the ffi area (whose tests are mostly unit
# tests) they are a second pass, run only on the mutants the first one missed.
# Given to every cargo call (-C), so the build does not link the GPU tests either.
lib_tests=(-C=--lib)
cpu_tests=()
for main in tests/*/main.rs; do
  bin=$(basename "$(dirname "$main")")
  case "$bin" in
    gpu | loom) ;;
    *) cpu_tests+=(-C=--test -C="$bin") ;;
  esac
done
export CARGO_PROFILE_RELEASE_OPT_LEVEL=1 CARGO_PROFILE_RELEASE_INCREMENTAL=true \
  CARGO_PROFILE_RELEASE_CODEGEN_UNITS=256 CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=true
areas=("$@")
[ ${#areas[@]} -eq 0 ] && areas=(pool sim ffi)
for area in "${areas[@]}"; do
  case "$area" in
    pool | sim | ffi) ;;
    *) echo "unknown area $area (pool, sim or ffi)" >&2; exit 2 ;;
  esac
done

equivalent=scripts/mutants-equivalent.txt
mkdir -p mutants.out
summary=mutants.out/summary.txt
: >"$summary"
failed=0

# pass OUT ITERATE C_PROGRAMS ARGS...: one cargo-mutants run into OUT (mutants.out/AREA);
# with ITERATE=1 the mutants OUT already saw caught are skipped (--iterate); with
# C_PROGRAMS=1 tests/c_abi/c_programs.rs builds this tree's static library and runs
# the C and C++ programs against it.
pass() {
  local out=$1 iterate=$2 c_programs=$3
  shift 3
  local it=() unviable="" timeouts="" sh=("${shard[@]}")
  if [ "$iterate" = 1 ] && [ -d "$out" ]; then
    rm -rf "$out.tmp" && mkdir -p "$out.tmp" && cp -r "$out" "$out.tmp/mutants.out"
    it=(--iterate)
    sh=()
    # --iterate skips the unviable mutants of earlier passes too (its
    # previously_caught.txt lists them with the caught ones): keep their names.
    unviable=$(cat "$out/unviable.txt" "$out/unviable_earlier.txt" 2>/dev/null | sort -u || true)
    # A timeout is not caught, so --iterate would run it again unless a filter (-F)
    # leaves it out, and then its result would be lost: keep the names.
    timeouts=$(cat "$out/timeout.txt" "$out/timeout_earlier.txt" 2>/dev/null | sort -u || true)
  else
    rm -rf "$out" "$out.tmp"
  fi
  local rc=0
  # shellcheck disable=SC2086
  FLARE_MUTANTS_C=$c_programs \
    cargo mutants "$@" --output "$out.tmp" --jobs "$jobs" \
      --test-workspace=false --profile release \
      "${extra[@]}" "${sh[@]}" "${it[@]}" --minimum-test-timeout 60 \
      ${MUTANTS_ARGS:-} >/dev/null || rc=$?
  # 4: the unmutated tree's tests failed (a tree edited while the run copied it,
  # say), so nothing was tested: the earlier results stay as they were (an
  # --iterate pass would otherwise replace them with empty lists).
  if [ "$rc" = 4 ]; then
    echo "== $out: the tests fail on the unmutated tree; nothing tested, earlier results kept" >&2
    # Keep the baseline's log: a failure here that the checkout's own run does not show
    # (a test that fails only sometimes) is found from it.
    cp "$out.tmp/mutants.out/log/baseline.log" "$out.baseline-failed.log" 2>/dev/null &&
      echo "== the unmutated tree's test log: $out.baseline-failed.log" >&2
    rm -rf "$out.tmp"
    exit 4
  fi
  rm -rf "$out"
  mv "$out.tmp/mutants.out" "$out" 2>/dev/null || mv "$out.tmp" "$out"
  rm -rf "$out.tmp"
  [ -n "$unviable" ] && printf '%s\n' "$unviable" >"$out/unviable_earlier.txt"
  [ -n "$timeouts" ] && printf '%s\n' "$timeouts" >"$out/timeout_earlier.txt"
  return 0
}

# narrow NAME...: run_files, the -f arguments of the files the named mutants are in
# (the area's files when no name is given, and for the ffi area, whose file list
# excludes its test modules). cargo-mutants 27 applies neither -F nor -E to its
# struct-field deletions (sourcefrog/cargo-mutants#632): a filtered pass over the
# whole area runs every one of them again (34 in the pool), so a pass over a few
# names keeps to their files.
narrow() {
  run_files=("${files[@]}")
  if [ "$area" = ffi ] || [ $# -eq 0 ]; then
    return 0
  fi
  run_files=()
  while IFS= read -r f; do
    run_files+=(-f "$f")
  done < <(printf '%s\n' "$@" | cut -d: -f1 | sort -u)
}

# summarize AREA FILES...: the area's line of the summary (on stdout; status 1 when below
# the bar or not all run), and mutants.out/AREA.notrun, the names no run has a result
# for (MUTANTS_REST runs them).
summarize() {
  local area=$1 src listing
  shift
  case "$area" in
    pool) src=src/pool ;;
    sim) src=src/driver/sim ;;
    ffi) src="src/ffi :!src/ffi/tests" ;;
  esac
  # The area's mutants in the checkout as it is: a result under another name (code
  # moved since its run) is left out, a mutant with no result is "not run".
  listing=mutants.out/$area.list
  cargo mutants --list "$@" >"$listing"
  python3 - "$equivalent" "$area" "$bar" "$src" "$listing" mutants.out/"$area".notrun \
    mutants.out/"$area" \
    mutants.out/"$area"-shard-* mutants.out/"$area"-retry <<'EOF'
import os, re, subprocess, sys
equivalent, area, bar, src, listing, notrun = (sys.argv[1], sys.argv[2], float(sys.argv[3]),
                                               sys.argv[4], sys.argv[5], sys.argv[6])
outs = [d for d in sys.argv[7:] if os.path.isdir(d)]
current = {l.strip() for l in open(listing) if l.strip()}
def code(text):
    """A source file less its trailing test module (`#[cfg(test)]` or
    `#[cfg(all(test, ...))]` at column 0, then `mod NAME {` whose braces close on
    the file's last line): cargo-mutants does not mutate test modules, and tests added
    there can only catch more, so a run stays current when only they changed. Braces
    are counted naively: a count thrown off (a brace in a string) leaves the module
    in, so the run is called stale, never the other way."""
    if text is None:
        return None
    lines = text.split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    for i, line in enumerate(lines):
        if not re.match(r"#\[cfg\((all\()?test\b", line):
            continue
        j = i + 1
        while j < len(lines) and lines[j].startswith("#["):
            j += 1
        if j >= len(lines) or not re.match(r"(pub(\([a-z]+\))? )?mod \w+ \{$", lines[j]):
            continue
        depth = 0
        for k in range(j, len(lines)):
            depth += lines[k].count("{") - lines[k].count("}")
            if depth == 0:
                break
        if depth == 0 and k == len(lines) - 1:
            return "\n".join(lines[:i])
    return "\n".join(lines)
def show(commit, path):
    r = subprocess.run(["git", "show", f"{commit}:{path}"], capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None
def current_text(path):
    try:
        return open(path).read()
    except FileNotFoundError:
        return None
# A directory whose run saw other code of the area than the checkout's is stale where
# the code changed: its results on the lines a change touched (and on every later
# line of a file where a change added or removed lines: mutant names carry line
# numbers) are not counted, so those mutants count as not run (as cargo-mutants
# --in-diff would test only them again). The rest of its results stand: a mutant's
# outcome is taken to depend on the code around it, not on a change elsewhere.
dropped = {}  # directory -> {file: (first line dropped on, set of lines dropped)}
for d in outs:
    try:
        commit = open(os.path.join(d, "commit.txt")).readline().strip()
    except FileNotFoundError:
        print(f"{area}: {d} has no commit.txt (its run's code is unknown)")
        continue
    changed = subprocess.run(["git", "diff", "--name-only", commit, "--", *src.split()],
                             capture_output=True, text=True, check=True).stdout.split()
    stale = {}
    for f in changed:
        new_code = code(current_text(f))
        if code(show(commit, f)) == new_code:
            continue
        cut = len(new_code.split("\n")) if new_code is not None else 0
        hunks = subprocess.run(["git", "diff", "-U0", commit, "--", f],
                               capture_output=True, text=True, check=True).stdout
        start, lines = None, set()
        for m in re.finditer(r"^@@ -\d+(?:,(\d+))? \+(\d+)(?:,(\d+))? @@", hunks, re.M):
            old_n = int(m.group(1)) if m.group(1) is not None else 1
            c = int(m.group(2))
            new_n = int(m.group(3)) if m.group(3) is not None else 1
            if c > cut:
                continue  # in the trailing test module
            if old_n != new_n:
                start = c if start is None else min(start, c)
            lines.update(range(c, c + max(new_n, 1)))
        stale[f] = (start, lines)
    if stale:
        dropped[d] = stale
        print(f"{area}: STALE in part: {d} ran on {commit[:12]}; changed since: "
              + ", ".join(sorted(stale)) + " (its results on the changed lines not counted)")
def counted(d, name):
    f, _, rest = name.partition(":")
    hit = dropped.get(d, {}).get(f)
    if hit is None:
        return True
    try:
        line = int(rest.split(":", 1)[0])
    except ValueError:
        return False
    start, lines = hit
    return line not in lines and (start is None or line < start)
eq = set()
try:
    for line in open(equivalent):
        line = line.split("#", 1)[0].strip()
        if line:
            eq.add(line.split(" -- ")[0].strip())
except FileNotFoundError:
    pass
def names(f):
    found = set()
    for out in outs:
        try:
            found |= {l.strip() for l in open(os.path.join(out, f))
                      if l.strip() and counted(out, l.strip())}
        except FileNotFoundError:
            pass
    return found
# An --iterate pass lists what earlier passes caught, and the unviable mutants they
# saw, in previously_caught.txt; the latter are kept in unviable_earlier.txt.
unviable = (names("unviable.txt") | names("unviable_earlier.txt")) & current
caught = ((names("caught.txt") | names("previously_caught.txt")) & current) - unviable
missed = (names("missed.txt") & current) - caught
timeout = ((names("timeout.txt") | names("timeout_earlier.txt")) & current) - caught
not_run = current - unviable - caught - missed - timeout
with open(notrun, "w") as f:
    f.writelines(f"{m}\n" for m in sorted(not_run))
equiv = {m for m in missed if m in eq}
missed -= equiv
viable = len(caught) + len(missed) + len(timeout)
score = 100.0 * len(caught) / viable if viable else 100.0
ok = score >= bar and not not_run
shards = [d for d in outs if "-shard-" in d]
where = f" ({len(shards)} shard(s): {', '.join(os.path.basename(d) for d in shards)})" if shards else ""
print(f"{area}{where}: {len(current)} mutants, not run {len(not_run)}; "
      f"caught {len(caught)}, missed {len(missed)}, timeout {len(timeout)}, "
      f"unviable {len(unviable)}, equivalent {len(equiv)}: {score:.1f}% of {viable} viable "
      f"({'meets the bar' if ok else 'not all run, at the bar so far' if score >= bar else 'below the bar'} of {bar:.0f}%; "
      f"{100.0 * len(caught) / max(1, viable + len(equiv)):.1f}% counting the equivalent as missed)")
for m in sorted(missed):
    print(f"  missed: {m}")
for m in sorted(timeout):
    print(f"  timeout: {m}")
sys.exit(0 if ok else 1)
EOF
}

for area in "${areas[@]}"; do
  case "$area" in
    # (A glob's `*` does not match `/`; `**/` matches any folders, none included.)
    pool) files=(-f 'src/pool/**/*.rs') ;;
    sim) files=(-f 'src/driver/sim/**/*.rs') ;;
    ffi) files=(-f 'src/ffi/**/*.rs' -e 'src/ffi/tests/**') ;;
    *) echo "unknown area $area (pool, sim or ffi)" >&2; exit 2 ;;
  esac
  echo "== $area"
  # A shard's results stay beside the other shards' (mutants.out/AREA-shard-K-of-N),
  # and the summary counts them together: the shards of an area can run at different
  # times or on different machines (copy their directories in), on the same code.
  retry=()
  picked=()
  if [ "${MUTANTS_REPORT:-0}" = 1 ]; then
    out=mutants.out/$area
  elif [ "${MUTANTS_RETRY:-0}" != 0 ]; then
    # The names the area's runs (every shard, earlier retries) missed and none
    # caught, less those listed equivalent, each as an exact -F regex; a retry's catch counts over an earlier miss
    # in the summary. Earlier retries' results are kept (--iterate).
    out=mutants.out/$area-retry
    dirs=(mutants.out/"$area" mutants.out/"$area"-shard-* "$out")
    while IFS= read -r name; do
      retry+=(-F "^$(printf '%s' "$name" | sed 's/[][\\.^$*+?(){}|]/\\&/g')\$")
      picked+=("$name")
    done < <(comm -23 \
      <(for d in "${dirs[@]}"; do
        cat "$d"/missed.txt 2>/dev/null || :
        [ "$MUTANTS_RETRY" = 2 ] && { cat "$d"/timeout{,_earlier}.txt 2>/dev/null || :; }
      done | sort -u) \
      <({
        for d in "${dirs[@]}"; do cat "$d"/{caught,previously_caught}.txt 2>/dev/null || :; done
        # The equivalent mutants: no test can catch them.
        sed -e 's/#.*//' -e 's/ -- .*//' -e 's/[[:space:]]*$//' -e '/^$/d' "$equivalent"
      } | sort -u))
  elif [ -n "${MUTANTS_REST:-}" ]; then
    # The names the summary counts as not run (no result from any run, or a result
    # on a line changed since), those whose hash falls in part K of N. Computed from
    # the results as they stand before this run; the part's own earlier results are
    # kept (--iterate), so a part can be run again after it was stopped.
    out=mutants.out/$area-shard-rest-${MUTANTS_REST/\//-of-}
    summarize "$area" "${files[@]}" >/dev/null || :
    while IFS= read -r name; do
      retry+=(-F "^$(printf '%s' "$name" | sed 's/[][\\.^$*+?(){}|]/\\&/g')\$")
      picked+=("$name")
    done < <(python3 -c '
import hashlib, sys
k, n = (int(x) for x in sys.argv[1].split("/"))
for line in open(sys.argv[2]):
    name = line.rstrip("\n")
    if name and int(hashlib.sha1(name.encode()).hexdigest(), 16) % n == k:
        print(name)' "$MUTANTS_REST" "mutants.out/$area.notrun")
    echo "== $area: $((${#retry[@]} / 2)) not-run mutants in part $MUTANTS_REST (of $(wc -l <"mutants.out/$area.notrun"))" >&2
  elif [ -n "${MUTANTS_SHARD:-}" ]; then
    out=mutants.out/$area-shard-${MUTANTS_SHARD/\//-of-}
    rm -rf "mutants.out/$area"
  else
    out=mutants.out/$area
    rm -rf "mutants.out/$area"-shard-* "mutants.out/$area"-retry
  fi
  # The commit the run sees (its lists, *.txt, are kept beside it: the shards of the
  # pool take more than one session on a small machine).
  seen=$({
    git rev-parse HEAD
    git status --porcelain -- src tests | sed 's/^/uncommitted: /'
  })
  iterate=${MUTANTS_ITERATE:-0}
  [ "${MUTANTS_RETRY:-0}" != 0 ] && iterate=1
  [ -n "${MUTANTS_REST:-}" ] && iterate=1
  if [ "${MUTANTS_REPORT:-0}" = 1 ]; then
    : # the summary of what mutants.out holds, nothing run
  elif [ "${MUTANTS_RETRY:-0}" != 0 ] && [ ${#retry[@]} -eq 0 ]; then
    echo "== $area: nothing missed to retry"
  elif [ -n "${MUTANTS_REST:-}" ] && [ ${#retry[@]} -eq 0 ]; then
    echo "== $area: nothing left to run in part $MUTANTS_REST"
  elif [ "$area" = ffi ]; then
    # The Rust tests through the C ABI (src/ffi/tests/, one module per file of
    # src/ffi) and the header check (which reads cbindgen_sources) first; then the
    # mutants they miss face the C and C++ programs too (tests/c_abi/c_programs.rs
    # with FLARE_MUTANTS_C=1: a build of the static library per mutant, slow, so
    # only for those).
    pass "$out" "$iterate" 0 "${files[@]}" "${retry[@]}" "${lib_tests[@]}" "${cpu_tests[@]}"
    if [ -s "$out/missed.txt" ]; then
      echo "== $area: the missed mutants against the C and C++ programs"
      pass "$out" 1 1 "${files[@]}" "${retry[@]}" "${lib_tests[@]}" "${cpu_tests[@]}"
    fi
  else
    narrow "${picked[@]}"
    pass "$out" "$iterate" 0 "${run_files[@]}" "${retry[@]}" "${cpu_tests[@]}"
    # The mutants this pass missed or timed out (a hang the suite has no test for
    # may break a unit test at once: nextest then stops the hang), less those listed
    # equivalent.
    again=()
    again_names=()
    while IFS= read -r name; do
      again+=(-F "^$(printf '%s' "$name" | sed 's/[][\\.^$*+?(){}|]/\\&/g')\$")
      again_names+=("$name")
    done < <(comm -23 <(cat "$out/missed.txt" "$out/timeout.txt" 2>/dev/null | sort -u) \
      <(sed -e 's/#.*//' -e 's/ -- .*//' -e 's/[[:space:]]*$//' -e '/^$/d' "$equivalent" |
        sort -u))
    # (With no filter, cargo-mutants would run every mutant of the area.)
    if [ ${#again[@]} -gt 0 ]; then
      echo "== $area: the missed and timed-out mutants against the library's unit tests too"
      narrow "${again_names[@]}"
      pass "$out" 1 0 "${run_files[@]}" "${again[@]}" "${lib_tests[@]}" "${cpu_tests[@]}"
    fi
  fi
  # (No directory when nothing was left to run.)
  if [ "${MUTANTS_REPORT:-0}" != 1 ] && [ -d "$out" ]; then
    printf '%s\n' "$seen" >"$out/commit.txt"
  fi
  summarize "$area" "${files[@]}" >>"$summary" || failed=1
done

cat "$summary"
exit $failed
