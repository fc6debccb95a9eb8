#!/usr/bin/env bash
# Runs a command with a redis-server (Debian's) started on a free loopback port for it; every
# argument "@PORT@" is replaced by the port. The server is killed when the command ends.
set -euo pipefail
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
  --loglevel warning --daemonize no >/dev/null &
server=$!
trap 'kill -9 $server 2>/dev/null || true; wait $server 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 100); do
  if redis-cli -p "$port" ping >/dev/null 2>&1; then break; fi
  sleep 0.05
done
args=()
for a in "$@"; do args+=("${a//@PORT@/$port}"); done
"${args[@]}"
