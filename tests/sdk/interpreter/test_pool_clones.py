"""Warm-pool members of code-interpreter-v1 are restored from one checkpoint of a warmed sandbox
(docs/persistence.md, "Checkpoint-restored pools"). Through the official SDK: two such sandboxes
really come from the same checkpoint, yet draw different random numbers, UUIDs and Jupyter
session ids; IPython history works in them; and JavaScript starts on first use.

The proof that both came from one checkpoint: the kernel's Jupyter HMAC key is drawn when the
kernel starts, so two cold-started kernels never share it, while clones of one image do (which is
why it is listed in docs/threat-model.md as something clones share).
"""

from __future__ import annotations

import ast
import time

import pytest

PROBE = """
import os, random, sys, uuid
_k = get_ipython().kernel
({
    "numpy_loaded_before": "numpy" in sys.modules,
    "random": [random.random() for _ in range(3)],
    "bits": random.getrandbits(64),
    "urandom": os.urandom(16).hex(),
    "uuid": str(uuid.uuid4()),
    "session": _k.session.session,
    "bsession": _k.session.bsession.decode(),
    "hmac_key": _k.session.key.decode(),
    "pid": os.getpid(),
})
"""

NUMPY = "import numpy as np\nfloat(np.random.rand())"


DENO_KERNELS = """
import glob
def _deno():
    n = 0
    for p in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            argv = open(p, "rb").read().split(b"\\0")
        except OSError:
            continue
        n += argv[0].endswith(b"deno") and b"jupyter" in argv
    return n
_deno()
"""


def deno_kernels(sbx) -> int:
    r = sbx.run_code(DENO_KERNELS)
    assert r.error is None, r.error
    return int(r.text)


def probe(sbx) -> dict:
    r = sbx.run_code(PROBE)
    assert r.error is None, r.error
    return ast.literal_eval(r.text)


RESTORED = "warm pool: member restored from the warm checkpoint"


def wait_for_restored_pool(server, members: int = 2, timeout: float = 300):
    """Until the server has restored `members` pool members from the warm checkpoint (the first
    refill makes the checkpoint: a cold start, the kernel's warm-up and a CRIU dump)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = server.log_path.read_text(errors="replace") if server.log_path else ""
        if text.count(RESTORED) >= members:
            return
        time.sleep(0.5)
    pytest.fail(f"no {members} pool members restored from a warm checkpoint in {timeout} s:\n{server.log_tail(60)}")


KEY = "get_ipython().kernel.session.key.decode()"
# The warm checkpoint's kernel key, once the first test has seen two clones share it.
GOLD_KEY = []


def restored_count(server) -> int:
    return server.log_path.read_text(errors="replace").count(RESTORED) if server.log_path else 0


def clone(server, sandbox_factory):
    """A sandbox claimed from the pool whose kernel has the warm checkpoint's key (a sandbox
    started cold while the pool was empty is set aside and the pool's refill awaited)."""
    for _ in range(5):
        seen = restored_count(server)
        sbx = sandbox_factory()
        if not GOLD_KEY or sbx.run_code(KEY).text == GOLD_KEY[0]:
            return sbx
        wait_for_restored_pool(server, seen + 1)
    pytest.fail("no sandbox restored from the warm checkpoint")


def test_clones_of_one_checkpoint_draw_fresh_randomness(server, sandbox_factory):
    for _ in range(3):
        seen = restored_count(server)
        wait_for_restored_pool(server)
        a, b = sandbox_factory(), sandbox_factory()
        pa, pb = probe(a), probe(b)
        if pa["hmac_key"] == pb["hmac_key"]:
            GOLD_KEY.append(pa["hmac_key"])
            break
        # One of them started cold while the pool was empty: wait for two fresh clones.
        wait_for_restored_pool(server, seen + 2)
    assert pa["hmac_key"] == pb["hmac_key"], (
        "both sandboxes should be clones of the pool's warm checkpoint (same kernel, same key); "
        "is the server running with --criu and --pool-checkpoint auto?"
    )
    assert pa["pid"] == pb["pid"], "the same kernel process, restored twice"
    for field in ("random", "bits", "urandom", "uuid", "session"):
        assert pa[field] != pb[field], f"{field} repeats across clones: {pa[field]!r}"
    # jupyter_client keeps the bytes form in step with the new session id.
    assert pa["bsession"] == pa["session"] and pb["bsession"] == pb["session"]
    na, nb = a.run_code(NUMPY), b.run_code(NUMPY)
    assert na.error is None and nb.error is None, (na.error, nb.error)
    assert na.text != nb.text, "numpy's global RNG repeats across clones"


def test_history_works_in_a_restored_clone(server, sandbox_factory):
    wait_for_restored_pool(server)
    sbx = clone(server, sandbox_factory)
    stderr = []
    r = sbx.run_code("x = 20 + 1", on_stderr=lambda m: stderr.append(str(m)))
    assert r.error is None, r.error
    r = sbx.run_code("x * 2", on_stderr=lambda m: stderr.append(str(m)))
    assert r.text == "42"
    r = sbx.run_code("[c for c in _ih if c]", on_stderr=lambda m: stderr.append(str(m)))
    assert r.error is None, r.error
    assert "x = 20 + 1" in r.text and "x * 2" in r.text, r.text
    out = []
    r = sbx.run_code("%history -n", on_stdout=lambda m: out.append(str(m)))
    assert r.error is None, r.error
    assert "x = 20 + 1" in "".join(out), out
    assert not any("history saving thread" in s for s in stderr), stderr
    r = sbx.run_code("get_ipython().history_manager.hist_file")
    assert r.text in (":memory:", "':memory:'"), r.text


def test_sudo_works_in_a_restored_clone(server, sandbox_factory):
    """`sudo` as `user`, as in a cold-started sandbox and on E2B: a restored sandbox's processes
    run without `no_new_privs`, both commands and the kernel's `!` shell."""
    wait_for_restored_pool(server)
    sbx = clone(server, sandbox_factory)
    r = sbx.commands.run("grep NoNewPrivs /proc/self/status; sudo -n id -u; sudo -n mkdir /from-sudo && stat -c %U /from-sudo")
    assert r.stdout.split() == ["NoNewPrivs:", "0", "0", "root"], r.stdout
    r = sbx.run_code("!sudo -n id -u")
    assert r.error is None, r.error
    assert "".join(r.logs.stdout).strip() == "0", r.logs


def test_javascript_starts_on_first_use_in_a_pool_sandbox(server, sandbox_factory):
    wait_for_restored_pool(server)
    sbx = clone(server, sandbox_factory)
    contexts = {c.language for c in sbx.list_code_contexts()}
    assert "javascript" in contexts, "the JS default context is listed before its kernel starts"
    assert deno_kernels(sbx) == 0, "no Deno kernel runs before JavaScript is used"
    r = sbx.run_code("[1, 2, 3].map((x) => x * 2).join(',')", language="javascript")
    assert r.error is None, r.error
    assert r.text == "2,4,6"
    r = sbx.run_code("Math.random() < 1", language="js")
    assert r.text == "true"
    assert deno_kernels(sbx) == 1
