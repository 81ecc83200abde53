#!/usr/bin/env bash
# Bulkhead's test command (see README): lint, build and unit tests, then the conformance suites
# with the official, unmodified E2B SDKs (PyPI `e2b`, an older 2.x `e2b`, npm `e2b`) against a
# real `bulkhead serve`, the isolation tests and the 200-cycle leak test, and the code-interpreter
# suites with PyPI `e2b-code-interpreter` and npm `@e2b/code-interpreter`.
#
# Debian 12, as root; idempotent. Installs what it needs (Debian packages, a PostgreSQL for the
# store tests via .ci/postgres.sh, Python venvs under $BULKHEAD_CACHE_DIR, npm packages in
# tests/sdk/js). Exits non-zero if any step failed.
#
# Every test runs: cargo test gets `--include-ignored`, so the tests gated on a host capability
# with `#[bulkhead_testkit::requires(...)]` (root, /dev/net/tun, kernel venv, PostgreSQL, ...)
# run and fail when it is missing, and a skipped pytest or node test, or an ignored Rust test,
# fails the run. The log ends with the step summary (each step's result and duration) and a
# table of tests run per suite (`cargo xtask test-counts`, crates/xtask).
#
# Environment:
#   BULKHEAD_CACHE_DIR     venvs and the template image cache   (default /var/cache/bulkhead)
#   BULKHEAD_IMAGE_CACHE   template images                      (default $BULKHEAD_CACHE_DIR/images)
#   PYTEST_ADDOPTS         extra pytest options, e.g. -m "not slow" to skip the leak test locally
#   BULKHEAD_TEST_SKIP     space-separated steps to skip: lint unit python old-sdk microvm js
#                          interpreter-module interpreter-python interpreter-js mcp console proto
#                          (local use only: listed as SKIP in the summary; .ci/run unsets it)
#   BULKHEAD_TEST_EXTRA_CA PEM CA for the images extra-CA test (default: the top certificate of
#                          the chain this host is served for pypi.org)
#   BULKHEAD_TEST_LOG_DIR  where the per-suite reports go (default: a new dir under /var/tmp)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO="$(pwd)"
CACHE="${BULKHEAD_CACHE_DIR:-/var/cache/bulkhead}"
export BULKHEAD_IMAGE_CACHE="${BULKHEAD_IMAGE_CACHE:-$CACHE/images}"
export BULKHEAD_BIN="$REPO/target/debug/bulkhead"
export DEBIAN_FRONTEND=noninteractive
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
SKIP=" ${BULKHEAD_TEST_SKIP:-} "

RESULTS=()
FAILED=0
LOGDIR="${BULKHEAD_TEST_LOG_DIR:-$(mktemp -d /var/tmp/bulkhead-test-XXXXXX)}"
mkdir -p "$LOGDIR"
SUITES="$LOGDIR/suites.tsv"   # one line per test report, for `cargo xtask test-counts`
: >"$SUITES"

STARTED=$SECONDS

section() { printf '\n======== %s ========\n' "$*"; }
duration() { # duration SECONDS -> 41s, 12m05s, 1h02m
    local s="$1"
    if [ "$s" -ge 3600 ]; then printf '%dh%02dm' $((s / 3600)) $((s % 3600 / 60))
    elif [ "$s" -ge 60 ]; then printf '%dm%02ds' $((s / 60)) $((s % 60))
    else printf '%ds' "$s"; fi
}
result() { # result PASS|FAIL|SKIP SECONDS|"" TEXT: one summary line, the duration in a column
    local t=""
    [ -n "$2" ] && t="$(duration "$2")"
    RESULTS+=("$(printf '%s  %7s  %s' "$1" "$t" "$3")")
}
record() { # record NAME STATUS [SECONDS]
    if [ "$2" -eq 0 ]; then result PASS "${3:-}" "$1"; else result FAIL "${3:-}" "$1 (exit $2)"; FAILED=$((FAILED + 1)); fi
}
run_step() { # run_step NAME CMD...   (runs the command, records the result and its duration, never exits)
    local name="$1"; shift
    section "$name"
    local rc=0 t0=$SECONDS
    "$@" || rc=$?
    record "$name" "$rc" $((SECONDS - t0))
    return 0
}
skipped() { # skipped STEP: true (and listed in the summary) when BULKHEAD_TEST_SKIP names it
    [[ "$SKIP" == *" $1 "* ]] || return 1
    result SKIP "" "$1 (BULKHEAD_TEST_SKIP)"
}
slug() { tr -c 'A-Za-z0-9\n' '-' <<<"$1" | tr -s '-' | sed 's/-$//'; }
summary() {
    section "Summary"
    printf '%s\n' "${RESULTS[@]}"
    local skips
    skips="$(printf '%s\n' "${RESULTS[@]}" | grep -c '^SKIP' || true)"
    echo "steps: $(( ${#RESULTS[@]} - FAILED - skips )) passed, $FAILED failed, $skips skipped ($(duration $((SECONDS - STARTED))) in all)"
}
counts() { # the last section: tests per suite; any skipped test fails the run
    local rc=0 t0=$SECONDS
    cargo xtask test-counts "$SUITES" >"$LOGDIR/counts.txt" 2>&1 || rc=$?
    record "every test ran (no skipped or ignored tests; table below)" "$rc" $((SECONDS - t0))
    summary
    section "Tests per suite (reports in $LOGDIR)"
    cat "$LOGDIR/counts.txt"
}

