#!/usr/bin/env bash
# Downloads, on this (Debian) machine, the .deb files of the libraries the GPU machine
# lacks (Catch2, Google Benchmark, liburing, CLI11, nlohmann-json) into .deps/, which
# scripts/gpu-check.sh unpacks into a private prefix there (docs/guide.md).
# .deps/ is ignored by git; pass it to the device run with `carry`.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps
cd .deps
packages=(catch2 libbenchmark-dev libbenchmark1debian liburing-dev liburing2 libcli11-dev nlohmann-json3-dev)
for p in "${packages[@]}"; do
  if ! ls "${p}"_*.deb >/dev/null 2>&1; then
    apt-get download "$p" 2>/dev/null || { apt-get update -qq && apt-get download "$p"; }
  fi
done
ls -1 *.deb
