#!/usr/bin/env bash
# Build CRIU (checkpoint/restore for pause, resume, snapshots and fork on the jail driver) and
# print the path of the binary. Debian 12's CRIU 3.17 cannot run on kernels >= 6.x with the
# vvar_vclock vDSO, and trixie's 4.1.1 cannot dump a TCP socket on kernels >= 6.16 (the
# SO_PASSCRED change; fixed in 4.2), so 4.2.1 is built from Debian sid's source, fetched and
# verified by apt through a private configuration (the system's sources stay untouched). Sid
# drops old versions: when 4.2.1 is gone, the newest version sid has is built instead, if it is
# 4.2 or later (checked), so a fresh machine does not break when the mirror moves on.
#
# The binary is cached outside the clone, keyed by this script's content hash:
#   $BULKHEAD_CACHE_DIR/criu-<hash>/criu        (default cache dir /var/cache/bulkhead)
# A cached binary that still answers `criu --version` is reused; otherwise it is rebuilt.
#
# Usage: scripts/criu.sh            # build if missing, print the binary's path on stdout
# Progress goes to stderr. Needs root (apt-get) on Debian 12.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

DEB_VERSION="${BULKHEAD_CRIU_DEB_VERSION:-4.2.1-1}"
MIRROR="${BULKHEAD_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
CACHE="${BULKHEAD_CACHE_DIR:-/var/cache/bulkhead}"
KEY=$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-16)
OUT="$CACHE/criu-$KEY"
BIN="$OUT/criu"

log() { echo "criu: $*" >&2; }

if [ -x "$BIN" ] && "$BIN" --version >/dev/null 2>&1; then
    echo "$BIN"
    exit 0
fi

DEPS=(build-essential pkg-config libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler
    protobuf-compiler python3-protobuf libnl-3-dev libcap-dev libnet1-dev libaio-dev
    libgnutls28-dev libbsd-dev uuid-dev libnftables-dev libdrm-dev xz-utils)
missing=()
for p in "${DEPS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "installing build dependencies: ${missing[*]}"
    apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
fi

WORK=$(mktemp -d /var/tmp/bulkhead-criu.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK"/apt/{lists/partial,cache/archives/partial}
printf 'deb-src %s sid main\n' "$MIRROR" >"$WORK/apt/sources.list"
A=(-o "Dir::Etc::SourceList=$WORK/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$WORK/apt/lists" -o "Dir::Cache=$WORK/apt/cache")
apt-get "${A[@]}" update -q >&2
available=$(apt-cache "${A[@]}" showsrc criu 2>/dev/null | awk '/^Version:/ {print $2}' | sort -V -r -u)
if ! grep -qxF "$DEB_VERSION" <<<"$available"; then
    newest=$(head -n 1 <<<"$available")
    if [ -z "$newest" ] || ! dpkg --compare-versions "$newest" ge 4.2; then
        log "no CRIU 4.2 or later on $MIRROR (sid has: ${available:-nothing}); set BULKHEAD_DEBIAN_MIRROR to a Debian mirror with CRIU >= 4.2 in sid"
        exit 1
    fi
    log "CRIU $DEB_VERSION is no longer on $MIRROR (sid); building $newest, the newest it has"
    DEB_VERSION=$newest
fi
VERSION=${DEB_VERSION#*:}
VERSION=${VERSION%-*}
log "fetching the CRIU $VERSION source from $MIRROR (sid, signature-checked by apt)"
# The .dsc and .debian.tar.xz may 404 on the mirror; the verified orig tarball is what we need.
(cd "$WORK" && apt-get "${A[@]}" source --download-only "criu=$DEB_VERSION" >&2) || true
TARBALL="$WORK/criu_$VERSION.orig.tar.gz"
[ -f "$TARBALL" ] || TARBALL="$WORK/criu_$VERSION.orig.tar.xz"
if [ ! -f "$TARBALL" ]; then
    log "the CRIU $VERSION source tarball did not arrive from $MIRROR (sid); set BULKHEAD_DEBIAN_MIRROR to a Debian mirror that has criu $DEB_VERSION"
    exit 1
fi
tar -C "$WORK" -xf "$TARBALL"
log "building CRIU $VERSION (about 40 s on 2 cores)"
# RUNDIR: where CRIU caches its kernel feature probe (criu.kdat); it must be a tmpfs, and /run
# is not one on every host (then every dump and restore re-probes, ~40 ms each). /dev/shm is.
make -C "$WORK/criu-$VERSION" -j"$(nproc)" RUNDIR=/dev/shm criu >"$WORK/build.log" 2>&1 || {
    tail -40 "$WORK/build.log" >&2
    log "the build failed (log above)"
    exit 1
}
mkdir -p "$OUT.tmp"
install -m 0755 "$WORK/criu-$VERSION/criu/criu" "$OUT.tmp/criu"
rm -rf "$OUT"
mv "$OUT.tmp" "$OUT"
"$BIN" --version >&2
echo "$BIN"