if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/test.sh must run as root (the server creates namespaces, mounts and cgroups): sudo $0" >&2
    exit 1
fi

# ---- host packages --------------------------------------------------------------------------
section "Host packages"
want=(debootstrap mmdebstrap ca-certificates curl procps util-linux hostname python3 python3-venv iproute2 openssl docker-registry
    qemu-system-x86 erofs-utils e2fsprogs chromium)
missing=()
for p in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "installing: ${missing[*]}"
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
else
    echo "all present: ${want[*]}"
fi
# Node.js >= 20.18 for the JS SDK suites (Debian 12's is 18): the official build when missing.
scripts/host-node.sh >/dev/null
PY="${BULKHEAD_PYTHON:-python3}"
echo "python: $($PY --version 2>&1) ($(command -v "$PY")); node: $(node -v); cargo: $(cargo --version)"

# ---- PostgreSQL for the store tests ---------------------------------------------------------
if [ -x .ci/postgres.sh ] && [[ "$SKIP" != *" unit "* ]]; then
    section "PostgreSQL (for store tests)"
    pg_t0=$SECONDS
    if url="$(.ci/postgres.sh)"; then
        export BULKHEAD_TEST_POSTGRES_URL="$url"
        echo "BULKHEAD_TEST_POSTGRES_URL=$url"
    else
        record "postgres setup" 1 $((SECONDS - pg_t0))
    fi
fi

# ---- test environments ----------------------------------------------------------------------
make_venv() { # make_venv REQUIREMENTS -> prints the venv dir
    local req="$1" hash dir
    hash="$( { cat "$req"; "$PY" -c 'import sys; print(sys.version)'; } | sha256sum | cut -c1-16)"
    dir="$CACHE/venv-$hash"
    if [ ! -f "$dir/.complete" ]; then
        rm -rf "$dir"
        mkdir -p "$CACHE"
        "$PY" -m venv "$dir" >&2
        "$dir/bin/pip" install -q --disable-pip-version-check -r "$req" >&2
        touch "$dir/.complete"
    fi
    echo "$dir"
}
section "Test environments"
VENV="$(make_venv tests/sdk/python/requirements.txt)"
OLD_VENV="$(make_venv tests/sdk/python_old/requirements-old.txt)"
CI_VENV="$(make_venv tests/sdk/interpreter/requirements.txt)"
MCP_VENV="$(make_venv tests/sdk/mcp/requirements.txt)"
CONSOLE_VENV="$(make_venv tests/sdk/console/requirements.txt)"
# Real kernels for the agent's interpreter tests (cargo test; `#[requires(KernelVenv)]`).
BULKHEAD_TEST_KERNEL_VENV="$(make_venv crates/agent/tests/kernel-requirements.txt)"
export BULKHEAD_TEST_KERNEL_VENV
echo "agent kernel venv: $BULKHEAD_TEST_KERNEL_VENV"
# A CA for the images extra-CA test (`#[requires(ExtraCaBundle)]`): the top certificate of the
# chain this host is served for pypi.org — a public intermediate, or the CA of a TLS-inspecting
# gateway like the one in front of our development machines. The test builds a template trusting
# it and checks that curl inside the tree verifies pypi.org, so it must be a CA that really signs
# what this host sees (a throwaway CA would fail that half on every host).
if [ -z "${BULKHEAD_TEST_EXTRA_CA:-}" ]; then
    ca_file="$CACHE/test-extra-ca.pem"
    mkdir -p "$CACHE"
    echo | timeout 20 openssl s_client -connect pypi.org:443 -servername pypi.org -showcerts 2>/dev/null \
        | awk '/-----BEGIN CERTIFICATE-----/{c=""; inside=1} inside{c=c $0 "\n"} /-----END CERTIFICATE-----/{last=c; inside=0} END{printf "%s", last}' \
        > "$ca_file.tmp" || true
    if [ -s "$ca_file.tmp" ]; then
        mv "$ca_file.tmp" "$ca_file"
        BULKHEAD_TEST_EXTRA_CA="$ca_file"
    else
        rm -f "$ca_file.tmp"
        echo "warning: could not fetch pypi.org's certificate chain; the extra-CA test will fail as missing its CA" >&2
    fi
