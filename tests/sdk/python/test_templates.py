"""Custom templates through E2B's Template API with the official Python SDK, unmodified: real
builds on the jail driver (every step in a build sandbox), then sandboxes of the result."""

from __future__ import annotations

import os
import time
import uuid

import httpx
import pytest
from e2b import Sandbox, Template, wait_for_port
from e2b.exceptions import BuildException, TemplateException


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _api(server, method: str, path: str, **kw):
    return httpx.request(method, server.url + path, headers={"X-API-Key": server.api_key}, timeout=30, **kw)


@pytest.fixture
def context(tmp_path):
    (tmp_path / "hello.txt").write_text("hello from the context\n")
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "main.py").write_text("print('main')\n")
    (tmp_path / "app" / "data.json").write_text("{}\n")
    os.symlink("main.py", tmp_path / "app" / "link.py")
    return tmp_path


def _kill(sbx):
    try:
        sbx.kill()
    except Exception:
        pass


def test_build_copy_run_envs_workdir_user_and_start_cmd(server, context):
    name = _name("tpl-full")
    template = (
        Template(file_context_path=str(context))
        .from_base_image()
        .copy("hello.txt", "/opt/data/hello.txt", mode=0o640)
        .copy("app", "/srv/app/", user="root")
        .set_envs({"GREETING": "hi there", "MODE": "test"})
        .run_cmd("useradd -m builder", user="root")
        .set_workdir("/srv/work")
        .run_cmd('echo "$GREETING" > greeting.txt && pwd > where.txt && id -un > who.txt')
        .run_cmd("id -un > /srv/work/root-who.txt", user="root")
        .set_user("builder")
        .run_cmd("id -un > /home/builder/me.txt")
        .set_start_cmd("python3 -m http.server 8123 --directory /srv/work", wait_for_port(8123))
    )
    logs = []
    info = Template.build(template, name, on_build_logs=logs.append)
    text = "\n".join(str(l.message) for l in logs)
    assert info.template_id and info.build_id
    assert "useradd" in text and "[finalize] ready check passed" in text, text

    sbx = Sandbox.create(name, timeout=120)
    try:
        r = sbx.commands.run("stat -c '%a %U' /opt/data/hello.txt && cat /opt/data/hello.txt", user="root")
        assert r.stdout.splitlines() == ["640 user", "hello from the context"]
        # A directory source copies its contents; the symlink is kept as a symlink.
        r = sbx.commands.run("ls -A /srv/app && readlink /srv/app/link.py && stat -c %U /srv/app/main.py")
        assert r.stdout.split() == ["data.json", "link.py", "main.py", "main.py", "root"]
        assert sbx.commands.run("cat /srv/work/greeting.txt").stdout == "hi there\n"
        assert sbx.commands.run("cat /srv/work/where.txt").stdout == "/srv/work\n"
        assert sbx.commands.run("cat /srv/work/who.txt").stdout == "user\n"
        assert sbx.commands.run("cat /srv/work/root-who.txt").stdout == "root\n"
        assert sbx.commands.run("cat /home/builder/me.txt").stdout == "builder\n"
        # The last user, workdir and envs are the sandbox's defaults.
        assert sbx.commands.run("id -un; pwd; echo $GREETING").stdout == "builder\n/srv/work\nhi there\n"
        # The start command runs, and the sandbox was handed out only once it listened.
        r = sbx.commands.run("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8123/greeting.txt")
        assert r.stdout == "200"
    finally:
        _kill(sbx)
    _api(server, "DELETE", f"/templates/{info.template_id}")


