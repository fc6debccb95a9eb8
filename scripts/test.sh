#!/usr/bin/env bash
# The whole test suite: install, build with warnings as errors, run every test, fuzz the config
# loader briefly, then run every test again under AddressSanitizer + UndefinedBehaviorSanitizer.
# The format check comes first. Idempotent: build directories under build/ and ccache make a
# second run fast. The sanitizer ctest summary is the last thing printed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
jobs=${HKV_JOBS:-2}

echo "== format check"
bash scripts/format.sh --check

run_suite() {
  local preset=$1
  echo "== build ($preset)"
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset" -- -j"$jobs"
  echo "== test ($preset)"
  ctest --preset "$preset" -j"$jobs"
}

run_suite dev

echo "== fuzz (short run; scripts/fuzz.sh SECONDS for longer)"
bash scripts/fuzz.sh "${HKV_FUZZ_SECONDS:-30}"

run_suite asan
