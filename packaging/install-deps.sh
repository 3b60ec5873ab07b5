#!/usr/bin/env bash
# Installs everything mtcfs needs to build, test and run, from Debian 12's
# packages. Idempotent and quick when everything is already there.
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config
  fuse3 libfuse3-dev
  liblmdb-dev lmdb-utils
  libyaml-dev libcurl4-openssl-dev libssl-dev
  libisal-dev libxxhash-dev libjansson-dev libmicrohttpd-dev libcmocka-dev
  python3 python3-venv python3-yaml iproute2 procps psmisc file dpkg-dev groff-base
  clang libclang-rt-14-dev gnuplot-nox curl openssl
  lintian prometheus systemd
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: need root to install: ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