fi
export BULKHEAD_TEST_EXTRA_CA
echo "extra CA bundle: ${BULKHEAD_TEST_EXTRA_CA:-none}"
echo "python SDK venv: $VENV (e2b $("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("e2b"))'))"
echo "old SDK venv:    $OLD_VENV (e2b $("$OLD_VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("e2b"))'))"
echo "interpreter venv: $CI_VENV (e2b-code-interpreter $("$CI_VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("e2b-code-interpreter"))'))"
echo "MCP venv:        $MCP_VENV (mcp $("$MCP_VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("mcp"))'))"
echo "console venv:    $CONSOLE_VENV (playwright $("$CONSOLE_VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("playwright"))'), $(chromium --version 2>/dev/null || echo 'no chromium'))"
(cd tests/sdk/js && npm ci --no-audit --no-fund --loglevel=error)
echo "js SDK: e2b $(node -p 'require("./tests/sdk/js/node_modules/e2b/package.json").version')"
(cd tests/sdk/js-interpreter && npm ci --no-audit --no-fund --loglevel=error)
echo "js interpreter SDK: @e2b/code-interpreter $(node -p 'require("./tests/sdk/js-interpreter/node_modules/@e2b/code-interpreter/package.json").version')"
mkdir -p "$BULKHEAD_IMAGE_CACHE"

# CRIU 4.2 for pause, resume, snapshots and fork (built from source, cached by content hash;
# `#[requires(Criu)]` and every server the suites start read BULKHEAD_CRIU).
section "CRIU"
criu_t0=$SECONDS
if criu_bin="$(scripts/criu.sh)"; then
    export BULKHEAD_CRIU="$criu_bin"
    echo "BULKHEAD_CRIU=$BULKHEAD_CRIU ($("$BULKHEAD_CRIU" --version | head -1))"
else
    record "CRIU build (scripts/criu.sh)" 1 $((SECONDS - criu_t0))
fi

# The microvm driver's guest kernel (Debian's linux-source + our config fragment, cached by
# content hash; `#[requires(GuestKernel)]` reads BULKHEAD_GUEST_KERNEL).
section "Guest kernel"
kernel_t0=$SECONDS
if kernel_dir="$(scripts/guest-kernel.sh)"; then
    export BULKHEAD_GUEST_KERNEL="$kernel_dir/bzImage"
    echo "BULKHEAD_GUEST_KERNEL=$BULKHEAD_GUEST_KERNEL ($(cat "$kernel_dir/source"))"
else
    record "guest kernel build (scripts/guest-kernel.sh)" 1 $((SECONDS - kernel_t0))
fi