def test_rebuild_takes_unchanged_steps_from_the_cache(server, context):
    name = _name("tpl-cache")
    # Unique content, so the first build is cold even with layers from earlier runs cached.
    (context / "nonce.txt").write_text(uuid.uuid4().hex)

    def template(second: str):
        return (
            Template(file_context_path=str(context))
            .from_base_image()
            .copy("nonce.txt", "/opt/nonce.txt")
            .run_cmd("sleep 2 && echo first > /opt/first.txt", user="root")
            .run_cmd(f"echo {second} > /opt/second.txt", user="root")
        )

    cold_logs, warm_logs, changed_logs = [], [], []
    t0 = time.monotonic()
    Template.build(template("a"), name, on_build_logs=cold_logs.append)
    cold = time.monotonic() - t0
    t0 = time.monotonic()
    Template.build(template("a"), name, on_build_logs=warm_logs.append)
    warm = time.monotonic() - t0
    warm_text = "\n".join(str(l.message) for l in warm_logs)
    assert warm_text.count("CACHED [") == 3, warm_text
    assert warm < cold, (warm, cold)

    # One changed step: the steps before it come from the cache, it runs again.
    info = Template.build(template("b"), name, on_build_logs=changed_logs.append)
    text = "\n".join(str(l.message) for l in changed_logs)
    assert "CACHED [1/3] COPY" in text and "CACHED [2/3] RUN" in text, text
    assert "CACHED [3/3]" not in text
    sbx = Sandbox.create(name, timeout=60)
    try:
        assert sbx.commands.run("cat /opt/first.txt /opt/second.txt").stdout == "first\nb\n"
    finally:
        _kill(sbx)

    # skip_cache runs every step again.
    forced = []
    Template.build(template("b"), name, skip_cache=True, on_build_logs=forced.append)
    assert "CACHED [" not in "\n".join(str(l.message) for l in forced)
    _api(server, "DELETE", f"/templates/{info.template_id}")


def test_failing_step_fails_the_build_and_registers_nothing(server):
    name = _name("tpl-fail")
    template = Template().from_base_image().run_cmd("echo before-failing; exit 3")
    logs = []
    with pytest.raises(BuildException) as e:
        Template.build(template, name, on_build_logs=logs.append)
    assert "exit code 3" in str(e.value) and "before-failing" in str(e.value)
    assert any("before-failing" in str(l.message) for l in logs)
    assert not Template.exists(name)
    assert name not in _api(server, "GET", "/templates").text

    # A user the template does not have.
    with pytest.raises(BuildException) as e:
        Template.build(Template().from_base_image().run_cmd("true", user="nobody-here"), _name("tpl-nouser"))
    assert "nobody-here" in str(e.value)
    with pytest.raises(BuildException) as e:
        Template.build(Template().from_base_image().set_user("ghost"), _name("tpl-ghost"))
    assert "ghost" in str(e.value) and "does not exist" in str(e.value)


def test_exists_tags_background_list_and_delete(server):
    name = _name("tpl-tags")
    assert not Template.exists(name)
    template = Template().from_template("base").run_cmd("echo v1 > /opt/version", user="root")
    info = Template.build_in_background(template, f"{name}:v1")
    deadline = time.monotonic() + 300
    while True:
        st = Template.get_build_status(info)
        if st.status.value in ("ready", "error"):
            break
        assert time.monotonic() < deadline
        time.sleep(0.5)
    assert st.status.value == "ready", st
    assert Template.exists(name)
    assert Template.exists("base")

    Template.assign_tags(f"{name}:v1", ["prod", "stable"])
    tags = {t.tag: t.build_id for t in Template.get_tags(name)}
    assert set(tags) == {"v1", "prod", "stable"} and tags["prod"] == info.build_id
    with pytest.raises(TemplateException):
        Template.assign_tags(f"{name}:v1", "bad tag!")
    sbx = Sandbox.create(f"{name}:prod", timeout=60)
    try:
        assert sbx.commands.run("cat /opt/version").stdout == "v1\n"
    finally:
        _kill(sbx)
    Template.remove_tags(name, "stable")
    assert {t.tag for t in Template.get_tags(name)} == {"v1", "prod"}

    # An invalid name is refused as E2B does.
    with pytest.raises(BuildException):
        Template.build(template, "Not A Valid Name")

    listed = _api(server, "GET", "/templates").json()
    assert any(t["templateID"] == info.template_id and name in t["aliases"] for t in listed), listed
    assert _api(server, "DELETE", f"/templates/{info.template_id}").status_code == 204
    assert not Template.exists(name)
    assert info.template_id not in _api(server, "GET", "/templates").text


def test_uploads_need_the_link_token_and_a_valid_hash(server):
    r = _api(server, "GET", f"/templates/{'x' * 20}/files/{'a' * 64}")
    assert r.status_code == 404 and "message" in r.json()
    bad = httpx.put(server.url + "/bulkhead/template-files/" + "a" * 64 + "?token=nope", content=b"x")
    assert bad.status_code == 403
    traversal = httpx.put(server.url + "/bulkhead/template-files/..%2F..%2Fetc?token=nope", content=b"x")
    assert traversal.status_code in (400, 403, 404)


