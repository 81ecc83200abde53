"""A cluster on one machine (issue "Outgrow one machine"): one `bulkhead api` replica and two
`bulkhead node` daemons sharing a PostgreSQL database and a join token, each node with its own
data dir, uid range, egress proxy and jail. The official SDK, pointed at the API, creates
sandboxes that land on both nodes (E2B's `clientID` names the node); commands and files reach
each through the node protocol's data path. A node that stops answering (SIGSTOP) is declared
suspect, then dead, and gets no new sandboxes; when it wakes up its heartbeat is refused, it
registers again under a new epoch and takes sandboxes again.

The nodes' template caches are the shared test cache, bind-mounted at `<data-dir>/images` (a
node keeps its cache there: paths on the wire are relative to its data dir). Every sandbox is
killed through the API before the API and the nodes stop."""

from __future__ import annotations

import os
import secrets
import signal
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from bulkhead_testlib import REPO, TEMPLATE, TEST_SANDBOX_DOMAIN, BulkheadServer, free_port, http, wait_until

PG = os.environ.get("BULKHEAD_TEST_POSTGRES_URL")
NODES = ("n1", "n2")


def psql(url: str, sql: str) -> str:
    out = subprocess.run(
        ["psql", url, "-v", "ON_ERROR_STOP=1", "-qAtc", sql], check=True, capture_output=True, text=True
    )
    return out.stdout.strip()


def node_status(db_url: str) -> dict:
    try:
        rows = psql(db_url, "SELECT id, status, epoch FROM nodes ORDER BY id")
    except subprocess.CalledProcessError:
        return {}  # the first node has not created the table yet
    return {r.split("|")[0]: (r.split("|")[1], int(r.split("|")[2])) for r in rows.splitlines() if r}


class Node:
    def __init__(self, name: str, root: Path, proc: subprocess.Popen, log: Path):
        self.name, self.root, self.proc, self.log = name, root, proc, log

    @property
    def images(self) -> Path:
        return self.root / "data" / "images"


# A node stops a sandbox itself this long past its deadline when no API replica ended it.
DEADLINE_GRACE_S = 3


def start_node(
    name: str,
    index: int,
    db_url: str,
    token: str,
    key_file: Path,
    root: Path | None = None,
    listen_port: int | None = None,
    advertise: str | None = None,
) -> Node:
    """Starts node `name`; with `root`, again on the data dir of its previous process; with
    `advertise`, reached by the API there (a forwarder in front of `listen_port`)."""
    binary = os.environ.get("BULKHEAD_BIN", str(REPO / "target" / "debug" / "bulkhead"))
    image_cache = os.environ.get("BULKHEAD_IMAGE_CACHE", "/var/cache/bulkhead/images")
    if root is None:
        root = Path(tempfile.mkdtemp(prefix=f"bulkhead-{name}-", dir=os.environ.get("BULKHEAD_TEST_TMPDIR", "/var/tmp")))
        root.chmod(0o711)
        images = root / "data" / "images"
        images.mkdir(parents=True)
        subprocess.run(["mount", "--bind", image_cache, str(images)], check=True)
    log = root / "node.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BULKHEAD_") or k == "BULKHEAD_CRIU"}
    env["BULKHEAD_NODE_TOKEN"] = token
    argv = [
        binary,
        "node",
        "--listen",
        f"127.0.0.1:{listen_port or free_port()}",
        *(["--advertise", advertise] if advertise else []),
        "--data-dir",
        str(root / "data"),
        "--database-url",
        db_url,
        "--node-id",
        name,
        "--templates",
        TEMPLATE,
        # Apart from the test server's (1e6) and the connection-limit test's (5e8) ranges.
        "--uid-base",
        str(600_000_000 + index * 100_000_000),
        "--max-sandboxes",
        "64",
        "--deadline-grace",
        str(DEADLINE_GRACE_S),
        "--secrets-key-file",
        str(key_file),
        "--sandbox-domain",
        TEST_SANDBOX_DOMAIN,
        "--log-level",
        os.environ.get("BULKHEAD_TEST_LOG_LEVEL", "info"),
    ]
    out = open(log, "ab", buffering=0)
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd="/", start_new_session=True)
    return Node(name, root, proc, log)


