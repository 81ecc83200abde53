"""Templates from registry images through the official Python SDK: `from_image`,
`from_debian_image`, `from_dockerfile` with a FROM line, registry credentials, a re-pushed tag,
an unreachable registry and an image that cannot be a sandbox. Everything stays on this machine:
the session server's `--registry-mirror docker.io=...` points at a `docker-registry` on loopback
(see conftest and registrylab), into which these tests push images they build themselves."""

from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox, Template
from e2b.exceptions import BuildException

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import registrylab  # noqa: E402

pytestmark = pytest.mark.skipif(registrylab.missing() is not None, reason=str(registrylab.missing()))


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _delete(server, template_id: str):
    httpx.delete(f"{server.url}/templates/{template_id}", headers={"X-API-Key": server.api_key}, timeout=30)


def _text(logs) -> str:
    return "\n".join(str(l.message) for l in logs)


@pytest.fixture
def registry(server):
    if server.registry is None:
        pytest.skip("the suite runs against an external server: no loopback registry mirror")
    return server.registry


def test_from_image_carries_the_image_env_and_runs_steps(server, registry):
    registry.push(
        "bulkhead-test/tiny:1",
        [registrylab.tiny_rootfs()],
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "IMAGE_VAR": "from the image"},
        user="nobody",
        workdir="/srv",
    )
    name = _name("img-tiny")
    template = (
        Template()
        .from_image(f"localhost:{registry.port}/bulkhead-test/tiny:1")
        .set_envs({"SET_VAR": "set by the template"})
        .run_cmd('echo "$IMAGE_VAR / $SET_VAR" > built.txt && id -un > who.txt && pwd > where.txt')
        .run_cmd("id -un > /root/root-who.txt", user="root")
    )
    logs = []
    info = Template.build(template, name, on_build_logs=logs.append)
    text = _text(logs)
    assert f"localhost:{registry.port}/bulkhead-test/tiny:1@sha256:" in text, text
    assert "USER \"nobody\"" in text, text
    sbx = Sandbox.create(name, timeout=120)
    try:
        # E2B's defaults (`user` in /home/user), the image's env, the template's env.
        r = sbx.commands.run("id -un; pwd; echo $IMAGE_VAR; echo $SET_VAR; echo $PATH")
        assert r.stdout.splitlines() == [
            "user", "/home/user", "from the image", "set by the template", "/usr/local/bin:/usr/bin:/bin",
        ]
        r = sbx.commands.run("cd /home/user && cat built.txt who.txt where.txt /root/root-who.txt", user="root")
        assert r.stdout.splitlines() == [
            "from the image / set by the template", "user", "/home/user", "root",
        ]
        assert sbx.files.read("/home/user/built.txt").startswith("from the image")
    finally:
        sbx.kill()
    _delete(server, info.template_id)


def test_from_debian_image_and_a_re_pushed_tag_rebuilds(server, registry):
    # `from_debian_image("bookworm")` is `debian:bookworm`: docker.io, served by the mirror.
    def push(version: str):
        registry.push(
            "library/debian:bookworm",
            [registrylab.tiny_rootfs(), registrylab.file_layer({"/etc/bulkhead-version": version})],
            env={"PATH": "/usr/bin:/bin"},
        )

    def template():
        return Template().from_debian_image("bookworm").run_cmd("cat /etc/bulkhead-version > v.txt")

    name = _name("img-debian")
    push("one\n")
    first = []
    info = Template.build(template(), name, on_build_logs=first.append)
    again = []
    Template.build(template(), name, on_build_logs=again.append)
    assert "CACHED [1/1]" in _text(again), _text(again)
    push("two\n")
    moved = []
    Template.build(template(), name, on_build_logs=moved.append)
    # The tag now names another digest: the step's key chains from it, so the layer built on
    # "one" is not reused (v.txt below would say "one").
    digest = lambda logs: _text(logs).split("FROM image docker.io/library/debian:bookworm@")[1].split()[0]
    assert digest(moved) != digest(first), _text(moved)
    sbx = Sandbox.create(name, timeout=120)
    try:
        assert sbx.commands.run("cat v.txt /etc/bulkhead-version").stdout == "two\ntwo\n"
    finally:
        sbx.kill()
    _delete(server, info.template_id)


def test_from_dockerfile_with_a_from_line(server, registry, tmp_path):
    registry.push("library/debian:bookworm", [registrylab.tiny_rootfs()], env={"PATH": "/usr/bin:/bin"})
    (tmp_path / "hello.txt").write_text("hello from the context\n")
    dockerfile = (
        "FROM debian:bookworm\n"
        "ENV APP_MODE=docker\n"
        # Under an existing top-level directory: the jail's Landlock ruleset does not let a
        # sandbox create new entries in `/` itself (so `WORKDIR /app` fails for now).
        "WORKDIR /usr/src/app\n"
        "COPY hello.txt ./\n"
        'RUN cat hello.txt > copied.txt && id -un > runner.txt && echo "$APP_MODE" > mode.txt\n'
    )
    name = _name("img-dockerfile")
    info = Template.build(Template(file_context_path=str(tmp_path)).from_dockerfile(dockerfile), name)
    sbx = Sandbox.create(name, timeout=120)
    try:
        r = sbx.commands.run("pwd; id -un; echo $APP_MODE; cat copied.txt runner.txt mode.txt")
        # The steps ran as root (the SDK's Docker defaults); the sandbox keeps the Dockerfile's
        # WORKDIR and gets E2B's user (the SDK resets only what the Dockerfile did not set).
        assert r.stdout.splitlines() == [
            "/usr/src/app", "user", "docker", "hello from the context", "root", "docker",
        ]
    finally:
        sbx.kill()
    _delete(server, info.template_id)