def test_pip_install_through_the_egress_proxy(server):
    name = _name("tpl-pip")
    # The first step is unique per run, so "cold" really builds every step.
    template = (
        Template()
        .from_base_image()
        .run_cmd(f"echo {uuid.uuid4().hex} > /opt/nonce", user="root")
        .pip_install("six==1.16.0")
    )
    t0 = time.monotonic()
    info = Template.build(template, name)
    cold = time.monotonic() - t0
    t0 = time.monotonic()
    Template.build(template, name)
    cached = time.monotonic() - t0
    print(f"\ntemplate build with pip_install: cold {cold:.1f}s, cached {cached:.1f}s")
    sbx = Sandbox.create(name, timeout=60)
    try:
        r = sbx.commands.run("python3 -c 'import six; print(six.__version__)'")
        assert r.stdout.strip() == "1.16.0"
    finally:
        _kill(sbx)
    _api(server, "DELETE", f"/templates/{info.template_id}")


def test_a_built_template_survives_a_server_restart(server):
    if not server.owned:
        pytest.skip("SKIPPED: needs a server started by the suite (BULKHEAD_TEST_URL points at an external one)")
    name = _name("tpl-restart")
    template = (
        Template()
        .from_base_image()
        .run_cmd("echo kept > /opt/kept.txt", user="root")
        .set_envs({"KEPT": "yes"})
        .set_start_cmd("python3 -m http.server 8124 --directory /opt", wait_for_port(8124))
    )
    info = Template.build(template, f"{name}:v1")
    Template.assign_tags(f"{name}:v1", "prod")

    server.restart()

    assert Template.exists(name)
    assert {t.tag for t in Template.get_tags(name)} >= {"v1", "prod"}
    listed = _api(server, "GET", "/templates").json()
    assert any(t["templateID"] == info.template_id for t in listed), listed
    sbx = Sandbox.create(f"{name}:prod", timeout=60)
    try:
        assert sbx.commands.run("cat /opt/kept.txt; echo $KEPT").stdout == "kept\nyes\n"
        # Its start command came back with it: the sandbox was handed out once 8124 listened.
        r = sbx.commands.run("curl -s http://127.0.0.1:8124/kept.txt")
        assert r.stdout == "kept\n"
    finally:
        _kill(sbx)
    assert _api(server, "DELETE", f"/templates/{info.template_id}").status_code == 204


def test_file_steps_and_git_clone(server):
    """make_dir, make_symlink, rename, remove and git_clone (the SDK turns them into commands run
    in the build sandbox); the repository is a local one, so nothing leaves the machine."""
    name = _name("tpl-steps")
    template = (
        Template()
        .from_base_image()
        .make_dir(["/opt/steps/a/b", "/opt/steps/gone"], mode=0o750, user="root")
        .run_cmd("echo one > /opt/steps/a/b/one.txt && echo old > /opt/steps/old.txt", user="root")
        .make_symlink("/opt/steps/a/b/one.txt", "/opt/steps/link.txt", user="root")
        .rename("/opt/steps/old.txt", "/opt/steps/new.txt", user="root")
        .remove("/opt/steps/gone", recursive=True, user="root")
        .run_cmd(
            "git init -q -b main /home/user/origin && cd /home/user/origin && echo v1 > f.txt && git add f.txt"
            " && git -c user.name=t -c user.email=t@t commit -qm one && echo v2 > f.txt"
            " && git -c user.name=t -c user.email=t@t commit -qam two"
        )
        .git_clone("file:///home/user/origin", "/home/user/clone", branch="main", depth=1)
    )
    info = Template.build(template, name)
    sbx = Sandbox.create(name, timeout=60)
    try:
        # 750 root: only root may look inside.
        r = sbx.commands.run(
            "stat -c '%a %U' /opt/steps/a/b && readlink /opt/steps/link.txt && cat /opt/steps/link.txt", user="root"
        )
        assert r.stdout.splitlines() == ["750 root", "/opt/steps/a/b/one.txt", "one"]
        assert sbx.commands.run("cat /opt/steps/new.txt").stdout == "old\n"
        assert sbx.commands.run("ls /opt/steps").stdout.split() == ["a", "link.txt", "new.txt"]
        r = sbx.commands.run("cd /home/user/clone && cat f.txt && git rev-list --count HEAD && stat -c %U .")
        # depth=1: one commit, the newest; cloned as the template's default user.
        assert r.stdout.split() == ["v2", "1", "user"]
    finally:
        _kill(sbx)
    _api(server, "DELETE", f"/templates/{info.template_id}")
