#!/usr/bin/env bash
# Runs a command with a redis-server (Debian's) started on a free loopback port for it; every
# argument "@PORT@" is replaced by the port, "@SOCKET@" by the server's Unix socket. Server
# arguments in HKV_TEST_REDIS_ARGS (e.g. "--requirepass pw") are added. The server is killed when
# the command ends.
set -euo pipefail
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
# shellcheck disable=SC2086 # HKV_TEST_REDIS_ARGS is a list of words
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
  --unixsocket "$dir/redis.sock" --loglevel warning --daemonize no ${HKV_TEST_REDIS_ARGS:-} >/dev/null &
server=$!
trap 'kill -9 $server 2>/dev/null || true; wait $server 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 100); do
  if [ -S "$dir/redis.sock" ] && redis-cli -p "$port" ping >/dev/null 2>&1; then break; fi
  sleep 0.05
done
args=()
for a in "$@"; do
  a="${a//@PORT@/$port}"
  args+=("${a//@SOCKET@/$dir/redis.sock}")
done
"${args[@]}"
