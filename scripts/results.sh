#!/usr/bin/env bash
# Regenerates every result table of docs/results.md from nothing but the repo:
# builds the release CLI, generates the traces, replays them and writes the tables
# (scripts/results.py). About 5 minutes on a 2-core machine after the build.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release --target hkv -- -j"${HKV_JOBS:-2}" >/dev/null
/usr/bin/python3 scripts/results.py --hkv build/release/tools/hkv/hkv