# ---- Rust -----------------------------------------------------------------------------------
# cargo-deny (deny.toml): licenses, bans and sources of the dependency graph. The pinned version
# is installed once into $CACHE/cargo-deny-<version> (outside the clone; about five minutes).
# Advisories are not checked: the RustSec database is a git repository on GitHub, which this
# host cannot reach (deny.toml says more).
CARGO_DENY_VERSION=0.20.2
cargo_deny() {
    local root="$CACHE/cargo-deny-$CARGO_DENY_VERSION"
    if [ ! -x "$root/bin/cargo-deny" ]; then
        echo "installing cargo-deny $CARGO_DENY_VERSION into $root (once; a few minutes)"
        nice -n 10 cargo install --locked --quiet cargo-deny --version "$CARGO_DENY_VERSION" --root "$root" || return
    fi
    PATH="$root/bin:$PATH" cargo deny --offline check --hide-inclusion-graph licenses bans sources || return
    echo "cargo deny: advisories not checked (the RustSec database is on GitHub, out of reach; see deny.toml)"
}
if ! skipped lint; then
    run_step "cargo fmt --check" cargo fmt --all -- --check
    run_step "cargo clippy" cargo clippy --workspace --all-targets -- -D warnings
    run_step "cargo deny (licenses, bans, sources)" cargo_deny
    run_step "module import loops (cargo xtask module-cycles)" cargo xtask module-cycles
fi
# ---- book: BEGIN (docs/testing.md, "The book") ----------------------------------------------
# The documentation book (book.toml, docs/): mdBook and mdbook-linkcheck from crates.io, each
# installed once into $CACHE/<crate>-<version> (outside the clone), then `mdbook build`: HTML in
# target/book/html, and every internal link checked (web links are never fetched). README.md is
# outside the book, so its relative links are checked here: each must name an existing file.
# mdbook-linkcheck 0.7.7 supports mdbook ^0.4 only: bump the two versions together.
# Skip locally with BULKHEAD_TEST_SKIP=book.
MDBOOK_VERSION=0.4.52
MDBOOK_LINKCHECK_VERSION=0.7.7
book_tool() { # book_tool CRATE VERSION -> prints the bin dir of CRATE, installed when missing
    local root="$CACHE/$1-$2"
    if [ ! -x "$root/bin/$1" ]; then
        echo "installing $1 $2 into $root (once; a few minutes)" >&2
        nice -n 10 cargo install --locked --quiet "$1" --version "$2" --root "$root" >&2 || return
    fi
    echo "$root/bin"
}
book_step() {
    local mdbook_dir linkcheck_dir link target rc=0
    mdbook_dir="$(book_tool mdbook "$MDBOOK_VERSION")" || return
    linkcheck_dir="$(book_tool mdbook-linkcheck "$MDBOOK_LINKCHECK_VERSION")" || return
    PATH="$mdbook_dir:$linkcheck_dir:$PATH" mdbook build "$REPO" || return
    while IFS= read -r link; do
        target="${link%%#*}"
        case "$target" in '' | http://* | https://* | mailto:*) continue ;; esac
        [ -e "$REPO/$target" ] || { echo "README.md: broken link to $link" >&2; rc=1; }
    done < <(grep -oE '\]\([^)[:space:]]+\)' "$REPO/README.md" | sed -E 's/^\]\((.*)\)$/\1/')
    [ "$rc" -eq 0 ] && echo "book: target/book/html/index.html; README.md's links resolve"
    return "$rc"
}
if ! skipped book; then
    run_step "book: mdbook build + link check" book_step
