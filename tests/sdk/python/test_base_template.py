"""The default template has what E2B's `base` has (the `python:3.11` image plus Node.js 20):
Node.js, npm, yarn, Python with pip and venv, a C toolchain, git, curl, unzip, `gh`, and `sudo`
for `user` without a password. Checked through the official SDK in a real sandbox.

`pip install` goes through the egress proxy to a package index the test serves itself (a
wheel it builds, in the egress lab's network namespace): no traffic leaves this machine.
"""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile

import pytest
from e2b import CommandExitException

import egresslab


def sh(sbx, cmd: str, user: str = "user", timeout: float = 300):
    try:
        r = sbx.commands.run(cmd, user=user, timeout=timeout)
    except CommandExitException as e:
        r = e
    return r.exit_code, r.stdout, r.stderr


def ok(sbx, cmd: str, user: str = "user", timeout: float = 300) -> str:
    code, out, err = sh(sbx, cmd, user=user, timeout=timeout)
    assert code == 0, f"{cmd!r} exited {code}: {out[-2000:]} {err[-2000:]}"
    return out


def test_node_npm_and_yarn(sandbox):
    version = ok(sandbox, "node -v").strip()
    assert version.startswith("v"), version
    assert int(version[1:].split(".")[0]) >= 20, version
    assert ok(sandbox, "node -e 'console.log(6 * 7)'").strip() == "42"
    assert int(ok(sandbox, "npm -v").strip().split(".")[0]) >= 10
    assert ok(sandbox, "npx --version").strip()
    assert ok(sandbox, "yarn --version").strip().startswith("1.")
    # npm works offline for a local package as `user` (its cache is the user's).
    out = ok(sandbox, "mkdir -p /home/user/p && cd /home/user/p && npm init -y >/dev/null && npm pkg get name")
    assert '"p"' in out


def test_python_pip_and_venv(sandbox):
    assert ok(sandbox, "python3 --version").startswith("Python 3.11")
    assert ok(sandbox, "python --version").startswith("Python 3.11")
    assert "pip" in ok(sandbox, "pip --version")
    ok(sandbox, "python3 -m venv /home/user/venv && /home/user/venv/bin/python -c 'import sys; print(sys.prefix)'")
    # Headers for C extensions are there (python3-dev).
    ok(sandbox, "test -f $(python3 -c 'import sysconfig; print(sysconfig.get_paths()[\"include\"])')/Python.h")


def test_c_toolchain_builds_and_runs(sandbox):
    sandbox.files.write("/home/user/hello.c", '#include <stdio.h>\nint main(void){puts("hello from gcc");return 0;}\n')
    assert ok(sandbox, "cd /home/user && gcc -O2 -o hello hello.c && ./hello").strip() == "hello from gcc"
    sandbox.files.write("/home/user/hi.cpp", '#include <iostream>\nint main(){std::cout<<"hi "<<__cplusplus<<"\\n";}\n')
    assert ok(sandbox, "cd /home/user && g++ -o hi hi.cpp && ./hi").startswith("hi ")
    assert "GNU Make" in ok(sandbox, "make --version")


def test_everyday_tools(sandbox):
    for cmd in ("git --version", "curl --version", "wget --version", "unzip -v", "zip -v", "gh --version", "xz --version", "ps -p 1"):
        ok(sandbox, cmd)


def test_user_has_passwordless_sudo(sandbox):
    assert ok(sandbox, "whoami").strip() == "user"
    assert ok(sandbox, "sudo -n whoami").strip() == "root"
    # Root through sudo is the sandbox's root: it can change the sandbox's own files...
    ok(sandbox, "sudo -n touch /etc/bulkhead-sudo-probe && sudo -n rm /etc/bulkhead-sudo-probe")
    # ...but nothing outside the capability set the sandbox's root has.
    code, out, err = sh(sandbox, "sudo -n mount -t tmpfs none /mnt")
    assert code != 0, out
    status = ok(sandbox, "sudo -n cat /proc/self/status")
    fields = dict(l.split(":", 1) for l in status.splitlines() if ":" in l)
    assert fields["CapBnd"].strip() == "00000000a80425fb", status
    assert fields["Seccomp"].strip() == "2", status



