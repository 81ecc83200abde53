#!/usr/bin/env bash
# Start Bulkhead on this machine with embedded defaults (Debian 12, as root): installs the
# missing host packages, builds the release binaries and runs `bulkhead serve`. Arguments are
# passed to `serve`, e.g.  ./scripts/serve.sh --listen 127.0.0.1:3000 --data-dir /var/lib/bulkhead
# On first start the `base` template is built (a minute or two) and an API key is printed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [ "$(id -u)" -ne 0 ]; then
    echo "bulkhead serve needs root (namespaces, mounts, cgroups). Run: sudo $0 $*" >&2
    exit 1
fi
if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null 2>&1; then
    echo "Rust is not installed. Run: curl --proto '=https' -sSf https://sh.rustup.rs | sh -s -- -y && . \"\$HOME/.cargo/env\"" >&2
    exit 1
fi

pkgs=(debootstrap mmdebstrap ca-certificates)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "Installing host packages: ${missing[*]}" >&2
    if ! { DEBIAN_FRONTEND=noninteractive apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"; }; then
        echo "Could not install them. Run: apt-get update && apt-get install -y ${missing[*]}" >&2
        exit 1
    fi
fi

# CRIU for pause, resume, snapshots and fork: built once from Debian's source (about a minute),
# cached under /var/cache/bulkhead. Without it the server runs with those disabled.
if [ -z "${BULKHEAD_CRIU:-}" ]; then
    if criu_bin="$(scripts/criu.sh)"; then
        export BULKHEAD_CRIU="$criu_bin"
    else
        echo "warning: CRIU could not be built; pause, snapshots and fork are disabled" >&2
    fi
fi

cargo build --release -p bulkhead -p bulkhead-agent
exec target/release/bulkhead serve "$@"
