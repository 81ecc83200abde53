"""Kernel start time with and without the startup files (not a test; prints numbers).

    run.sh's venv: /var/cache/bulkhead/venv-interp-*/bin/python tests/measure_startup.py [rounds]

Measures start_kernel -> first `1+1` executed (what a first run_code waits for), and the first
chart / DataFrame display after start (the lazily loaded parts).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import SQL, STARTUP, Kernel  # noqa: E402


def start_and_run(tmp: Path, name: str, exec_files: list) -> tuple[float, Kernel]:
    t0 = time.monotonic()
    k = Kernel(tmp, name, exec_files)
    k.run("1+1")
    return time.monotonic() - t0, k


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    tmp = Path(tempfile.mkdtemp())
    variants = {"plain ipykernel": [], "bulkhead_startup": [STARTUP], "startup + sql": [STARTUP, SQL]}
    times: dict = {v: [] for v in variants}
    first_chart = []
    first_df = []
    for r in range(rounds):
        for label, files in variants.items():
            took, k = start_and_run(tmp, f"m{r}{len(times[label])}{abs(hash(label)) % 1000}", files)
            times[label].append(took)
            if label == "bulkhead_startup":
                t0 = time.monotonic()
                k.chart("import matplotlib.pyplot as plt\nplt.plot([1, 2], [3, 4])\nplt.show()")
                first_chart.append(time.monotonic() - t0)
                t0 = time.monotonic()
                k.results("import pandas as pd\npd.DataFrame({'a': [1, 2]})")
                first_df.append(time.monotonic() - t0)
            k.close()
    for label, values in times.items():
        print(f"{label:18s} start->first result: median {statistics.median(values) * 1000:.0f} ms "
              f"(min {min(values) * 1000:.0f}, max {max(values) * 1000:.0f}, n={len(values)})")
    print(f"first plt.show() with chart: median {statistics.median(first_chart) * 1000:.0f} ms")
    print(f"first DataFrame display:     median {statistics.median(first_df) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