fi
# ---- book: END ------------------------------------------------------------------------------
# ---- node protocol: BEGIN (docs/versioning.md, "Node protocol") --------------------------------
# The contract between the control plane and the nodes (crates/node-proto/proto, bulkhead.node.v1):
# `buf lint` with the rules of its buf.yaml, then `buf breaking` against the release recorded in
# crates/node-proto/BASELINE (a commit or tag), read with `git archive`: a field renumbered,
# retyped or renamed since that release fails. Without BASELINE (before the first release that
# ships the protocol) only lint runs. buf is npm's @bufbuild/buf (a prebuilt binary), installed
# once into $CACHE/buf-<version>. Skip locally with BULKHEAD_TEST_SKIP=proto.
BUF_VERSION=1.75.0
NODE_PROTO=crates/node-proto/proto
proto_step() {
    local root="$CACHE/buf-$BUF_VERSION" baseline tmp rc=0
    local buf="$root/node_modules/.bin/buf"
    if [ ! -x "$buf" ]; then
        echo "installing @bufbuild/buf $BUF_VERSION into $root (once)"
        mkdir -p "$root"
        npm install --prefix "$root" --no-audit --no-fund --loglevel=error "@bufbuild/buf@$BUF_VERSION" || return
    fi
    (cd "$NODE_PROTO" && "$buf" lint) || return
    echo "buf lint: $NODE_PROTO passes"
    if [ ! -f crates/node-proto/BASELINE ]; then
        echo "no baseline yet: lint only (crates/node-proto/BASELINE names the release to compare with)"
        return 0
    fi
    baseline="$(tr -d '[:space:]' <crates/node-proto/BASELINE)"
    if ! git rev-parse --verify --quiet "$baseline^{commit}" >/dev/null; then
        echo "crates/node-proto/BASELINE names $baseline, which this clone lacks: git fetch --tags origin" >&2
        return 1
    fi
    tmp="$(mktemp -d)"
    git archive "$baseline" "$NODE_PROTO" | tar -x -C "$tmp" || rc=$?
    if [ "$rc" -eq 0 ]; then
        (cd "$NODE_PROTO" && "$buf" breaking --against "$tmp/$NODE_PROTO") || rc=$?
    fi
    rm -rf "$tmp"
    [ "$rc" -eq 0 ] && echo "buf breaking: no breaking change since $baseline"
    return "$rc"
}
if ! skipped proto; then
    run_step "node protocol: buf lint + breaking (crates/node-proto)" proto_step
fi
# ---- node protocol: END ---------------------------------------------------------------------
section "cargo build"
build_rc=0 build_t0=$SECONDS
cargo build --workspace || build_rc=$?
record "cargo build" "$build_rc" $((SECONDS - build_t0))
if [ "$build_rc" -ne 0 ]; then
    echo "build failed: the SDK suites need target/debug/bulkhead" >&2
    summary
    exit 1
fi
cargo_test() { # every test, the capability-gated (#[ignore]d) ones included; counts per binary
    # Which package each test binary belongs to (its "Running" line names only the file).
    cargo test --workspace --no-run --message-format=json-render-diagnostics >"$LOGDIR/cargo-artifacts.json" || return
    printf 'cargo\t%s\t%s\n' "$LOGDIR/cargo-test.log" "$LOGDIR/cargo-artifacts.json" >>"$SUITES"
    cargo test --workspace --no-fail-fast -- --include-ignored 2>&1 | tee "$LOGDIR/cargo-test.log"
    return "${PIPESTATUS[0]}"
}
if ! skipped unit; then
    run_step "cargo test (--include-ignored)" cargo_test
fi

# ---- SDK suites -----------------------------------------------------------------------------
pytest_step() { # pytest_step NAME VENV TIMEOUT ARGS...   (-rs: each skip's reason in the log)
    local name="$1" venv="$2" secs="$3" xml; shift 3
    xml="$LOGDIR/$(slug "$name").xml"
    printf 'junit\t%s\t%s\n' "$name" "$xml" >>"$SUITES"
    run_step "$name" timeout --kill-after=30 "$secs" "$venv/bin/python" -m pytest -p no:cacheprovider \
        -rs --junitxml="$xml" "$@"
}
if ! skipped python; then
    pytest_step "Python SDK: conformance, isolation, leak (tests/sdk/python)" "$VENV" 3000 tests/sdk/python
fi
# The microvm driver under the official SDKs (a server of its own whose base and
# code-interpreter-v1 templates run in VMs, TCG where there is no hardware KVM): small, about
# three minutes. The interpreter venv has both `e2b` and `e2b-code-interpreter`. Without QEMU
# or the guest kernel it is skipped, loudly (a failed kernel build is already recorded above).
if ! skipped microvm; then
    if ! command -v qemu-system-x86_64 >/dev/null || [ ! -s "${BULKHEAD_GUEST_KERNEL:-}" ]; then
        why="no qemu-system-x86_64 or no guest kernel (BULKHEAD_GUEST_KERNEL='${BULKHEAD_GUEST_KERNEL:-}')"
        section "microvm SDK suite"
        echo "SKIPPED: microvm SDK suite: $why" >&2
        result SKIP "" "microvm SDK suite ($why)"
    else
        pytest_step "microvm SDK suite (tests/sdk/microvm)" "$CI_VENV" 1800 tests/sdk/microvm
    fi
fi
if ! skipped old-sdk; then
    pytest_step "Older Python SDK, POST /sandboxes generation (tests/sdk/python_old)" "$OLD_VENV" 900 tests/sdk/python_old
