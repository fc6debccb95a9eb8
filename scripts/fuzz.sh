#!/usr/bin/env bash
# Builds the libFuzzer targets with clang and runs each for a short, fixed time, seeded with the
# bundled configs (config_fuzz), a small generated trace (trace_fuzz), or a valid block stream,
# tier-transfer message and disk tier entry file (connector_fuzz writes them); manager_fuzz starts from nothing (its input
# is an operation sequence).
# Usage: scripts/fuzz.sh [seconds per target, default 30]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
root=$PWD
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -- -j"${HKV_JOBS:-2}"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/config/seeds" "$work/trace/seeds" "$work/manager/seeds" "$work/connector/seeds"
i=0
for f in models/*/config.json tests/data/configs/*.json; do
  cp "$f" "$work/config/seeds/seed$i.json"
  i=$((i + 1))
done
build/fuzz/tools/hkv/hkv trace gen --requests 4 --max-prompt 300 --seed 1 \
  -o "$work/trace/seeds/seed.jsonl" 2>/dev/null
# Prompts short enough that trace_fuzz replays the trace (its max model len is 96).
build/fuzz/tools/hkv/hkv trace gen --requests 6 --max-prompt 60 --seed 2 \
  -o "$work/trace/seeds/replayed.jsonl" 2>/dev/null

HKV_FUZZ_WRITE_SEEDS="$work/connector/seeds" build/fuzz/fuzz/connector_fuzz

for target in config trace manager connector; do
  echo "== fuzz ${target}_fuzz for ${seconds}s"
  dir="$work/$target"
  mkdir -p "$dir/corpus"
  rc=0
  (cd "$dir" && "$root/build/fuzz/fuzz/${target}_fuzz" -max_total_time="$seconds" \
    -rss_limit_mb=2048 -print_final_stats=1 corpus seeds >"$dir/log" 2>&1) || rc=$?
  grep -E '^stat::(number_of_executed_units|new_units_added)' "$dir/log" || true
  if [ "$rc" -ne 0 ]; then
    echo "fuzz: ${target}_fuzz failed (exit $rc); its report:" >&2
    grep -v '^#' "$dir/log" | tail -60 >&2
    ls "$dir" >&2
    exit 1
  fi
done
