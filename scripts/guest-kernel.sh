#!/usr/bin/env bash
# Build the microvm driver's guest kernel and print the directory that holds it (bzImage,
# vmlinux, config). The kernel is Debian's linux-source-6.1 configured as `make tinyconfig` plus
# crates/microvm/guest/kernel.fragment: everything built in, no modules, no initramfs.
#
# The result is cached outside the clone, keyed by a content hash of the source package version
# and the fragment (a change to how this script builds needs a change of the fragment, e.g. a
# comment, to force a rebuild):
#   $BULKHEAD_CACHE_DIR/guest-kernel-<hash>/{bzImage,vmlinux,config}   (default /var/cache/bulkhead)
# A complete cached build is reused; otherwise it is rebuilt (~2.5 min on 2 cores, under nice).
#
# Usage: scripts/guest-kernel.sh     # build if missing, print the directory on stdout
# Progress goes to stderr. Needs root (apt-get) on Debian 12 when packages are missing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

CACHE="${BULKHEAD_CACHE_DIR:-/var/cache/bulkhead}"
FRAGMENT=crates/microvm/guest/kernel.fragment
SOURCE_PKG=linux-source-6.1
DEPS=("$SOURCE_PKG" build-essential bc bison flex libelf-dev libssl-dev xz-utils)

log() { echo "guest-kernel: $*" >&2; }

missing=()
for p in "${DEPS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "installing: ${missing[*]}"
    apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
fi

VERSION=$(dpkg-query -W -f='${Version}' "$SOURCE_PKG")
KEY=$({ echo "$SOURCE_PKG $VERSION"; cat "$FRAGMENT"; } | sha256sum | cut -c1-16)
OUT="$CACHE/guest-kernel-$KEY"
if [ -s "$OUT/bzImage" ] && [ -s "$OUT/vmlinux" ] && [ -s "$OUT/config" ]; then
    echo "$OUT"
    exit 0
fi

TARBALL=$(dpkg -L "$SOURCE_PKG" | grep -E '/linux-source-[0-9.]+\.tar\.xz$' | head -n1)
WORK=$(mktemp -d /var/tmp/bulkhead-guest-kernel.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
start=$(date +%s)
log "unpacking $TARBALL ($SOURCE_PKG $VERSION)"
tar -xJf "$TARBALL" -C "$WORK"
SRC=$(find "$WORK" -mindepth 1 -maxdepth 1 -type d | head -n1)
JOBS=$(nproc)
log "configuring: tinyconfig + $FRAGMENT"
nice -n 10 make -C "$SRC" -s tinyconfig >&2
(cd "$SRC" && scripts/kconfig/merge_config.sh -m .config "$OLDPWD/$FRAGMENT" >/dev/null)
nice -n 10 make -C "$SRC" -s olddefconfig >&2
# Every option the fragment asks for must survive olddefconfig (a missing dependency drops one
# silently, and the guest then fails at boot in a way that is hard to trace back).
while IFS= read -r line; do
    case "$line" in
    CONFIG_*=n) opt=${line%=n}
        if grep -q "^$opt=" "$SRC/.config"; then log "$opt is set but the fragment disables it"; exit 1; fi ;;
    CONFIG_*) grep -qx "$line" "$SRC/.config" || { log "$line did not survive olddefconfig (a dependency is missing from $FRAGMENT)"; exit 1; } ;;
    esac
done <"$FRAGMENT"
log "building vmlinux and bzImage with $JOBS jobs (about 2.5 minutes on 2 cores)"
# The full log goes to a file; stderr gets a line per 100 objects as progress.
nice -n 10 make -C "$SRC" -j"$JOBS" vmlinux bzImage >"$WORK/build.log" 2>&1 &
pid=$!
n=0
while kill -0 "$pid" 2>/dev/null; do
    sleep 5
    m=$(grep -c '^  \(CC\|LD\|AR\|AS\) ' "$WORK/build.log" || true)
    if [ "$m" -ge $((n + 100)) ]; then n=$m; log "$n objects built..."; fi
done
if ! wait "$pid"; then
    tail -n 40 "$WORK/build.log" >&2
    log "the kernel build failed (the end of its log is above)"
    exit 1
fi

mkdir -p "$CACHE"
TMP_OUT=$(mktemp -d "$CACHE/.guest-kernel-$KEY.XXXXXX")
# QEMU runs as an unprivileged uid and reads the kernel.
chmod 755 "$TMP_OUT"
cp "$SRC/arch/x86/boot/bzImage" "$TMP_OUT/bzImage"
cp "$SRC/vmlinux" "$TMP_OUT/vmlinux"
strip --strip-debug "$TMP_OUT/vmlinux" 2>/dev/null || true
cp "$SRC/.config" "$TMP_OUT/config"
echo "$SOURCE_PKG $VERSION" >"$TMP_OUT/source"
rm -rf "$OUT"
mv "$TMP_OUT" "$OUT"
log "built in $(($(date +%s) - start)) s: $OUT"
echo "$OUT"
