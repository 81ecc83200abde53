"""Helpers for the code-interpreter suite (imported as `_interp`; pytest puts this dir on sys.path)."""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import re
import struct
import zlib
from typing import List, Optional, Tuple

from bulkhead_testlib import http

JUPYTER_PORT = 49999


def raw(sbx, method: str, path: str, body=None, *, token: bool = True, timeout: float = 60):
    """A request to the sandbox's port-49999 API the way the SDK routes it (one base URL,
    `E2b-Sandbox-Id` / `E2b-Sandbox-Port` headers), for wire details the SDK hides (it checks
    context+language client-side, for example)."""
    base = os.environ["E2B_SANDBOX_URL"].rstrip("/")
    headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": str(JUPYTER_PORT)}
    tok = getattr(sbx, "_envd_access_token", None)
    if token and tok:
        headers["X-Access-Token"] = tok
    return http(method, base + path, body, headers=headers, timeout=timeout)


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def plain(s: str) -> str:
    """Text without ANSI colour codes (IPython colours tracebacks, as on E2B)."""
    return _ANSI.sub("", s)


def ndjson(body: bytes) -> List[dict]:
    lines = body.decode().split("\n")
    assert lines[-1] == "", f"NDJSON must end with a newline: {body[-200:]!r}"
    return [json.loads(line) for line in lines[:-1] if line.strip()]


def charts(execution) -> list:
    """The results that carry chart data, in order."""
    return [r for r in execution.results if r.chart is not None]


def only_chart(execution):
    assert execution.error is None, f"cell failed: {execution.error}"
    found = charts(execution)
    assert len(found) == 1, f"expected exactly one chart, got {len(found)}: {[r.formats() for r in execution.results]}"
    res = found[0]
    # plt.show() gives one display_data carrying the PNG, the text repr and the chart.
    assert res.is_main_result is False
    assert res.png, "the chart result must also carry the rendered PNG"
    assert png_size(res.png)[0] > 0
    assert res.text and res.text.startswith("<Figure size"), res.text
    return res.chart


def parse_iso(s: str) -> dt.datetime:
    """An ISO-8601 timestamp as a naive UTC datetime (formats differ in offset/`Z` spelling)."""
    t = dt.datetime.fromisoformat(s.replace("Z", "+00:00"))
    if t.tzinfo is not None:
        t = t.astimezone(dt.timezone.utc).replace(tzinfo=None)
    return t


# ---- minimal PNG decoding (8-bit RGB/RGBA, non-interlaced), enough to check pixel values ------


def _png_chunks(data: bytes):
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"not a PNG: {data[:16]!r}"
    pos = 8
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        yield kind, data[pos + 8 : pos + 8 + length]
        pos += 12 + length


def png_size(b64: str) -> Tuple[int, int]:
    data = base64.b64decode(b64)
    for kind, body in _png_chunks(data):
        if kind == b"IHDR":
            w, h = struct.unpack(">II", body[:8])
            return w, h
    raise AssertionError("PNG without IHDR")


def png_pixels(b64: str) -> Tuple[int, int, List[List[Tuple[int, ...]]]]:
    """(width, height, rows of pixel tuples) of an 8-bit RGB or RGBA PNG."""
    data = base64.b64decode(b64)
    idat = b""
    w = h = 0
    channels: Optional[int] = None
    for kind, body in _png_chunks(data):
        if kind == b"IHDR":
            w, h, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and interlace == 0, f"unsupported PNG: depth {depth} interlace {interlace}"
            channels = {2: 3, 6: 4}.get(color)
            assert channels, f"unsupported PNG colour type {color}"
        elif kind == b"IDAT":
            idat += body
    raw_rows = zlib.decompress(idat)
    stride = w * channels
    rows, prev = [], bytearray(stride)
    for y in range(h):
        ftype = raw_rows[y * (stride + 1)]
        line = bytearray(raw_rows[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if ftype == 1:
                line[i] = (line[i] + a) & 0xFF
            elif ftype == 2:
                line[i] = (line[i] + b) & 0xFF
            elif ftype == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif ftype == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pred) & 0xFF
        rows.append([tuple(line[x * channels : (x + 1) * channels]) for x in range(w)])
        prev = line
    return w, h, rows
