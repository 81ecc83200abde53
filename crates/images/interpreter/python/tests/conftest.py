"""Real IPython kernels started the way the template starts them (ipykernel + exec_files)."""

from __future__ import annotations

import json
import queue
import sys
import time
from pathlib import Path

import pytest
from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager

HERE = Path(__file__).resolve().parent
STARTUP_DIR = HERE.parent
STARTUP = STARTUP_DIR / "bulkhead_startup.py"
SQL = STARTUP_DIR / "bulkhead_sql.py"

EXEC_TIMEOUT = 120


def kernel_argv(exec_files: list) -> list:
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    if exec_files:
        # same spelling as crates/images/src/interpreter.rs: a Python list literal
        argv.append("--IPKernelApp.exec_files=[" + ", ".join(f"'{p}'" for p in exec_files) + "]")
    return argv


class Kernel:
    def __init__(self, tmp: Path, name: str, exec_files: list, env: dict | None = None) -> None:
        spec_dir = tmp / "kernels" / name
        spec_dir.mkdir(parents=True, exist_ok=True)
        spec = {
            "argv": kernel_argv(exec_files),
            "display_name": name,
            "language": "python",
            "env": {
                "MPLBACKEND": "module://matplotlib_inline.backend_inline",
                "TZ": "UTC",  # DuckDB renders TIMESTAMPTZ in the session zone
                **(env or {}),
            },
        }
        (spec_dir / "kernel.json").write_text(json.dumps(spec))
        ksm = KernelSpecManager(kernel_dirs=[str(tmp / "kernels")])
        self.cwd = tmp / f"cwd-{name}"
        self.cwd.mkdir(exist_ok=True)
        self.km = KernelManager(kernel_name=name, kernel_spec_manager=ksm)
        self.km.start_kernel(cwd=str(self.cwd))
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def run(self, code: str) -> dict:
        """Execute `code`; returns {"reply": content, "msgs": [(msg_type, content), ...]}."""
        msg_id = self.kc.execute(code, store_history=True)
        msgs = []
        deadline = time.monotonic() + EXEC_TIMEOUT
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no idle status for {code!r}; got {msgs!r}")
            try:
                msg = self.kc.get_iopub_msg(timeout=remaining)
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind = msg["msg_type"]
            if kind == "status":
                if msg["content"]["execution_state"] == "idle":
                    break
                continue
            msgs.append((kind, msg["content"]))
        reply = self.kc.get_shell_msg(timeout=EXEC_TIMEOUT)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = self.kc.get_shell_msg(timeout=EXEC_TIMEOUT)
        return {"reply": reply["content"], "msgs": msgs}

    def results(self, code: str) -> list:
        """Rich results (execute_result / display_data) of `code`; fails on any error."""
        out = self.run(code)
        errors = [c for k, c in out["msgs"] if k == "error"]
        assert not errors, "\n".join("\n".join(e["traceback"]) for e in errors)
        assert out["reply"]["status"] == "ok", out["reply"]
        return [(k, c) for k, c in out["msgs"] if k in ("execute_result", "display_data")]

    def stream(self, code: str) -> str:
        out = self.run(code)
        errors = [c for k, c in out["msgs"] if k == "error"]
        assert not errors, "\n".join("\n".join(e["traceback"]) for e in errors)
        return "".join(c["text"] for k, c in out["msgs"] if k == "stream" and c["name"] == "stdout")

    def chart(self, code: str) -> dict:
        """The single e2b/chart produced by `code` (which must display exactly one figure)."""
        res = self.results(code)
        charts = [c["data"]["e2b/chart"] for k, c in res if "e2b/chart" in c["data"]]
        assert len(charts) == 1, f"expected one chart, got {[(k, sorted(c['data'])) for k, c in res]}"
        return charts[0]

    def close(self) -> None:
        if self.km.has_kernel:
            self.kc.stop_channels()
            self.km.shutdown_kernel(now=True)


@pytest.fixture(scope="session")
def kernel(tmp_path_factory):
    k = Kernel(tmp_path_factory.mktemp("py"), "bulkhead-python", [STARTUP])
    yield k
    k.close()


@pytest.fixture()
def fresh_kernel(tmp_path):
    kernels = []

    def start(exec_files=(STARTUP,), env=None, name="fresh"):
        k = Kernel(tmp_path, f"{name}{len(kernels)}", list(exec_files), env)
        kernels.append(k)
        return k

    yield start
    for k in kernels:
        k.close()