def test_login_shell_is_debians_without_helper_processes(sandbox):
    # Commands run in a login shell; the profile decides root's PATH with bash's `$EUID`
    # instead of running `id -u` (and root's `mesg n` only on a terminal): same result.
    root_path = ok(sandbox, "echo $PATH", user="root").strip().split(":")
    user_path = ok(sandbox, "echo $PATH").strip().split(":")
    assert "/usr/sbin" in root_path and "/sbin" in root_path, root_path
    assert "/usr/local/bin" in user_path and "/usr/sbin" not in user_path, user_path
    # A login shell's trace shows every command the profile runs: no `id`, no `mesg`.
    for user in ("root", "user"):
        trace = ok(sandbox, "bash -l -x -c true 2>&1", user=user).splitlines()
        assert trace, "no trace"
        run = [l for l in trace if l.lstrip("+ ").split(" ")[0] in ("id", "mesg")]
        assert not run, (user, run)


def _wheel(name: str, version: str, module: str, body: str) -> tuple[str, bytes]:
    """A minimal pure-Python wheel (PEP 427), built in memory."""
    dist = f"{name.replace('-', '_')}-{version}"
    files = {
        f"{module}.py": body.encode(),
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: bulkhead-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}.dist-info/RECORD,,")
    files[f"{dist}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
    return f"{dist}-py3-none-any.whl", buf.getvalue()


@pytest.fixture
def index_lab(server, tmp_path_factory):
    """The egress lab's upstream serving a PEP 503 index with one wheel under /files/simple/."""
    if getattr(server, "egress_pki", None) is None:
        why = egresslab.missing_tools() or "the server was not started by this suite (BULKHEAD_TEST_URL)"
        pytest.skip(f"SKIPPED: egress lab unavailable: {why}")
    files = tmp_path_factory.mktemp("pypi")
    files.chmod(0o755)
    whl, data = _wheel("bulkhead-probe", "1.0", "bulkhead_probe", "ANSWER = 42\n")
    pkg = files / "simple" / "bulkhead-probe"
    pkg.mkdir(parents=True)
    (pkg / whl).write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    (pkg / "index.html").write_text(f'<!DOCTYPE html><html><body><a href="{whl}#sha256={sha}">{whl}</a></body></html>\n')
    (files / "simple" / "index.html").write_text('<a href="bulkhead-probe/">bulkhead-probe</a>\n')
    lab = egresslab.UpstreamLab(server.egress_pki, files=files).start()
    yield lab
    lab.close()
    assert not lab.exists(), "the test namespace or veth pair was left behind"


def test_pip_install_through_the_egress_proxy(sandbox_factory, index_lab):
    sbx = sandbox_factory(network={"allow_out": ["api.allowed.test"]})
    index = "http://api.allowed.test/files/simple/"
    out = ok(sbx, f"pip install --no-cache-dir --index-url {index} --trusted-host api.allowed.test bulkhead-probe")
    assert "Successfully installed bulkhead-probe-1.0" in out, out
    assert ok(sbx, "python3 -c 'import bulkhead_probe; print(bulkhead_probe.ANSWER)'").strip() == "42"
    # As root (sudo), pip installs system-wide: the marker that forbids it in Debian is gone.
    ok(sbx, f"sudo -n pip install --no-cache-dir --index-url {index} --trusted-host api.allowed.test --force-reinstall bulkhead-probe")
    assert ok(sbx, "python3 -c 'import bulkhead_probe; print(bulkhead_probe.__file__)'", user="root").startswith("/usr/local/lib/python3")
    # The request went through the proxy to the lab, by name.
    seen = [r for r in index_lab.requests() if r["path"].startswith("/files/")]
    assert any(r["path"].endswith(".whl") for r in seen), seen
    # A sandbox without that policy gets nothing.
    denied = sandbox_factory()
    code, out, err = sh(denied, f"pip install --no-cache-dir --retries 0 --timeout 5 --index-url {index} --trusted-host api.allowed.test bulkhead-probe")
    assert code != 0
