#!/usr/bin/python3
"""N engine processes share one Redis server while it is killed and restarted mid-run.

Starts Debian's redis-server on a free loopback port (entries owned by the server, bounded by
its allkeys-lru policy), launches N `hkv verify --offload redis:...` processes that share one
namespace (the model identity keeps models apart; every process serves the same model, so they
load each other's blocks), kills the server with SIGKILL and restarts it on the same port
`--restarts` times while they run, and collects each process's JSON report. Every process must
finish with every sequence equal to the dense reference; the restarts must have reached them
(server errors or reconnects counted). Prints a markdown table (or JSON with --json): per engine
its sequences, mismatches, hits loaded from Redis and their share of its sequences (hit rate),
failed loads, server errors; and the requests per second of all engines together. Exits 1 on any
wrong output or unfinished run.

  scripts/shared_redis_load.py --hkv build/release/tools/hkv/hkv [--engines 4] [--requests 200]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, work: str, password: str) -> subprocess.Popen:
    p = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", work, "--loglevel", "warning", "--daemonize", "no",
         "--maxmemory", "256mb", "--maxmemory-policy", "allkeys-lru", "--requirepass", password],
        stdout=subprocess.DEVNULL)
    deadline = time.time() + 5
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as c:
                c.sendall(f"AUTH {password}\r\nPING\r\n".encode())
                if b"PONG" in c.recv(64) or b"PONG" in c.recv(64):
                    return p
        except OSError:
            pass
        time.sleep(0.02)
    p.kill()
    sys.exit("shared_redis_load: redis-server did not start (apt-get install redis-server)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hkv", default=os.path.join(ROOT, "build/release/tools/hkv/hkv"))
    ap.add_argument("--model", default="ibm-ai-platform--Bamba-9B")
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--requests", type=int, default=200, help="per engine")
    ap.add_argument("--restarts", type=int, default=2)
    ap.add_argument("--restart-every", type=float, default=1.5, help="seconds between restarts")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="hkv-shared-redis-")
    port, password = free_port(), "load-test-pw"
    server = start_server(port, work, password)
    env = dict(os.environ, HKV_REDIS_NAMESPACE="shared-load", HKV_REDIS_PASSWORD=password,
               HKV_TIER_SECRET="load-test-secret")
    model = os.path.join(ROOT, "models", args.model)
    started = time.time()
    # Seeds 1 and 2 alternate: engines with one seed serve the same prompts (and share blocks).
    procs = [subprocess.Popen([args.hkv, "verify", model, "--requests", str(args.requests),
                               "--seed", str(1 + i % 2), "--weights-seed", "77", "--offload",
                               f"redis:127.0.0.1:{port}", "--json"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(args.engines)]
    restarts_done, restarts_mid_run = 0, 0
    try:
        while restarts_done < args.restarts:
            time.sleep(args.restart_every)
            running = sum(p.poll() is None for p in procs)
            server.send_signal(signal.SIGKILL)
            server.wait()
            server = start_server(port, work, password)
            restarts_done += 1
            restarts_mid_run += running == len(procs)
        outs = [p.communicate(timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        server.kill()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)
    wall = time.time() - started

    rows, ok = [], restarts_mid_run == args.restarts
    for i, (p, (out, err)) in enumerate(zip(procs, outs)):
        try:
            r = json.loads(out)
        except json.JSONDecodeError:
            print(f"engine {i}: exit {p.returncode}: {err.strip()[-500:]}", file=sys.stderr)
            ok = False
            continue
        o = r["offload"]
        row = {"engine": i, "seed": 1 + i % 2, "exit": p.returncode, "requests": r["requests"],
               "mismatches": r["mismatches"], "completed": r["completed"],
               "external_hits": o["external_hits"], "loads_completed": o["loads_completed"],
               "loads_failed": o["loads_failed"], "server_hits": o["server_hits"],
               "server_errors": o["server_errors"], "reconnects": o["reconnects"],
               "forgeries_refused": o["forgeries_refused"],
               "prefix_hit_tokens": r["features"]["prefix_hit_tokens"],
               # Sequences whose prefix came from Redis (a completed load each).
               "hit_rate": o["loads_completed"] / max(r["requests"], 1)}
        ok = ok and p.returncode == 0 and r["mismatches"] == 0 and r["completed"]
        ok = ok and o["server_errors"] + o["reconnects"] > 0
        rows.append(row)
    summary = {"engines": args.engines, "requests_per_engine": args.requests,
               "server_restarts": restarts_done, "restarts_while_all_ran": restarts_mid_run,
               "wall_s": round(wall, 2),
               "requests_per_s": round(sum(r["requests"] for r in rows) / wall, 1),
               "loads_completed": sum(r["loads_completed"] for r in rows),
               "loads_failed": sum(r["loads_failed"] for r in rows),
               "mismatches": sum(r["mismatches"] for r in rows), "ok": ok, "engines_detail": rows}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"{args.engines} engines x {args.requests} requests ({args.model}), one Redis "
              f"restarted {restarts_done} times ({restarts_mid_run} while every engine ran); "
              f"{summary['wall_s']} s wall, {summary['requests_per_s']} requests/s in all\n")
        print("| engine | seed | sequences | mismatches | hits loaded from Redis | hit rate "
              "| loads failed | server errors | reconnects |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['engine']} | {r['seed']} | {r['requests']} | {r['mismatches']} | "
                  f"{r['loads_completed']} | {r['hit_rate']:.1%} | {r['loads_failed']} | "
                  f"{r['server_errors']} | {r['reconnects']} |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
