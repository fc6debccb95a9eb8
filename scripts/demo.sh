#!/usr/bin/env bash
# The main job: install, build the CLI, replay a chat trace through vLLM's manager (the baseline)
# and hkv's manager under three allocators, and show what the planner sees in real models.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset dev >/dev/null
cmake --build --preset dev --target hkv -- -j2 >/dev/null
hkv=build/dev/tools/hkv/hkv

banner() { printf '\n==== %s ====\n' "$*"; }

# 8 GiB: short enough that the modes differ (at 16 GiB nobody preempts or waits on this trace).
banner "Gemma-2-9B, 8 GiB: built-in chat trace (1000 requests): vLLM's manager, then hkv's uniform, padded and hybridkv"
"$hkv" simulate models/google--gemma-2-9b --memory 8GiB

banner "Bamba-9B (Mamba-2 hybrid), 8 GiB: the same trace"
"$hkv" simulate models/ibm-ai-platform--Bamba-9B --memory 8GiB --plot build/bamba-simulate.png
echo "plot of the four runs over time: build/bamba-simulate.png"

banner "Gemma-2-9B at its native 8K context (1:1 sliding/full): the RFC's 25% uniform waste"
"$hkv" plan models/google--gemma-2-9b --seq-len 8192

banner "Ministral-8B planned for its 128K context (1 full : 3 sliding): 56.25% uniform waste"
"$hkv" plan models/mistralai--Ministral-8B-Instruct-2410 --max-model-len 131072

banner "Llama-3.2-11B-Vision, 43 text tokens + one 4-tile image (6404 encoder tokens): 79.6%"
"$hkv" plan models/meta-llama--Llama-3.2-11B-Vision --seq-len 43 --encoder-tokens 6404 \
  --max-model-len 8192

banner "Bamba-9B (Mamba-2 + 3 attention layers): state pages and attention pages side by side"
"$hkv" plan models/ibm-ai-platform--Bamba-9B --seq-len 4096

banner "Bamba-9B offloaded to a disk tier: a restarted engine reloads prefixes and Mamba checkpoints, exact vs dense"
"$hkv" verify models/ibm-ai-platform--Bamba-9B --offload disk --restarts 1

banner "Jamba through a Redis server started on loopback: two engines share prefixes through it, exact vs dense"
bash tests/tools/with_redis.sh "$hkv" verify models/ai21labs--Jamba-v0.1 \
  --offload redis:127.0.0.1:@PORT@ --restarts 1
