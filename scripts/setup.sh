#!/usr/bin/env bash
# Installs the Debian packages hybridkv builds with; does nothing when they are all present.
set -euo pipefail

packages=(g++ cmake ninja-build ccache pkg-config libgtest-dev libgmock-dev libbenchmark-dev
          nlohmann-json3-dev libcli11-dev libfmt-dev libxxhash-dev clang-format clang libclang-rt-14-dev gnuplot-nox
          python3 python3-dev pybind11-dev python3-numpy python3-pytest
          redis-server libhiredis-dev libsodium-dev libzmq3-dev cppzmq-dev libmsgpack-cxx-dev python3-zmq
          python3-msgpack python3-venv python3-pip python3-setuptools python3-wheel)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: need root to install packages" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