def test_registry_credentials_are_used_and_never_stored_or_logged(server):
    private = registrylab.Registry(basic_auth=True)
    try:
        private.push("private/app:1", [registrylab.tiny_rootfs({"/etc/private.txt": "secret image\n"})])
        image = f"127.0.0.1:{private.port}/private/app:1"
        offset = server.log_size()
        with pytest.raises(BuildException) as e:
            Template.build(Template().from_image(image).run_cmd("true"), _name("img-noauth"))
        assert "refused the credentials" in str(e.value) or "401" in str(e.value), str(e.value)

        name = _name("img-auth")
        logs = []
        template = (
            Template()
            .from_image(image, username=registrylab.USER, password=registrylab.PASSWORD)
            .run_cmd("cat /etc/private.txt > seen.txt")
        )
        info = Template.build(template, name, on_build_logs=logs.append)
        sbx = Sandbox.create(name, timeout=120)
        try:
            assert sbx.commands.run("cat seen.txt").stdout == "secret image\n"
        finally:
            sbx.kill()
        assert registrylab.PASSWORD not in _text(logs)
        assert registrylab.PASSWORD not in server.log_since(offset, max_lines=100_000)
        for f in (server.data_dir / "templates").glob("*.json"):
            assert registrylab.PASSWORD not in f.read_text(), f
        _delete(server, info.template_id)
    finally:
        private.stop()


def test_unreachable_registry_fails_fast_with_a_clear_message(server, registry):
    t0 = time.monotonic()
    with pytest.raises(BuildException) as e:
        Template.build(Template().from_image("unreachable.invalid/team/app:1").run_cmd("true"), _name("img-down"))
    took = time.monotonic() - t0
    msg = str(e.value)
    assert "Could not pull image" in msg and "--registry-mirror" in msg, msg
    assert took < 30, took


def test_an_image_without_glibc_or_bash_fails_the_build_clearly(server, registry):
    # A busybox-like image: files, accounts, but no glibc loader and no bash.
    registry.push(
        "bulkhead-test/nolibc:1",
        [registrylab.file_layer({"/etc/passwd": "root:x:0:0:root:/root:/bin/sh\n", "/bin/sh": "#!fake\n"})],
    )
    with pytest.raises(BuildException) as e:
        Template.build(
            Template().from_image(f"127.0.0.1:{registry.port}/bulkhead-test/nolibc:1").run_cmd("true"),
            _name("img-nolibc"),
        )
    msg = str(e.value)
    assert "cannot run as a sandbox" in msg and "glibc" in msg and "/bin/bash" in msg, msg


def test_aws_registry_credentials_are_refused_with_a_hint(server):
    # ECR needs a signed token exchange with AWS, which this server does not do: the build is
    # refused before anything is pulled, and the message says what works instead.
    template = Template().from_aws_registry(
        "123456789012.dkr.ecr.us-east-1.amazonaws.com/app:1", "AKIAEXAMPLE", "aws-secret-value", "us-east-1"
    )
    with pytest.raises(Exception) as e:
        Template.build(template.run_cmd("true"), _name("img-aws"))
    assert "get-login-password" in str(e.value), str(e.value)
    assert "aws-secret-value" not in str(e.value)


def test_an_image_whose_uid_1000_is_taken_gets_user_added_in_a_build_sandbox(server, registry):
    # As in the Node images: uid 1000 is `node`, so the pull cannot add `user` with it; the
    # build adds it with the image's own useradd (as root, in a build sandbox) before the steps.
    registry.push("bulkhead-test/node-like:1", [registrylab.tiny_rootfs(node_user=True)], env={"PATH": "/usr/sbin:/usr/bin:/bin"})
    name = _name("img-nodeuser")
    logs = []
    info = Template.build(
        Template().from_image(f"127.0.0.1:{registry.port}/bulkhead-test/node-like:1").run_cmd("id -un > me.txt"),
        name,
        on_build_logs=logs.append,
    )
    text = _text(logs)
    assert "[base] adding the user `user`" in text, text
    sbx = Sandbox.create(name, timeout=120)
    try:
        r = sbx.commands.run("id -un; id -u; pwd; cat me.txt; id -u node")
        lines = r.stdout.splitlines()
        assert lines[0] == "user" and lines[2:] == ["/home/user", "user", "1000"], lines
        assert int(lines[1]) > 1000, lines
    finally:
        sbx.kill()
    _delete(server, info.template_id)


@pytest.mark.parametrize(
    "method,arg,repo",
    [
        ("from_ubuntu_image", "24.04", "library/ubuntu:24.04"),
        ("from_python_image", "3.12", "library/python:3.12"),
        ("from_node_image", "lts", "library/node:lts"),
    ],
)
def test_sdk_image_shortcuts_pull_from_docker_hub_through_the_mirror(server, registry, method, arg, repo):
    registry.push(repo, [registrylab.tiny_rootfs()], env={"PATH": "/usr/bin:/bin", "SHORTCUT": method})
    logs = []
    name = _name("img-shortcut")
    info = Template.build(getattr(Template(), method)(arg).set_envs({"X": "1"}), name, on_build_logs=logs.append)
    assert f"FROM image docker.io/{repo}@sha256:" in _text(logs), _text(logs)
    sbx = Sandbox.create(name, timeout=120)
    try:
        assert sbx.commands.run("echo $SHORTCUT $X").stdout == f"{method} 1\n"
    finally:
        sbx.kill()
    _delete(server, info.template_id)
