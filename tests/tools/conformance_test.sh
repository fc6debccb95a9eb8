#!/usr/bin/env bash
# Conformance of `hkv simulate` with scripts/replay_reference.py, an independent Python
# implementation of replay.md for one full-attention group: on a generated trace with a memory
# small enough for preemptions and evictions, every figure and the per-step CSV must be equal,
# with blocks published when a step is allocated (the default) and when it is committed. The
# reference evicts the least recently freed block first, so shared prefixes are not kept longer
# here (--branch-bonus 0; docs/manager.md, "Shared prefixes kept longer"), nor are chains put on
# probation (--thrash-guard off; docs/manager.md, "Thrash guard"). Admissions are checked with no
# headroom and with hybridkv's default of 2 decode steps (docs/manager.md, "Admission headroom").
set -euo pipefail
hkv=$1
root=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$hkv" trace gen --requests 300 --seed 7 --session-gap 50 -o "$dir/trace.jsonl" 2>/dev/null
for case in "allocate 0" "commit 0" "allocate 2" "commit 2"; do
  read -r publish headroom <<< "$case"
  flag=""
  ref_flag="--publish-at-allocate"
  if [ "$publish" = commit ]; then flag="--publish-at-commit"; ref_flag=""; fi
  "$hkv" simulate "$root/models/meta-llama--Llama-3.1-8B" --trace "$dir/trace.jsonl" --memory 3GiB \
    --allocator hybridkv --branch-bonus 0 --thrash-guard off --admission-headroom "$headroom" \
    --json --csv "$dir/hkv" $flag > "$dir/hkv.json"
  blocks=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["runs"][0]["num_blocks"] + 1)' "$dir/hkv.json")
  python3 "$root/scripts/replay_reference.py" "$dir/trace.jsonl" --num-blocks "$blocks" \
    --block-tokens 16 --admission-headroom "$headroom" --csv "$dir/ref.csv" $ref_flag > "$dir/ref.json"
  echo "publishing at $publish, admission headroom $headroom:"
  python3 - "$dir/hkv.json" "$dir/ref.json" <<'PY'
import json, sys
h = json.load(open(sys.argv[1]))["runs"][0]
r = json.load(open(sys.argv[2]))
keys = ["steps", "preemptions", "hit_rate", "hit_rate_incl_readmissions", "peak_blocks_used",
        "peak_running", "scheduled_tokens"]
bad = [k for k in keys if h[k] != r[k]]
for k in keys:
    print(f"{k}: hkv {h[k]} reference {r[k]}")
if h["preemptions"] == 0:
    sys.exit("the trace did not preempt: the check would be too weak")
sys.exit(f"figures differ: {bad}" if bad else 0)
PY
  cmp "$dir/hkv/hybridkv.csv" "$dir/ref.csv"
done
echo "conformance: identical figures and per-step log, publishing at Allocate and at Commit, with and without admission headroom"
