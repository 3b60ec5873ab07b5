#!/usr/bin/env bash
# Installs everything mtcfs needs to build, test and run, from Debian's
# packages (Debian 12 "bookworm" or 13 "trixie"). Idempotent and quick when
# everything is already there.
#
# libfuse >= 3.17 gives mtcfs kernel FUSE passthrough (reads of committed and
# restored files never reach the daemon). Debian 13 ships it; on Debian 12
# this script builds Debian's own trixie fuse3 source package and installs
# the resulting libfuse3-4, libfuse3-dev and fuse3 debs. If that fails,
# bookworm's libfuse 3.14 stays and mtcfs builds without passthrough.
# MTCFS_FUSE317=0 skips the source build (keep 3.14).
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config
  fuse3 libfuse3-dev
  liblmdb-dev lmdb-utils
  libyaml-dev libcurl4-openssl-dev libssl-dev
  libisal-dev libxxhash-dev libjansson-dev libmicrohttpd-dev libcmocka-dev
  python3 python3-venv python3-yaml iproute2 procps psmisc file dpkg-dev groff-base
  clang gnuplot-nox curl openssl
  libgrpc-dev libprotobuf-c-dev protobuf-c-compiler
  lintian prometheus systemd debootstrap docker.io
)

say() { echo "install-deps: $*" >&2; }

installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}

need_root() {
  if [ "$(id -u)" -ne 0 ]; then
    say "need root to install: $*"
    exit 1
  fi
}

apt_updated=0
apt_install() {
  need_root "$@"
  export DEBIAN_FRONTEND=noninteractive
  if [ "$apt_updated" -eq 0 ]; then
    apt-get update -q
    apt_updated=1
  fi
  apt-get install -y -q --no-install-recommends "$@"
}

install_missing() {
  local missing=() p
  for p in "$@"; do
    installed "$p" || missing+=("$p")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    apt_install "${missing[@]}"
  fi
}

install_missing "${PKGS[@]}"

# The sanitizer and libFuzzer runtimes ship per clang major version
# (libclang-rt-14-dev on 12, libclang-rt-19-dev on 13): take the one that
# matches the clang just installed.
clang_major=$(clang -dumpversion | cut -d. -f1)
install_missing "libclang-rt-${clang_major}-dev"

. /etc/os-release
codename=${VERSION_CODENAME:-}

fuse_ok() { pkg-config --atleast-version=3.17 fuse3; }

# Debian 12: build trixie's fuse3 from source. Runs as a background
# subshell that is waited for, so errexit holds inside it (bash ignores
# set -e in a function called as an `if` condition) and any failure falls
# back to the 3.14 that is installed already.
build_fuse317() (
  set -euo pipefail
  local list=/etc/apt/sources.list.d/mtcfs-trixie-src.sources
  if [ ! -f "$list" ]; then
    cat >"$list" <<'EOF'
# Added by mtcfs packaging/install-deps.sh: the source of Debian 13's fuse3
# (libfuse 3.17, kernel FUSE passthrough), built into debs on Debian 12.
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  local dir=/var/cache/mtcfs/fuse3-build
  rm -rf "$dir"
  mkdir -p "$dir"
  cd "$dir"
  # apt-get source runs as _apt where it can: let it write here.
  chown _apt "$dir" 2>/dev/null || true
  apt-get source -q fuse3/trixie
  local src
  src=$(find . -maxdepth 1 -mindepth 1 -type d -name 'fuse3-*' | head -n 1)
  [ -n "$src" ]
  # trixie split systemd's pkg-config files into systemd-dev, which
  # bookworm lacks; the build only asks it where udev rules go and installs
  # none without it (the kernel's /dev/fuse needs no rule).
  sed -i '/^ *systemd-dev,\?$/d' "$src/debian/control"
  # Build dependencies from the unpacked debian/control, resolved against
  # this release's binaries (trixie's are not in our sources).
  apt-get build-dep -y -q "$src"
  (cd "$src" && DEB_BUILD_OPTIONS="nocheck ${DEB_BUILD_OPTIONS:-}" \
     DEB_BUILD_PROFILES="noudeb" dpkg-buildpackage -b -uc -us -j"$(nproc)")
  apt-get install -y -q --no-install-recommends \
    ./libfuse3-4_*.deb ./libfuse3-dev_*.deb ./fuse3_*.deb
  fuse_ok
)

if fuse_ok; then
  :
elif [ "$codename" = bookworm ] && [ "${MTCFS_FUSE317:-1}" != 0 ]; then
  need_root "libfuse 3.17 (built from trixie's fuse3 source)"
  say "libfuse $(pkg-config --modversion fuse3) found; building Debian 13's fuse3 (3.17) from source"
  build_fuse317 &
  if wait "$!"; then
    say "libfuse $(pkg-config --modversion fuse3) installed: FUSE passthrough available"
  else
    say "building trixie's fuse3 failed: keeping libfuse $(pkg-config --modversion fuse3)" \
        "(mtcfs builds and runs, without FUSE passthrough)"
  fi
else
  say "libfuse $(pkg-config --modversion fuse3): mtcfs builds without FUSE passthrough"
fi
