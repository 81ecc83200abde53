#!/usr/bin/env bash
# Runs the tests of the code-interpreter Python startup code against real IPython kernels.
# The venv is built once per requirements.txt (+ interpreter version) and reused:
#   $BULKHEAD_VENV_CACHE (default /var/cache/bulkhead)/venv-interp-<hash>
# Extra arguments go to pytest (e.g. `run.sh -k sql -x`).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
req="$here/requirements.txt"
# The template runs Debian bookworm's /usr/bin/python3 (3.11); test with the same when present.
python="${BULKHEAD_TEST_PYTHON:-/usr/bin/python3}"
[ -x "$python" ] || python="$(command -v python3 || true)"
if [ -z "$python" ] || ! "$python" -c 'import venv, ensurepip' 2>/dev/null; then
    # 77: "could not run" (the automake convention), never a pass: scripts/test.sh fails on it.
    echo "CANNOT RUN interpreter python tests: need python3 with the venv and ensurepip modules" \
         "(Debian: apt-get install python3-venv)" >&2
    exit 77
fi

cache="${BULKHEAD_VENV_CACHE:-/var/cache/bulkhead}"
hash="$( { cat "$req"; "$python" -c 'import sys; print(sys.version)'; } | sha256sum | cut -c1-16)"
venv="$cache/venv-interp-$hash"
mkdir -p "$cache"

(
    # one builder at a time; the stamp marks a venv whose install finished
    flock 9
    if [ ! -f "$venv/.bulkhead-complete" ]; then
        echo "== creating $venv" >&2
        rm -rf "$venv"
        "$python" -m venv "$venv"
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input -r "$req"
        touch "$venv/.bulkhead-complete"
    fi
) 9>"$cache/.venv-interp.lock"

cd "$here"
# keep __pycache__ out of the source tree (the directory is embedded into the image)
export PYTHONDONTWRITEBYTECODE=1
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@" "$here"
