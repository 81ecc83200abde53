"""Small helpers for the current-SDK tests (imported as `_util`; pytest puts this dir on sys.path)."""

from __future__ import annotations

import datetime as dt
import logging
import time
import urllib.parse
from typing import List, Tuple


class RecordingLogger:
    """A `logging.Logger` for the SDK's `logger=` option; records "Request METHOD URL" lines
    so a test can check which endpoint the SDK really called."""

    def __init__(self, name: str):
        self.logger = logging.getLogger(f"bulkhead-test.{name}")
        self.logger.setLevel(logging.INFO)
        self.logger.propagate = False
        self.messages: List[str] = []
        outer = self

        class _H(logging.Handler):
            def emit(self, record):
                outer.messages.append(record.getMessage())

        self.logger.handlers = [_H()]

    def requests(self) -> List[Tuple[str, str]]:
        """(method, path) of every request the SDK logged."""
        out = []
        for m in self.messages:
            parts = m.split()
            if len(parts) >= 3 and parts[0] == "Request":
                out.append((parts[1].upper(), urllib.parse.urlsplit(parts[2]).path))
        return out


def now_utc() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def aware(t: dt.datetime) -> dt.datetime:
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)


def seconds_until(t: dt.datetime) -> float:
    return (aware(t) - now_utc()).total_seconds()


def poll(pred, timeout: float, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(interval)


def version_tuple(v: str) -> Tuple[int, ...]:
    core = v.split("-")[0].split("+")[0]
    return tuple(int(x) for x in core.split("."))
