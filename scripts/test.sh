#!/usr/bin/env bash
# The whole test suite: install, build with warnings as errors, run every test, run them again
# under AddressSanitizer + UndefinedBehaviorSanitizer, and check formatting. Idempotent: build
# directories under build/ and ccache make a second run fast.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
jobs=${HKV_JOBS:-2}

echo "== format check"
bash scripts/format.sh --check

for preset in dev asan; do
  echo "== build ($preset)"
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset" -- -j"$jobs"
  echo "== test ($preset)"
  ctest --preset "$preset" -j"$jobs"
done

echo "== fuzz (short run; scripts/fuzz.sh SECONDS for longer)"
bash scripts/fuzz.sh "${HKV_FUZZ_SECONDS:-30}"
