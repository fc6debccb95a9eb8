"""A KV-aware router's view of hybridkv's KV events: subscribe over ZeroMQ, decode every batch the
way vLLM's consumers do (msgpack; a batch is [ts, events(, dp_rank)], an event a map tagged by
"type"), and check each field. Runs `hkv verify` as the publisher.

usage: kv_event_subscriber.py HKV MODEL_DIR
"""
import json
import socket
import subprocess
import sys
import time

import msgpack
import zmq

STORED_REQUIRED = {"type", "block_hashes", "parent_block_hash", "token_ids", "block_size",
                   "lora_id", "medium", "lora_name"}
STORED_OPTIONAL = {"extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"}
REMOVED_REQUIRED = {"type", "block_hashes", "medium"}
REMOVED_OPTIONAL = {"group_idx", "remaining_copy_counts"}
KINDS = {"full_attention", "mla_attention", "sliding_window", "sliding_window_mla",
         "chunked_local_attention", "mamba", "cross_attention"}
MEDIA = {"GPU", "CPU", "DISK", "REMOTE"}
# A checkpoint event carries the tokens since its parent: at most the manager's alignment, which
# is at most this many tokens for every bundled model.
MAX_STATE_TOKENS = 4096


def fail(message):
    print(f"kv_event_subscriber: FAIL: {message}")
    sys.exit(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_event(event, cached, counts):
    if not isinstance(event, dict) or "type" not in event:
        fail(f"event is not a tagged map: {event!r}")
    kind = event["type"]
    keys = set(event)
    if kind == "BlockStored":
        if not STORED_REQUIRED <= keys <= STORED_REQUIRED | STORED_OPTIONAL:
            fail(f"BlockStored fields {sorted(keys)}")
        hashes = event["block_hashes"]
        if not hashes or not all(isinstance(h, bytes) and len(h) == 16 for h in hashes):
            fail(f"block hashes {hashes!r}")
        parent = event["parent_block_hash"]
        if parent is not None and not (isinstance(parent, bytes) and len(parent) == 16):
            fail(f"parent {parent!r}")
        counts["with_parent"] += parent is not None
        if event["lora_id"] is not None or event["lora_name"] is not None:
            fail("lora of a base-model request")
        medium = event["medium"]
        if medium not in MEDIA:
            fail(f"medium {medium!r}")
        counts["media"][medium] = counts["media"].get(medium, 0) + len(hashes)
        group = event["group_idx"]
        spec = event["kv_cache_spec_kind"]
        if spec not in KINDS:
            fail(f"kv_cache_spec_kind {spec!r}")
        if ("kv_cache_spec_sliding_window" in event) != spec.startswith("sliding_window"):
            fail("sliding window field on a group that is not one (or missing)")
        tokens = event["token_ids"]
        if not all(isinstance(t, int) and t >= 0 for t in tokens):
            fail("token ids")
        size = event["block_size"]
        if spec == "mamba":
            if len(hashes) != 1 or len(tokens) != size or size <= 0 or size > MAX_STATE_TOKENS:
                fail(f"checkpoint of {size} tokens with {len(tokens)} token ids")
        elif spec != "cross_attention" and tokens and len(tokens) != size * len(hashes):
            fail(f"{len(tokens)} token ids for {len(hashes)} blocks of {size}")
        for h in hashes:
            cached.add((medium, group, h))
        counts["stored"] += len(hashes)
        counts["stored_with_tokens"] += len(hashes) if tokens else 0
        counts["kinds"].add(spec)
    elif kind == "BlockRemoved":
        if not REMOVED_REQUIRED <= keys <= REMOVED_REQUIRED | REMOVED_OPTIONAL:
            fail(f"BlockRemoved fields {sorted(keys)}")
        if event["medium"] not in MEDIA:
            fail(f"medium {event['medium']!r}")
        for h in event["block_hashes"]:
            # A router's index: every removal names a block it was told about, on that medium.
            key = (event["medium"], event["group_idx"], h)
            if key not in cached:
                fail(f"removal of a block never stored ({key[0]}, group {key[1]})")
            cached.discard(key)
        counts["removed"] += len(event["block_hashes"])
    elif kind == "AllBlocksCleared":
        if keys != {"type"}:
            fail(f"AllBlocksCleared fields {sorted(keys)}")
        cached.clear()
    else:
        fail(f"unknown event type {kind!r}")


def main():
    hkv, model = sys.argv[1], sys.argv[2]
    offload = sys.argv[3:4]
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv-events")
    extra = ["--offload", offload[0], "--restarts", "1"] if offload else []
    proc = subprocess.Popen([hkv, "verify", model, "--requests", "12", "--json",
                             "--kv-events", endpoint, "--kv-events-wait-ms", "30000"] + extra,
                            stdout=subprocess.PIPE, text=True)
    sub.connect(endpoint)
    expected_seq = 0
    cached = set()
    counts = {"stored": 0, "removed": 0, "stored_with_tokens": 0, "with_parent": 0,
              "kinds": set(), "media": {}}
    quiet_since = None
    while True:
        if sub.poll(200):
            topic, seq, payload = sub.recv_multipart()
            if topic != b"kv-events" or len(seq) != 8:
                fail(f"frames {topic!r} {seq!r}")
            seq = int.from_bytes(seq, "big", signed=True)
            if seq != expected_seq:
                fail(f"sequence {seq}, expected {expected_seq}")
            expected_seq += 1
            batch = msgpack.unpackb(payload, raw=False, strict_map_key=True)
            if not isinstance(batch, list) or len(batch) not in (2, 3):
                fail(f"batch {batch!r}")
            if not isinstance(batch[0], float) or abs(batch[0] - time.time()) > 600:
                fail(f"timestamp {batch[0]!r}")
            if not batch[1]:
                fail("empty batch")
            for event in batch[1]:
                check_event(event, cached, counts)
            quiet_since = None
        elif proc.poll() is not None:
            quiet_since = quiet_since or time.time()
            if time.time() - quiet_since > 1.0:
                break
    out, _ = proc.communicate()
    if proc.returncode != 0:
        fail(f"hkv verify exited {proc.returncode}")
    report = json.loads(out)
    if report["mismatches"] != 0 or report["kv_event_batches"] != expected_seq:
        fail(f"report {report['mismatches']} mismatches, {report['kv_event_batches']} batches "
             f"published, {expected_seq} received")
    if counts["stored"] == 0 or counts["removed"] == 0 or counts["stored_with_tokens"] == 0:
        fail(f"counts {counts}")
    if counts["with_parent"] == 0:
        fail("no stored event named its parent")
    tier_media = set(counts["media"]) - {"GPU"}
    if bool(offload) != bool(tier_media):
        fail(f"media {counts['media']} with offload {offload}")
    print(f"kv_event_subscriber: OK: {expected_seq} batches, {counts['stored']} blocks stored "
          f"({counts['stored_with_tokens']} with tokens, {counts['with_parent']} with a parent), "
          f"{counts['removed']} removed, kinds {sorted(counts['kinds'])}, media {counts['media']}")


if __name__ == "__main__":
    main()