fi

js_suite() { # js_suite NAME TEST_FILES...
    local name="$1" tmp port key pid rc=0 tap; shift
    tap="$LOGDIR/$(slug "$name").tap"
    printf 'tap\t%s\t%s\n' "$name" "$tap" >>"$SUITES"
    tmp="$(mktemp -d /var/tmp/bulkhead-js-XXXXXX)"
    chmod 711 "$tmp"   # sandbox uids must traverse to their slot dirs
    port="$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
    key="e2b_$("$PY" -c 'import secrets; print(secrets.token_hex(20))')"
    BULKHEAD_API_KEY="$key" "$BULKHEAD_BIN" serve --listen "127.0.0.1:$port" --data-dir "$tmp/data" \
        --image-cache "$BULKHEAD_IMAGE_CACHE" --log-level info --sandbox-domain sandboxes.bulkhead.test \
        >"$tmp/server.log" 2>&1 &
    pid=$!
    local deadline=$((SECONDS + 1200)) code=""
    while [ $SECONDS -lt $deadline ]; do
        code="$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health" || true)"
        [ "$code" = 204 ] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    if [ "$code" != 204 ]; then
        echo "bulkhead serve did not become healthy (last /health: ${code:-none}); log:" >&2
        tail -n 100 "$tmp/server.log" >&2
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        return 1
    fi
    BULKHEAD_TEST_URL="http://127.0.0.1:$port" BULKHEAD_TEST_API_KEY="$key" BULKHEAD_TEST_DATA_DIR="$tmp/data" \
        BULKHEAD_TEST_SANDBOX_DOMAIN=sandboxes.bulkhead.test timeout --kill-after=30 1500 node --test --test-concurrency=1 \
        --test-reporter=spec --test-reporter-destination=stdout \
        --test-reporter=tap --test-reporter-destination="$tap" "$@" || rc=$?
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    if [ "$rc" -ne 0 ]; then
        echo "---- bulkhead server log (tail) ----"
        tail -n 150 "$tmp/server.log"
        echo "(kept at $tmp)"
    else
        # Never rm -rf across a mount (the server's idmapped lower layers live in the data dir).
        grep -F " $tmp/" /proc/self/mountinfo | awk '{print $5}' | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
        grep -qF " $tmp/" /proc/self/mountinfo || rm -rf --one-file-system "$tmp"
    fi
    return "$rc"
}
if ! skipped js; then
    name="JS SDK: conformance (tests/sdk/js, node --test)"
    run_step "$name" js_suite "$name" tests/sdk/js/*.test.mjs
fi

# ---- code interpreter (template code-interpreter-v1, port-49999 API) ---------------------------
if [ -x crates/images/interpreter/python/tests/run.sh ] && ! skipped interpreter-module; then
    name="Interpreter startup module (crates/images/interpreter/python/tests)"
    printf 'junit\t%s\t%s\n' "$name" "$LOGDIR/interpreter-module.xml" >>"$SUITES"
    # (run.sh exits 77 when it cannot run at all: recorded as a failure like any other)
    run_step "$name" crates/images/interpreter/python/tests/run.sh -rs --junitxml="$LOGDIR/interpreter-module.xml"
fi
if ! skipped interpreter-python; then
    pytest_step "Python code-interpreter SDK (tests/sdk/interpreter)" "$CI_VENV" 2400 tests/sdk/interpreter
fi
if ! skipped mcp; then
    pytest_step "MCP server, official Python mcp client (tests/sdk/mcp)" "$MCP_VENV" 1500 tests/sdk/mcp
fi
if ! skipped console; then
    # Playwright drives Debian's chromium (the test passes executable_path; no browser download).
    pytest_step "Web console in headless Chromium (tests/sdk/console)" "$CONSOLE_VENV" 900 tests/sdk/console
fi
if ! skipped interpreter-js; then
    # (tests/sdk/js-interpreter/env.mjs points the readiness probe at code-interpreter-v1)
    name="JS code-interpreter SDK (tests/sdk/js-interpreter, node --test)"
    run_step "$name" js_suite "$name" tests/sdk/js-interpreter/*.test.mjs
fi

counts
[ "$FAILED" -eq 0 ]
