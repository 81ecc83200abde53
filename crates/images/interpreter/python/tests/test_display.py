"""DataFrame e2b/data, application/json, PIL save -> image, and startup hygiene, in a real kernel."""

from __future__ import annotations

import base64
import os
import json


def only_result(kernel, code):
    res = kernel.results(code)
    assert len(res) == 1, res
    return res[0]


def test_dataframe_gets_e2b_data_next_to_text_and_html(kernel):
    kind, content = only_result(
        kernel,
        """
import numpy as np
import pandas as pd
pd.DataFrame({
    "a": [1, 2, 3],
    "f": [1.5, np.nan, 3.0],
    "t": pd.to_datetime(["2024-01-02 03:04:05", None, "2024-12-31 00:00:00"]),
    "s": ["x", None, "z"],
    "b": [True, False, True],
})
""",
    )
    assert kind == "execute_result"
    data = content["data"]
    assert {"text/plain", "text/html", "e2b/data"} <= set(data)
    assert "<table" in data["text/html"]
    assert data["e2b/data"] == {
        "a": [1, 2, 3],
        "f": [1.5, None, 3.0],
        "t": ["2024-01-02T03:04:05", None, "2024-12-31T00:00:00"],
        "s": ["x", None, "z"],
        "b": [True, False, True],
    }


def test_displayed_dataframe_and_odd_columns(kernel):
    kind, content = only_result(
        kernel,
        """
df = pd.DataFrame({1: [np.int64(7)], ("m", "n"): [pd.Timedelta("1D")], "d": [np.datetime64("2020-01-01")]})
display(df)
""",
    )
    assert kind == "display_data"
    assert content["data"]["e2b/data"] == {
        "1": [7],
        "('m', 'n')": ["1 days 00:00:00"],
        "d": ["2020-01-01T00:00:00"],
    }


def test_series_has_no_e2b_data(kernel):
    _, content = only_result(kernel, "pd.Series([1, 2])")
    assert "e2b/data" not in content["data"]


def test_dict_and_list_results_get_numpy_aware_json(kernel):
    _, content = only_result(kernel, "{'a': np.int64(3), 'b': [np.float32(1.5), float('nan')], 'c': np.arange(3)}")
    data = content["data"]
    assert data["application/json"] == {"a": 3, "b": [1.5, None], "c": [0, 1, 2]}
    # the plain-text repr is untouched
    assert data["text/plain"].startswith("{'a': ")

    _, content = only_result(kernel, "[1, 'two', None, True]")
    assert content["data"]["application/json"] == [1, "two", None, True]


def test_no_json_for_values_json_cannot_represent(kernel):
    _, content = only_result(kernel, "[object()]")
    assert "application/json" not in content["data"]
    _, content = only_result(kernel, "{1: 'int key'}")
    assert "application/json" not in content["data"]
    _, content = only_result(kernel, "(1, 2)")
    assert "application/json" not in content["data"]
    _, content = only_result(kernel, "'text'")
    assert set(content["data"]) == {"text/plain"}


def test_pil_save_to_a_path_displays_the_image(kernel, tmp_path):
    target = tmp_path / "out.png"
    res = kernel.results(
        f"""
import numpy
from PIL import Image
image = Image.fromarray((numpy.random.rand(16, 16, 3) * 255).astype('uint8')).convert('RGBA')
image.save({str(target)!r})
print("Image saved.")
"""
    )
    ((kind, content),) = res
    assert kind == "display_data"
    png = base64.b64decode(content["data"]["image/png"])
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert target.read_bytes().startswith(b"\x89PNG")


def test_pil_save_to_a_buffer_or_from_libraries_does_not_display(kernel, tmp_path):
    res = kernel.results(
        f"""
import io
import matplotlib.pyplot as plt
buf = io.BytesIO()
image.save(buf, format="PNG")
fig = plt.figure()
plt.plot([1, 2])
fig.savefig({str(tmp_path / "fig.jpg")!r})  # matplotlib saves JPEG through PIL
plt.close(fig)
"""
    )
    assert res == []


def test_pil_show_displays_the_image(fresh_kernel, tmp_path):
    """Even where a desktop viewer is on PATH (the template has `xdg-open`, through R's
    dependencies), which Pillow would otherwise prefer and which shows nothing in a sandbox."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ran = tmp_path / "xdg-open-ran"
    viewer = bin_dir / "xdg-open"
    viewer.write_text(f"#!/bin/sh\ntouch {ran}\n")
    viewer.chmod(0o755)
    k = fresh_kernel(env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    res = k.results("from PIL import Image\nImage.new('RGB', (4, 4), 'red').show()")
    assert any("image/png" in c["data"] for _, c in res), res
    assert not ran.exists(), "Pillow ran the desktop viewer"


def test_startup_leaves_the_user_namespace_clean_and_imports_nothing_heavy(fresh_kernel):
    k = fresh_kernel()
    out = k.stream(
        """
import sys, json
heavy = sorted(m for m in ("pandas", "numpy", "matplotlib", "PIL", "duckdb", "bulkhead_charts", "bulkhead_sql") if m in sys.modules)
mine = sorted(n for n in globals() if "bulkhead" in n.lower() or n in ("json_safe", "install", "datetime", "warnings"))
print(json.dumps({"heavy": heavy, "mine": mine, "startup": "bulkhead_startup" in sys.modules}))
"""
    )
    info = json.loads(out)
    assert info == {"heavy": [], "mine": [], "startup": True}
    # only the names this test cell defined
    assert k.stream("%who").split() == ["heavy", "json", "mine", "sys"]


def test_sql_startup_binds_only_the_entry_point(fresh_kernel):
    from conftest import SQL, STARTUP

    k = fresh_kernel(exec_files=(STARTUP, SQL))
    out = k.stream("print(sorted(n for n in globals() if not n.startswith('__') and n not in ('In', 'Out', 'exit', 'quit', 'get_ipython', 'open')))")
    assert out.strip() == "['_', '_bulkhead_sql_run', '_dh', '_i', '_i1', '_ih', '_ii', '_iii', '_oh']"
