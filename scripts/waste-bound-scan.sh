#!/usr/bin/env bash
# Replays the shipped traces under best-fit with a range of waste bounds and prints
# the peak physical GiB of each (the measurement behind the default bound; see
# docs/benchmarks.md). Usage: bash scripts/waste-bound-scan.sh [PERCENT...]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin flare-replay
bounds=("$@"); [ ${#bounds[@]} -gt 0 ] || bounds=(0 10 20 25 30 35 37 38 50 100 200 400 100000)
echo "exact:  $(./target/release/flare-replay --policy exact --json tests/data/*.trace | python3 -c 'import json,sys; print("  ".join("%.2f" % (json.loads(l)["peak_physical_bytes"]/2**30) for l in sys.stdin))')"
for w in "${bounds[@]}"; do
  printf '%6s%%: ' "$w"
  ./target/release/flare-replay --policy best-fit --json --best-fit-waste-percent "$w" tests/data/*.trace |
    python3 -c 'import json,sys; print("  ".join("%.2f" % (json.loads(l)["peak_physical_bytes"]/2**30) for l in sys.stdin))'
done
echo "columns: $(ls tests/data/*.trace | xargs -n1 basename | tr '\n' ' ')"
