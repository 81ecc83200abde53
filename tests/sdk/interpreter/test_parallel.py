"""Two code-interpreter sandboxes used at the same time: isolated state, concurrent execution."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor


def test_two_sandboxes_in_parallel(sandbox_factory):
    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(lambda _: sandbox_factory(), range(2))
    assert a.sandbox_id != b.sandbox_id
    a.run_code("who = 'A'")
    b.run_code("who = 'B'")
    assert a.run_code("who").text == "A"
    assert b.run_code("who").text == "B"

    barrier = threading.Barrier(2)

    def slow(sbx, tag):
        barrier.wait()
        t0 = time.monotonic()
        r = sbx.run_code(f"import time\ntime.sleep(2)\nwho + '{tag}'")
        return r.text, time.monotonic() - t0

    t0 = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        fa = pool.submit(slow, a, "1")
        fb = pool.submit(slow, b, "2")
        (ta, da), (tb, db) = fa.result(), fb.result()
    wall = time.monotonic() - t0
    assert (ta, tb) == ("A1", "B2")
    assert da >= 2 and db >= 2
    # Run side by side, not one after the other.
    assert wall < 3.8, f"two 2-second cells took {wall:.1f}s together"

    # Charts/DataFrames work in both at once as well.
    def df(sbx):
        return sbx.run_code("import pandas as pd\npd.DataFrame({'w': [who]})").results[0].data

    with ThreadPoolExecutor(2) as pool:
        assert list(pool.map(df, [a, b])) == [{"w": ["A"]}, {"w": ["B"]}]
