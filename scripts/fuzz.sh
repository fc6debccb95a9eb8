#!/usr/bin/env bash
# Builds the libFuzzer targets with clang and runs each for a short, fixed time from the bundled
# configs as seeds. Usage: scripts/fuzz.sh [seconds per target, default 30]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -- -j"${HKV_JOBS:-2}"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/corpus" "$work/seeds"
i=0
for f in models/*/config.json tests/data/configs/*.json; do
  cp "$f" "$work/seeds/seed$i.json"
  i=$((i + 1))
done
echo "== fuzz config_fuzz for ${seconds}s"
rc=0
(cd "$work" && "$OLDPWD/build/fuzz/fuzz/config_fuzz" -max_total_time="$seconds" \
  -rss_limit_mb=2048 -print_final_stats=1 corpus seeds >"$work/log" 2>&1) || rc=$?
grep -E '^stat::(number_of_executed_units|new_units_added)' "$work/log" || true
if [ "$rc" -ne 0 ]; then
  echo "fuzz: config_fuzz failed (exit $rc); its report:" >&2
  grep -v '^#' "$work/log" | tail -60 >&2
  ls "$work" >&2
  exit 1
fi