def stop_node(n: Node):
    if n.proc.poll() is None:
        os.kill(n.proc.pid, signal.SIGCONT)
        n.proc.send_signal(signal.SIGTERM)
        try:
            n.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            n.proc.kill()
            n.proc.wait()
    subprocess.run(["umount", str(n.images)], check=False)
    # Never remove the shared cache through a mount that is still there.
    if os.path.ismount(n.images):
        raise RuntimeError(f"{n.images} is still mounted; left {n.root} in place")
    if os.environ.get("BULKHEAD_TEST_LOG_DIR"):
        shutil.copy(n.log, Path(os.environ["BULKHEAD_TEST_LOG_DIR"]) / f"cluster-{n.name}.log")
    shutil.rmtree(n.root, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster():
    if os.environ.get("BULKHEAD_TEST_URL"):
        pytest.skip("SKIPPED: needs servers started by the test (a cluster of its own)")
    if not PG:
        pytest.skip("SKIPPED: needs PostgreSQL: set BULKHEAD_TEST_POSTGRES_URL (scripts/test.sh starts one)")
    # A schema of its own in the test database (every connection resolves tables there).
    schema = f"bh_cluster_{os.getpid()}"
    psql(PG, f"DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}")
    db_url = f"{PG}{'&' if '?' in PG else '?'}options=-c%20search_path%3D{schema}"
    token = secrets.token_hex(16)
    # One secrets key for the whole cluster (nodes inject secrets at their egress proxies).
    keydir = Path(tempfile.mkdtemp(prefix="bulkhead-cluster-key-"))
    key_file = keydir / "secrets.key"
    key_file.write_text(secrets.token_hex(32) + "\n")
    key_file.chmod(0o600)
    nodes = []
    api = None
    saved = {k: os.environ.get(k) for k in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY")}
    try:
        # Nodes first, one at a time (each migrates the shared schema on open); the API's own
        # readiness check creates a sandbox, which needs a node.
        for i, name in enumerate(NODES):
            nodes.append(start_node(name, i, db_url, token, key_file))
            ready = wait_until(lambda: node_status(db_url).get(name, ("", 0))[0] == "ready", timeout=180, interval=0.5)
            assert ready, f"{name} did not register: {node_status(db_url)}; log: {nodes[-1].log.read_text()[-3000:]}"
        api = BulkheadServer.start(
            [
                "--templates",
                TEMPLATE,
                "--database-url",
                db_url,
                "--pool-size",
                "1",
                "--secrets-key-file",
                str(key_file),
            ],
            subcommand="api",
            extra_env={"BULKHEAD_NODE_TOKEN": token},
        )
        os.environ.update(E2B_API_URL=api.url, E2B_SANDBOX_URL=api.url, E2B_API_KEY=api.api_key)
        yield api, nodes, db_url, (token, key_file)
    finally:
        if api is not None:
            r = http("GET", f"{api.url}/v2/sandboxes?state=running&state=paused&limit=100", headers={"X-API-Key": api.api_key})
            for sbx in r.json() if r.status == 200 else []:
                http("DELETE", f"{api.url}/sandboxes/{sbx['sandboxID']}", headers={"X-API-Key": api.api_key})
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if api is not None:
            api.stop()
            if os.environ.get("BULKHEAD_TEST_LOG_DIR") and api.log_path and api.log_path.exists():
                shutil.copy(api.log_path, Path(os.environ["BULKHEAD_TEST_LOG_DIR"]) / "cluster-api.log")
            api.cleanup_files()
        for n in nodes:
            stop_node(n)
        shutil.rmtree(keydir, ignore_errors=True)
        psql(PG, f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def client_of(api, sandbox_id: str) -> str:
    r = http("GET", f"{api.url}/sandboxes/{sandbox_id}", headers={"X-API-Key": api.api_key})
    assert r.status == 200, r.body
    return r.json()["clientID"]


def test_sandboxes_land_on_every_node_and_answer_through_it(cluster):
    from e2b import Sandbox

    api = cluster[0]
    placed = []
    sandboxes = []
    try:
        for i in range(6):
            sbx = Sandbox.create(TEMPLATE, timeout=120)
            sandboxes.append(sbx)
            r = sbx.commands.run(f"echo from-$((40+{i}))")
            assert r.stdout.strip() == f"from-{40 + i}"
            sbx.files.write("/tmp/node.txt", f"written {i}")
            assert sbx.files.read("/tmp/node.txt") == f"written {i}"
            placed.append(client_of(api, sbx.sandbox_id))
    finally:
        for sbx in sandboxes:
            sbx.kill()
    print("placements:", placed)
    assert set(placed) == set(NODES), placed


def test_a_silent_node_is_declared_dead_then_comes_back_under_a_new_epoch(cluster):
    from e2b import Sandbox

    api, nodes, db_url, _ = cluster
    n2 = next(n for n in nodes if n.name == "n2")
    # A sandbox on n2 runs on through its silence (as through a partition), but the cluster
    # gives it up; n2 stops it within a heartbeat of coming back, so two live copies of a
    # sandbox can never exist.
    stranded = sandbox_on(api, "n2", timeout=300)
    pid = handle_pid(db_url, stranded.sandbox_id)
    epoch_before = node_status(db_url)["n2"][1]
    os.kill(n2.proc.pid, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        dead = wait_until(lambda: node_status(db_url)["n2"][0] == "dead", timeout=30, interval=0.2)
        took = time.monotonic() - t0
        assert dead, node_status(db_url)
        print(f"n2 declared dead after {took:.1f} s")
        # Suspect at 3 s, dead at 5 s, swept every second: allow for a loaded machine.
        assert took <= 10, took
        # Every create now lands on n1, with no error.
        for _ in range(3):
            try:
                sbx = Sandbox.create(TEMPLATE, timeout=60)
            except Exception as e:
                raise AssertionError(f"{e}; nodes: {psql(db_url, 'SELECT id, status, epoch, report FROM nodes')}") from e
            try:
                assert client_of(api, sbx.sandbox_id) == "n1"
                assert sbx.commands.run("echo ok").stdout.strip() == "ok"
            finally:
                sbx.kill()
        assert wait_until(lambda: get_status(api, stranded.sandbox_id) == 404, timeout=5, interval=0.2)
        assert Path(f"/proc/{pid}").exists(), "n2 was only silent"
    finally:
        os.kill(n2.proc.pid, signal.SIGCONT)
    back = wait_until(lambda: node_status(db_url)["n2"][0] == "ready", timeout=30, interval=0.2)
    assert back, node_status(db_url)
    t_back = time.monotonic()
    assert wait_until(lambda: not Path(f"/proc/{pid}").exists(), timeout=10, interval=0.1), n2.log.read_text()[-3000:]
    print(f"n2 back: the sandbox the cluster gave up on was stopped {time.monotonic() - t_back:.1f} s after it registered again")
    status, epoch = node_status(db_url)["n2"]
    assert epoch > epoch_before + 1, (epoch_before, epoch)  # dead bumped it, the return again
    # The API reaches it under its new epoch: creates land there again.
    # (Sandboxes are killed as they go: a node of this 2-core machine holds 4 base sandboxes.)
    seen = set()
    deadline = time.monotonic() + 60
    while "n2" not in seen and time.monotonic() < deadline:
        try:
            sbx = Sandbox.create(TEMPLATE, timeout=60)
        except Exception as e:
            log = api.log_path.read_text()[-6000:] if api.log_path else ""
            raise AssertionError(f"{e}; seen {seen}; nodes: {psql(db_url, 'SELECT id, status, epoch, report FROM nodes')}\n{log}") from e
        try:
            seen.add(client_of(api, sbx.sandbox_id))
            assert sbx.commands.run("echo back").stdout.strip() == "back"
        finally:
            sbx.kill()
    assert "n2" in seen, seen


def handle_pid(db_url: str, sandbox_id: str) -> int:
    """The host pid of the sandbox's init, from its handle in the store."""
    import json

    return int(json.loads(psql(db_url, f"SELECT driver_handle FROM sandboxes WHERE id = '{sandbox_id}'"))["pid"])


def get_status(api, sandbox_id: str) -> int:
    return http("GET", f"{api.url}/sandboxes/{sandbox_id}", headers={"X-API-Key": api.api_key}).status


def sandbox_on(api, node: str, timeout: int = 120, tries: int = 30):
    """A new sandbox placed on `node` (others made on the way are killed)."""
    from e2b import Sandbox

    for _ in range(tries):
        sbx = Sandbox.create(TEMPLATE, timeout=timeout)
        if client_of(api, sbx.sandbox_id) == node:
            return sbx
        sbx.kill()
    raise AssertionError(f"no sandbox landed on {node} in {tries} creates")


def test_a_killed_node_s_sandboxes_are_gone_and_it_stops_them_when_it_returns(cluster):
    from e2b import Sandbox

    api, nodes, db_url, (token, key_file) = cluster
    i = next(i for i, n in enumerate(nodes) if n.name == "n2")
    n2 = nodes[i]
    sbx = sandbox_on(api, "n2")
    pid = handle_pid(db_url, sbx.sandbox_id)
    assert Path(f"/proc/{pid}").exists()
    n2.proc.kill()
    n2.proc.wait()
    t0 = time.monotonic()
    assert wait_until(lambda: node_status(db_url)["n2"][0] == "dead", timeout=30, interval=0.2), node_status(db_url)
    # Gone within a sweep of the death: E2B's not-found, and not listed.
    assert wait_until(lambda: get_status(api, sbx.sandbox_id) == 404, timeout=5, interval=0.2)
    took = time.monotonic() - t0
    print(f"n2 killed: its sandbox reported gone after {took:.1f} s")
    assert took <= 12, took
    listed = [s.sandbox_id for s in Sandbox.list().next_items()]
    assert sbx.sandbox_id not in listed, listed
    row = psql(db_url, f"SELECT state, end_reason FROM sandboxes WHERE id = '{sbx.sandbox_id}'")
    assert row == "dead|node_lost", row
    # Its processes outlive the node's (a jail sandbox is not the daemon's child) ...
    assert Path(f"/proc/{pid}").exists()
    # ... creates go on, elsewhere ...
    other = Sandbox.create(TEMPLATE, timeout=60)
    try:
        assert client_of(api, other.sandbox_id) == "n1"
        assert other.commands.run("echo still").stdout.strip() == "still"
    finally:
        other.kill()
    # ... and the node, started again on its data dir, stops what the cluster gave up on.
    nodes[i] = start_node("n2", i, db_url, token, key_file, root=n2.root)
    assert wait_until(lambda: node_status(db_url)["n2"][0] == "ready", timeout=120, interval=0.5), nodes[i].log.read_text()[-3000:]
    assert wait_until(lambda: not Path(f"/proc/{pid}").exists(), timeout=10, interval=0.2), nodes[i].log.read_text()[-3000:]
    assert psql(db_url, f"SELECT driver_handle IS NULL FROM sandboxes WHERE id = '{sbx.sandbox_id}'") == "t"


def test_a_node_ends_a_sandbox_past_its_deadline_when_no_api_replica_does(cluster):
    api, _, db_url, _ = cluster
    sbx = sandbox_on(api, "n1", timeout=4)
    pid = handle_pid(db_url, sbx.sandbox_id)
    os.kill(api.proc.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        gone = wait_until(lambda: not Path(f"/proc/{pid}").exists(), timeout=4 + DEADLINE_GRACE_S + 15, interval=0.2)
        took = time.monotonic() - t0
        assert gone, "the node did not stop the sandbox"
        print(f"with the API stopped, the node ended the sandbox {took:.1f} s after the create")
        assert took >= 4 + DEADLINE_GRACE_S - 1, took  # not before the deadline and the grace
        row = psql(db_url, f"SELECT state, end_reason FROM sandboxes WHERE id = '{sbx.sandbox_id}'")
        assert row == "dead|timeout", row
    finally:
        os.kill(api.proc.pid, signal.SIGCONT)
    assert wait_until(lambda: get_status(api, sbx.sandbox_id) == 404, timeout=10, interval=0.2)


def node_binary() -> str:
    return os.environ.get("BULKHEAD_BIN", str(REPO / "target" / "debug" / "bulkhead"))


def counter(sbx) -> int:
    return int(sbx.files.read("/tmp/count").strip() or 0)


def start_counter(sbx):
    """A process whose memory is the test: it counts on from where it was, or from 0 if it
    started afresh."""
    sbx.commands.run("sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.1; done'", background=True)
    assert wait_until(lambda: sbx.files.exists("/tmp/count") and counter(sbx) > 3, timeout=10, interval=0.2)


def read_resuming(sbx, within: float = 10) -> int:
    """The counter, read by a request that resumes the sandbox (retried while its node is not
    reachable yet)."""
    deadline = time.monotonic() + within
    while True:
        try:
            return counter(sbx)
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def info(api, sandbox_id: str) -> dict:
    r = http("GET", f"{api.url}/sandboxes/{sandbox_id}", headers={"X-API-Key": api.api_key})
    assert r.status == 200, r.body
    return r.json()


def test_a_drained_node_s_sandboxes_are_paused_and_resume_on_their_next_request_after_it_restarts(cluster):
    """`bulkhead node drain --wait`: no new sandboxes on the node, the API pauses what runs there
    (with memory); SIGTERM then stops the drained node at once; started again on its data dir it
    takes sandboxes again, and the paused one resumes on its next request, its process counting
    on from where it was."""
    from e2b import Sandbox

    api, nodes, db_url, (token, key_file) = cluster
    i = next(i for i, n in enumerate(nodes) if n.name == "n1")
    n1 = nodes[i]
    sbx = sandbox_on(api, "n1", timeout=300)
    try:
        start_counter(sbx)
        env = {k: v for k, v in os.environ.items() if not k.startswith("BULKHEAD_")}
        t0 = time.monotonic()
        out = subprocess.run(
            [node_binary(), "node", "drain", "n1", "--database-url", db_url, "--wait", "--timeout", "60"],
            env=env, capture_output=True, text=True, timeout=90,
        )
        assert out.returncode == 0, out.stderr
        print(f"drain --wait: {time.monotonic() - t0:.1f} s; {out.stderr.strip()}")
        assert "drained" in out.stderr, out.stderr
        assert node_status(db_url)["n1"][0] == "draining"
        assert info(api, sbx.sandbox_id)["state"] == "paused"
        # New sandboxes go elsewhere while it drains.
        for _ in range(2):
            other = Sandbox.create(TEMPLATE, timeout=60)
            try:
                assert client_of(api, other.sandbox_id) == "n2"
            finally:
                other.kill()
        # Drained: SIGTERM stops it at once.
        t0 = time.monotonic()
        n1.proc.send_signal(signal.SIGTERM)
        n1.proc.wait(timeout=30)
        print(f"drained node stopped {time.monotonic() - t0:.1f} s after SIGTERM")
        nodes[i] = start_node("n1", i, db_url, token, key_file, root=n1.root)
        assert wait_until(lambda: node_status(db_url)["n1"][0] == "ready", timeout=120, interval=0.5), nodes[i].log.read_text()[-3000:]
        # Its next request resumes it, on n1, with its memory: the counter goes on. (The API
        # reaches a returning node within a second; a request before that is refused, and the
        # sandbox stays paused for the next one.)
        before = read_resuming(sbx)
        assert before > 3
        assert wait_until(lambda: counter(sbx) > before, timeout=10, interval=0.2)
        got = info(api, sbx.sandbox_id)
        assert (got["state"], got["clientID"]) == ("running", "n1"), got
    finally:
        sbx.kill()


def test_sigterm_drains_a_node_pausing_what_runs_there(cluster):
    """SIGTERM alone: the node reports draining, the API pauses its sandbox, the node exits; the
    sandbox comes back on its next request once the node runs again."""
    api, nodes, db_url, (token, key_file) = cluster
    i = next(i for i, n in enumerate(nodes) if n.name == "n2")
    n2 = nodes[i]
    sbx = sandbox_on(api, "n2", timeout=300)
    try:
        start_counter(sbx)
        t0 = time.monotonic()
        n2.proc.send_signal(signal.SIGTERM)
        n2.proc.wait(timeout=60)
        took = time.monotonic() - t0
        print(f"SIGTERM with a sandbox running: node drained and stopped in {took:.1f} s")
        assert info(api, sbx.sandbox_id)["state"] == "paused"
        log = n2.log.read_text()
        assert "drained: nothing runs here" in log, log[-3000:]
        nodes[i] = start_node("n2", i, db_url, token, key_file, root=n2.root)
        assert wait_until(lambda: node_status(db_url)["n2"][0] == "ready", timeout=120, interval=0.5), nodes[i].log.read_text()[-3000:]
        before = read_resuming(sbx)
        assert wait_until(lambda: counter(sbx) > before, timeout=10, interval=0.2)
        assert info(api, sbx.sandbox_id)["clientID"] == "n2"
    finally:
        sbx.kill()


class Load:
    """Creates (each checked on its node, then killed) from `threads` client threads until
    stopped; every outcome with its start and end time."""

    def __init__(self, api, threads: int = 3):
        import threading

        self.api, self.results, self.stop_flag = api, [], threading.Event()
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(threads)]

    def run(self):
        from e2b import Sandbox

        while not self.stop_flag.is_set():
            t0 = time.monotonic()
            try:
                sbx = Sandbox.create(TEMPLATE, timeout=60)
                try:
                    node = client_of(self.api, sbx.sandbox_id)
                finally:
                    sbx.kill()
                self.results.append((t0, time.monotonic(), True, node))
            except Exception as e:  # noqa: BLE001 - every failure is an outcome to report
                self.results.append((t0, time.monotonic(), False, f"{type(e).__name__}: {e}"))
                time.sleep(0.2)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop_flag.set()
        for t in self.threads:
            t.join(timeout=120)

    def summary(self, since: float) -> str:
        ok = [r for r in self.results if r[2]]
        rate = len(ok) / max(1e-9, max(r[1] for r in self.results) - since) if self.results else 0
        return f"{len(self.results)} creates, {len(ok)} ok ({rate:.1f}/s), failures: {[r[3] for r in self.results if not r[2]][:5]}"


def test_creates_under_load_go_on_when_a_node_is_killed(cluster):
    """`kill -9` of a node while three clients create sandboxes: a start in flight there moves
    on to the other node, every create after the kill succeeds, the node is declared dead; its
    leftovers are stopped when it starts again."""
    api, nodes, db_url, (token, key_file) = cluster
    i = next(i for i, n in enumerate(nodes) if n.name == "n2")
    n2 = nodes[i]
    t_start = time.monotonic()
    # One client thread: one node of this 2-core machine holds 4 `base` sandboxes (2 CPUs, 4×
    # overcommit, 2 vCPUs each), its warm pool member included, and with two clients a create
    # in flight, one being killed and the pool's member can leave no room after the other is
    # gone (a 503 the SDK reports: capacity, not the fault).
    try:
        with Load(api, threads=1) as load:
            time.sleep(4)
            t_kill = time.monotonic()
            n2.proc.kill()
            n2.proc.wait()
            dead = wait_until(lambda: node_status(db_url)["n2"][0] == "dead", timeout=15, interval=0.2)
            t_dead = time.monotonic()
            time.sleep(3)
    finally:
        if n2.proc.poll() is not None:
            nodes[i] = start_node("n2", i, db_url, token, key_file, root=n2.root)
    print(f"kill -9 under load: {load.summary(t_start)}; dead after {t_dead - t_kill:.1f} s")
    assert dead, node_status(db_url)
    assert t_dead - t_kill <= 8, t_dead - t_kill
    before = [r for r in load.results if r[1] < t_kill]
    assert {r[3] for r in before if r[2]} == {"n1", "n2"}, before
    after = [r for r in load.results if r[0] >= t_kill]
    assert after and all(r[2] for r in after), [r[3] for r in after if not r[2]]
    assert all(r[3] == "n1" for r in after), [r[3] for r in after]
    # In flight at the kill: moved on (or, at worst, a clear error in E2B's shape).
    for r in load.results:
        if r[0] < t_kill < r[1] and not r[2]:
            assert "Exception" in r[3] or "Error" in r[3], r
    assert wait_until(lambda: node_status(db_url)["n2"][0] == "ready", timeout=120, interval=0.5), nodes[i].log.read_text()[-3000:]


def restart_postgresql() -> float:
    """Restarts the PostgreSQL the tests use (the packaged cluster, or .ci/postgres.sh's own);
    how long it took."""
    t0 = time.monotonic()
    clusters = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True).stdout.split()
    if clusters:
        subprocess.run(["pg_ctlcluster", clusters[0], clusters[1], "restart"], check=True)
    else:
        bindir = sorted(Path("/usr/lib/postgresql").glob("*/bin"))[-1]
        subprocess.run(["runuser", "-u", "postgres", "--", str(bindir / "pg_ctl"), "-D", "/var/tmp/bulkhead-postgres", "-w", "restart"], check=True)
    return time.monotonic() - t0


def test_creates_resume_after_postgresql_restarts_and_nothing_is_lost(cluster):
    """PostgreSQL restarted under load: creates may fail while it is down and succeed again within
    10 s of its return; a sandbox created before runs on and is listed; no node is declared
    dead for the store's silence."""
    from e2b import Sandbox

    api, _, db_url, _ = cluster
    kept = Sandbox.create(TEMPLATE, timeout=300)
    try:
        kept.commands.run("echo before > /tmp/mark")
        epochs = {k: v[1] for k, v in node_status(db_url).items()}
        t_start = time.monotonic()
        with Load(api, threads=2) as load:
            time.sleep(3)
            t_down = time.monotonic()
            took = restart_postgresql()
            t_back = time.monotonic()
            time.sleep(12)
        print(f"PostgreSQL restart ({took:.1f} s) under load: {load.summary(t_start)}")
        late = [r for r in load.results if r[0] >= t_back + 10]
        assert late and all(r[2] for r in late), [r[3] for r in late if not r[2]]
        first_ok = min((r[1] for r in load.results if r[2] and r[0] >= t_down), default=None)
        assert first_ok is not None
        print(f"first create after the restart completed {first_ok - t_back:.1f} s after PostgreSQL was back")
        assert first_ok - t_back <= 10
        # Nothing lost: the earlier sandbox runs on and is listed; the nodes kept their epochs.
        assert kept.commands.run("cat /tmp/mark").stdout.strip() == "before"
        assert kept.sandbox_id in [s.sandbox_id for s in Sandbox.list().next_items()]
        status = node_status(db_url)
        assert all(s == "ready" for s, _ in status.values()), status
        assert {k: v[1] for k, v in status.items()} == epochs, (epochs, status)
    finally:
        kept.kill()


class Link:
    """A TCP forwarder standing for a node's network link: `cut()` stops it like a pulled cable
    (nothing passes either way, new connections hang, nobody is told), `restore()` brings it
    back (connections from before the cut are closed then, as a long outage leaves them)."""

    def __init__(self, target_port: int):
        import socket
        import threading

        self.target = ("127.0.0.1", target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.up = threading.Event()
        self.up.set()
        self.lock = threading.Lock()
        self.sockets: list = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        import socket
        import threading

        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                self.sockets.append(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client):
        import socket
        import threading

        self.up.wait()  # a connection made during the cut hangs
        try:
            upstream = socket.create_connection(self.target)
        except OSError:
            client.close()
            return
        with self.lock:
            self.sockets.append(upstream)
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                self.up.wait()  # held, not delivered, while cut
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(2)
            except OSError:
                pass

    def cut(self):
        self.up.clear()

    def restore(self):
        with self.lock:
            old, self.sockets = self.sockets, []
        for s in old:
            try:
                s.close()
            except OSError:
                pass
        self.up.set()

    def close(self):
        self.closed = True
        self.restore()
        self.listener.close()


def test_a_partitioned_node_loses_its_sandboxes_and_stops_them_within_a_heartbeat_of_its_return(cluster):
    """A third node reached only through forwarders (to it, and from it to PostgreSQL) is cut
    off for 30 s: it is declared dead and its sandbox reported gone while it runs on there
    unseen (no copy of it runs anywhere else); when the link comes back the node registers
    again and stops it within about a heartbeat."""
    from urllib.parse import urlparse

    api, nodes, db_url, (token, key_file) = cluster
    pg_port = urlparse(PG).port or 5432
    node_port = free_port()
    to_node, to_db = Link(node_port), Link(pg_port)
    n3 = start_node(
        "n3",
        2,
        db_url.replace(f":{pg_port}/", f":{to_db.port}/", 1),
        token,
        key_file,
        listen_port=node_port,
        advertise=f"http://127.0.0.1:{to_node.port}",
    )
    nodes.append(n3)
    try:
        assert wait_until(lambda: node_status(db_url).get("n3", ("", 0))[0] == "ready", timeout=120, interval=0.5), n3.log.read_text()[-3000:]
        sbx = sandbox_on(api, "n3", timeout=600, tries=40)
        assert sbx.commands.run("echo reachable").stdout.strip() == "reachable"
        pid = handle_pid(db_url, sbx.sandbox_id)
        t_cut = time.monotonic()
        to_node.cut()
        to_db.cut()
        assert wait_until(lambda: node_status(db_url)["n3"][0] == "dead", timeout=15, interval=0.2), node_status(db_url)
        assert wait_until(lambda: get_status(api, sbx.sandbox_id) == 404, timeout=5, interval=0.2)
        print(f"partition: n3 dead and its sandbox gone {time.monotonic() - t_cut:.1f} s after the cut")
        while time.monotonic() - t_cut < 30:
            # It runs on where nobody can reach it, and nowhere else.
            assert Path(f"/proc/{pid}").exists()
            assert psql(db_url, f"SELECT count(*) FROM sandboxes WHERE id = '{sbx.sandbox_id}' AND state <> 'dead'") == "0"
            time.sleep(2)
        t_back = time.monotonic()
        to_db.restore()
        to_node.restore()
        assert wait_until(lambda: not Path(f"/proc/{pid}").exists(), timeout=15, interval=0.1), n3.log.read_text()[-3000:]
        took = time.monotonic() - t_back
        print(f"link back: n3 stopped the sandbox the cluster gave up on {took:.1f} s later")
        assert took <= 5, took
        assert wait_until(lambda: node_status(db_url)["n3"][0] == "ready", timeout=15, interval=0.2), node_status(db_url)
    finally:
        to_db.restore()
        to_node.restore()
        stop_node(n3)
        nodes.remove(n3)
        to_node.close()
        to_db.close()


class pointed_at:
    """Points the SDK (E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY) at one API replica for a while."""

    def __init__(self, api):
        self.api, self.saved = api, {}

    def __enter__(self):
        for k, v in (("E2B_API_URL", self.api.url), ("E2B_SANDBOX_URL", self.api.url), ("E2B_API_KEY", self.api.api_key)):
            self.saved[k] = os.environ.get(k)
            os.environ[k] = v
        return self.api

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def owner_of(db_url: str, sandbox_id: str) -> str:
    return psql(db_url, f"SELECT owner_replica FROM sandboxes WHERE id = '{sandbox_id}'")


def test_api_replicas_answer_for_each_other_and_take_over_a_killed_one(cluster):
    """A second `bulkhead api` over the same database: each replica answers for the sandboxes
    the other created (REST, commands and files are forwarded to the replica that drives the
    sandbox), and when that replica is killed with `kill -9`, the other takes its sandboxes over
    within about 6 s (5 s of silence, then at most a second) and drives them itself."""
    from e2b import Sandbox

    main, _, db_url, (token, key_file) = cluster
    extra = BulkheadServer.start(
        ["--templates", TEMPLATE, "--database-url", db_url, "--pool-size", "0", "--secrets-key-file", str(key_file)],
        subcommand="api",
        extra_env={"BULKHEAD_NODE_TOKEN": token},
    )
    created = []
    try:
        assert int(psql(db_url, "SELECT count(*) FROM replicas WHERE heartbeat_at > 0")) >= 2
        with pointed_at(extra):
            sbx = Sandbox.create(TEMPLATE, timeout=120)
            created.append(sbx.sandbox_id)
            other = Sandbox.create(TEMPLATE, timeout=120)
            created.append(other.sandbox_id)
            sbx.commands.run("echo made-on-extra > /tmp/where")
        with pointed_at(main):
            ours = Sandbox.create(TEMPLATE, timeout=120)
            created.append(ours.sandbox_id)
        extra_id = owner_of(db_url, sbx.sandbox_id)
        assert extra_id and extra_id == owner_of(db_url, other.sandbox_id) != owner_of(db_url, ours.sandbox_id)

        # Through the replica that did not create it: connect, commands, files, info, kill.
        with pointed_at(main):
            via_main = Sandbox.connect(sbx.sandbox_id)
            assert via_main.commands.run("cat /tmp/where").stdout.strip() == "made-on-extra"
            via_main.files.write("/tmp/from-main.txt", "hello through main")
            assert via_main.files.read("/tmp/from-main.txt") == "hello through main"
            streamed = []
            via_main.commands.run("for i in 1 2 3; do echo line$i; sleep 0.2; done", on_stdout=lambda line: streamed.append(line.strip()))
            assert streamed == ["line1", "line2", "line3"], streamed
            assert info(main, sbx.sandbox_id)["state"] == "running"
        with pointed_at(extra):
            via_extra = Sandbox.connect(ours.sandbox_id)
            assert via_extra.commands.run("echo ok").stdout.strip() == "ok"
            Sandbox.kill(ours.sandbox_id)
        assert get_status(main, ours.sandbox_id) == 404
        created.remove(ours.sandbox_id)
        # Nobody took anything over while both heartbeat.
        assert owner_of(db_url, sbx.sandbox_id) == extra_id

        # kill -9 of the replica that drives them: the other answers for them within ~6 s.
        pids = {s: handle_pid(db_url, s) for s in (sbx.sandbox_id, other.sandbox_id)}
        os.kill(extra.proc.pid, signal.SIGKILL)
        extra.proc.wait()
        t0 = time.monotonic()
        assert wait_until(lambda: get_status(main, sbx.sandbox_id) == 200, timeout=15, interval=0.1), main.log_tail(40)
        took = time.monotonic() - t0
        print(f"replica killed: the other answered for its sandbox {took:.1f} s later")
        assert took <= 7, took
        # The other one is taken by the background round, without a request for it.
        assert wait_until(lambda: owner_of(db_url, other.sandbox_id) != extra_id, timeout=3, interval=0.1)
        for s, pid in pids.items():
            assert Path(f"/proc/{pid}").exists(), f"sandbox {s} stopped with its replica"
        with pointed_at(main):
            again = Sandbox.connect(sbx.sandbox_id)
            assert again.commands.run("cat /tmp/from-main.txt").stdout.strip() == "hello through main"
            assert Sandbox.connect(other.sandbox_id).commands.run("echo alive").stdout.strip() == "alive"
            for s in list(created):
                Sandbox.kill(s)
                created.remove(s)
        for s, pid in pids.items():
            assert get_status(main, s) == 404
            assert wait_until(lambda: not Path(f"/proc/{pid}").exists(), timeout=10, interval=0.2), f"sandbox {s} still runs"
    finally:
        for s in created:
            http("DELETE", f"{main.url}/sandboxes/{s}", headers={"X-API-Key": main.api_key})
        extra.stop()
        if os.environ.get("BULKHEAD_TEST_LOG_DIR") and extra.log_path and extra.log_path.exists():
            shutil.copy(extra.log_path, Path(os.environ["BULKHEAD_TEST_LOG_DIR"]) / "cluster-api-extra.log")
        extra.cleanup_files()
