#!/usr/bin/env bash
# What building vcdn needs beyond a Rust toolchain, installed from Debian's
# packages when missing (idempotent; both README commands run it):
# - cmake, g++ and libcurl's headers: rdkafka builds librdkafka from source
#   (the telemetry datasink's Kafka client);
# - clang: the SRv6 data path's BPF programs are compiled for the running
#   kernel at build time (vcdn-srv6);
# - libelf and zlib headers, pkg-config: libbpf, which loads them.
set -euo pipefail

missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v g++ >/dev/null 2>&1 || missing+=(g++)
command -v clang >/dev/null 2>&1 || missing+=(clang)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
[[ -f /usr/include/x86_64-linux-gnu/curl/curl.h || -f /usr/include/curl/curl.h ]] || missing+=(libcurl4-openssl-dev)
[[ -f /usr/include/libelf.h ]] || missing+=(libelf-dev)
[[ -f /usr/include/zlib.h ]] || missing+=(zlib1g-dev)
if ((${#missing[@]})); then
  echo "== installing ${missing[*]} (to build vcdn)"
  SUDO=$([[ $(id -u) -eq 0 ]] && echo "" || echo sudo)
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" \
    || { $SUDO apt-get update -q && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"; }
fi
