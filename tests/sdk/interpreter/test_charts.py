"""Charts as data: `plt.show()` must yield a result whose `chart` has E2B's JSON shape (§3.1) with
the figure's real values. Ticks and tick labels are cross-checked against what matplotlib itself
reports for the same figure inside the kernel, so the test does not depend on the matplotlib
version's tick locator. E2B reports every locator tick (`ax.get_xticks()`, which may include
ticks just outside the view limits); reporting only the ticks inside the view (the ones that
have labels) is accepted too, nothing else."""

from __future__ import annotations

import json

import pytest
from e2b_code_interpreter.charts import (
    BarChart,
    BoxAndWhiskerChart,
    ChartType,
    LineChart,
    PieChart,
    ScaleType,
    ScatterChart,
    SuperChart,
)

from _interp import only_chart, parse_iso

POINT_KEYS = {
    "type",
    "title",
    "elements",
    "x_label",
    "y_label",
    "x_unit",
    "y_unit",
    "x_ticks",
    "x_tick_labels",
    "x_scale",
    "y_ticks",
    "y_tick_labels",
    "y_scale",
}

AXIS_PROBE = """
import json as _json, matplotlib.dates as _mdates
def _axis_probe(ax, datetime_x=False):
    out = {"labels": [l.get_label() for l in ax.get_lines()]}
    for axis, ticks, labels, lim in (
        ("x", ax.get_xticks(), ax.get_xticklabels(), ax.get_xlim()),
        ("y", ax.get_yticks(), ax.get_yticklabels(), ax.get_ylim()),
    ):
        ticks, labels = list(ticks), [t.get_text() for t in labels]
        lo, hi = min(lim), max(lim)
        eps = (hi - lo) * 1e-9
        keep = [i for i, t in enumerate(ticks) if lo - eps <= t <= hi + eps]
        conv = (lambda ts: [_mdates.num2date(t).isoformat() for t in ts]) if (datetime_x and axis == "x") else (lambda ts: [float(t) for t in ts])
        out[axis + "_ticks"] = conv(ticks)
        out[axis + "_tick_labels"] = labels
        out[axis + "_ticks_visible"] = conv([ticks[i] for i in keep])
        out[axis + "_tick_labels_visible"] = [labels[i] for i in keep] if len(labels) == len(ticks) else labels
    return _json.dumps(out)
"""


def probe(sbx, expr: str) -> dict:
    r = sbx.run_code(expr)
    assert r.error is None, r.error
    return json.loads(r.text)


def bars(chart) -> list:
    """A bar chart's elements as (label, group, value)."""
    return [(e.label, e.group, float(e.value)) for e in chart.elements]


def assert_ticks(chart, exp, norm=lambda v: v):
    """Ticks and their labels: all locator ticks (E2B) or exactly the visible ones, as matplotlib
    itself reports them for this figure."""
    for axis in ("x", "y"):
        got = ([norm(t) for t in getattr(chart, f"{axis}_ticks")], getattr(chart, f"{axis}_tick_labels"))
        allowed = [
            ([norm(t) for t in exp[f"{axis}_ticks"]], exp[f"{axis}_tick_labels"]),
            ([norm(t) for t in exp[f"{axis}_ticks_visible"]], exp[f"{axis}_tick_labels_visible"]),
        ]
        assert got in allowed, f"{axis} ticks/labels {got} not in {allowed}"
        norm = lambda v: v  # only x can be a datetime axis


@pytest.fixture(scope="module")
def mpl(shared):
    r = shared.run_code("import numpy as np\nimport matplotlib.pyplot as plt\n" + AXIS_PROBE)
    assert r.error is None, r.error
    return shared


def test_line_chart_values(mpl):
    ex = mpl.run_code(
        "x = np.linspace(0, 10, 11)\n"
        "fig = plt.figure(figsize=(6, 4))\n"
        "plt.plot(x, x ** 2, label='square')\n"
        "plt.plot(x, 3 * x)\n"
        "plt.xlabel('Time (s)')\n"
        "plt.ylabel('Distance [m]')\n"
        "plt.title('Motion')\n"
        "plt.show()"
    )
    chart = only_chart(ex)
    assert isinstance(chart, LineChart) and chart.type == ChartType.LINE
    raw = chart.to_dict()
    assert POINT_KEYS <= set(raw), sorted(raw)
    assert chart.title == "Motion"
    assert (chart.x_label, chart.x_unit) == ("Time (s)", "s")
    assert (chart.y_label, chart.y_unit) == ("Distance [m]", "m")
    assert chart.x_scale == ScaleType.LINEAR and chart.y_scale == ScaleType.LINEAR
    exp = probe(mpl, "_axis_probe(fig.axes[0])")
    assert all(exp["x_tick_labels_visible"]), exp
    assert_ticks(chart, exp)
    assert [e.label for e in chart.elements] == ["square", "Line " + exp["labels"][1].removeprefix("_child")]
    assert exp["labels"][1].startswith("_child")
    xs = [float(i) for i in range(11)]
    assert [tuple(p) for p in chart.elements[0].points] == [(v, v * v) for v in xs]
    assert [tuple(p) for p in chart.elements[1].points] == [(v, 3 * v) for v in xs]


def test_line_chart_datetime_axis(mpl):
    ex = mpl.run_code(
        "import datetime as dt\n"
        "days = [dt.datetime(2024, 1, 1) + dt.timedelta(days=i) for i in range(5)]\n"
        "fig = plt.figure()\n"
        "plt.plot(days, [1, 3, 2, 5, 4], label='visits')\n"
        "plt.title('Visits per day')\n"
        "plt.show()"
    )
    chart = only_chart(ex)
    assert isinstance(chart, LineChart)
    assert chart.x_scale == ScaleType.DATETIME
    assert chart.y_scale == ScaleType.LINEAR
    (line,) = chart.elements
    assert line.label == "visits"
    xs = [parse_iso(x) for x, _ in line.points]
    assert [(x.year, x.month, x.day, x.hour) for x in xs] == [(2024, 1, d, 0) for d in range(1, 6)]
    assert [float(y) for _, y in line.points] == [1.0, 3.0, 2.0, 5.0, 4.0]
    exp = probe(mpl, "_axis_probe(fig.axes[0], datetime_x=True)")
    assert all(isinstance(t, str) for t in chart.x_ticks), chart.x_ticks
    assert_ticks(chart, exp, norm=parse_iso)


def test_line_chart_categorical_and_log_scales(mpl):
    ex = mpl.run_code(
        "fig = plt.figure()\n"
        "plt.plot(['mon', 'tue', 'wed'], [10, 100, 1000])\n"
        "plt.yscale('log')\n"
        "plt.show()"
    )
    chart = only_chart(ex)
    assert isinstance(chart, LineChart)
    assert chart.x_scale == ScaleType.CATEGORICAL
    assert chart.y_scale == ScaleType.LOG
    assert chart.title is None and chart.x_label is None and chart.x_unit is None
    assert chart.x_tick_labels == ["mon", "tue", "wed"]


def test_scatter_chart(mpl):
    ex = mpl.run_code(
        "fig = plt.figure()\n"
        "plt.scatter([1, 2, 3], [4, 5, 6], label='A')\n"
        "plt.scatter([7, 8], [9, 10], label='B')\n"
        "plt.xlabel('Weight (kg)')\n"
        "plt.ylabel('Height (cm)')\n"
        "plt.title('People')\n"
        "plt.show()"
    )
    chart = only_chart(ex)
    assert isinstance(chart, ScatterChart) and chart.type == ChartType.SCATTER
    assert POINT_KEYS <= set(chart.to_dict())
    assert chart.title == "People"
    assert (chart.x_unit, chart.y_unit) == ("kg", "cm")
    assert [e.label for e in chart.elements] == ["A", "B"]
    assert [tuple(map(float, p)) for p in chart.elements[0].points] == [(1, 4), (2, 5), (3, 6)]
    assert [tuple(map(float, p)) for p in chart.elements[1].points] == [(7, 9), (8, 10)]
    exp = probe(mpl, "_axis_probe(fig.axes[0])")
    assert_ticks(chart, exp)


def test_bar_chart_grouped(mpl):
    ex = mpl.run_code(
        "fig, ax = plt.subplots()\n"
        "x = np.arange(3)\n"
        "ax.bar(x - 0.2, [1, 2, 3], 0.4, label='2023')\n"
        "ax.bar(x + 0.2, [4, 5, 6], 0.4, label='2024')\n"
        "ax.set_xticks(x, ['Q1', 'Q2', 'Q3'])\n"
        "ax.set_xlabel('Quarter')\n"
        "ax.set_ylabel('Revenue (USD)')\n"
        "ax.set_title('Revenue')\n"
        "plt.show()"
    )
    chart = only_chart(ex)
    assert isinstance(chart, BarChart) and chart.type == ChartType.BAR
    assert chart.title == "Revenue"
    assert (chart.x_label, chart.x_unit) == ("Quarter", None)
    assert (chart.y_label, chart.y_unit) == ("Revenue (USD)", "USD")
    got = bars(chart)
    assert got == [
        ("Q1", "2023", 1.0),
        ("Q2", "2023", 2.0),
        ("Q3", "2023", 3.0),
        ("Q1", "2024", 4.0),
        ("Q2", "2024", 5.0),
        ("Q3", "2024", 6.0),
    ]


def test_bar_chart_unnamed_group(mpl):
    ex = mpl.run_code(
        "fig = plt.figure()\n"
        "plt.bar(['apples', 'pears', 'plums'], [30, 10, 20])\n"
        "plt.show()\n"
        "fig.axes[0].containers[0].get_label()"
    )
    chart = only_chart(ex)
    assert isinstance(chart, BarChart)
    internal = ex.text
    assert internal.startswith("_container"), internal
    assert bars(chart) == [
        (name, "Group " + internal.removeprefix("_container"), v)
        for name, v in [("apples", 30.0), ("pears", 10.0), ("plums", 20.0)]
    ]


def test_bar_chart_horizontal(mpl):
    ex = mpl.run_code(
        "fig = plt.figure()\n"
        "plt.barh(['north', 'south', 'east'], [7, 3, 5], label='sales')\n"
        "plt.xlabel('Units (k)')\n"
        "plt.ylabel('Region')\n"
        "plt.title('By region')\n"
        "plt.show()"
    )
    chart = only_chart(ex)
    assert isinstance(chart, BarChart)
    # Horizontal bars are reported with the axes swapped: x is the category axis.
    assert (chart.x_label, chart.x_unit) == ("Region", None)
    assert (chart.y_label, chart.y_unit) == ("Units (k)", "k")
    assert bars(chart) == [
        ("north", "sales", 7.0),
        ("south", "sales", 3.0),
        ("east", "sales", 5.0),
    ]


def test_pie_chart(mpl):
    ex = mpl.run_code(
        "fig = plt.figure()\n"
        "plt.pie([1, 1, 2], labels=['a', 'b', 'c'])\n"
        "plt.title('Share')\n"
        "plt.show()"
    )
    chart = only_chart(ex)
    assert isinstance(chart, PieChart) and chart.type == ChartType.PIE
    assert chart.title == "Share"
    got = [(e.label, round(float(e.angle), 6), float(e.radius)) for e in chart.elements]
    assert got == [("a", 90.0, 1.0), ("b", 90.0, 1.0), ("c", 180.0, 1.0)]


def test_box_and_whisker_chart(mpl):
    ex = mpl.run_code(
        "fig, ax = plt.subplots()\n"
        "ax.boxplot([[1, 2, 3, 4, 5], [10, 20, 30, 40, 200]], patch_artist=True)\n"
        "ax.set_xticks([1, 2], ['small', 'big'])\n"
        "ax.set_title('Spread')\n"
        "ax.set_xlabel('Set')\n"
        "ax.set_ylabel('Value (pts)')\n"
        "plt.show()"
    )
    chart = only_chart(ex)
    assert isinstance(chart, BoxAndWhiskerChart) and chart.type == ChartType.BOX_AND_WHISKER
    assert chart.title == "Spread"
    assert (chart.x_label, chart.y_label, chart.y_unit) == ("Set", "Value (pts)", "pts")
    got = [
        (e.label, float(e.min), float(e.first_quartile), float(e.median), float(e.third_quartile), float(e.max), [float(o) for o in e.outliers])
        for e in chart.elements
    ]
    assert got == [
        ("small", 1.0, 2.0, 3.0, 4.0, 5.0, []),
        ("big", 10.0, 20.0, 30.0, 40.0, 40.0, [200.0]),
    ]


@pytest.mark.parametrize("kwarg", ["labels", "tick_labels"])
def test_box_and_whisker_chart_with_labels_kwarg(mpl, kwarg):
    """What LLM-written plotting code does: `labels=` (matplotlib < 3.9, removed in 3.11) or
    `tick_labels=` (3.9+); both must run and give the chart's data, not only a PNG."""
    ex = mpl.run_code(
        "import numpy as np\n"
        "fig, ax = plt.subplots()\n"
        f"ax.boxplot([[1, 2, 3, 4, 5], [10, 20, 30, 40, 200]], {kwarg}=['small', 'big'])\n"
        "ax.set_title('Spread')\n"
        "plt.show()"
    )
    assert ex.error is None, ex.error
    chart = only_chart(ex)
    assert isinstance(chart, BoxAndWhiskerChart) and chart.type == ChartType.BOX_AND_WHISKER
    assert ex.results[0].png
    got = [(e.label, float(e.median), [float(o) for o in e.outliers]) for e in chart.elements]
    assert got == [("small", 3.0, []), ("big", 30.0, [200.0])]


def test_pandas_2_idioms(mpl):
    """pandas idioms common in LLM-written code that pandas 3's copy-on-write turns into silent
    no-ops: in-place fill on a column and chained assignment."""
    ex = mpl.run_code(
        "import pandas as pd, numpy as np\n"
        "df = pd.DataFrame({'a': [1.0, np.nan, 3.0], 'b': ['x', 'y', 'z']})\n"
        "import warnings\n"
        "with warnings.catch_warnings():\n"
        "    warnings.simplefilter('ignore')\n"
        "    df['a'].fillna(0, inplace=True)\n"
        "    df['b'][0] = 'w'\n"
        "(df['a'].tolist(), df['b'].tolist(), str(df['b'].dtype))"
    )
    assert ex.error is None, ex.error
    assert ex.text == "([1.0, 0.0, 3.0], ['w', 'y', 'z'], 'object')"


def test_superchart(mpl):
    ex = mpl.run_code(
        "fig, (a1, a2) = plt.subplots(1, 2, figsize=(8, 3))\n"
        "a1.plot([1, 2, 3], [1, 4, 9], label='sq')\n"
        "a1.set_title('Line part')\n"
        "a2.bar(['x', 'y'], [3, 4], label='b')\n"
        "a2.set_title('Bar part')\n"
        "fig.suptitle('Overview')\n"
        "plt.show()"
    )
    chart = only_chart(ex)
    assert isinstance(chart, SuperChart) and chart.type == ChartType.SUPERCHART
    assert chart.title == "Overview"
    assert [type(c) for c in chart.elements] == [LineChart, BarChart]
    line, bar = chart.elements
    assert line.title == "Line part" and bar.title == "Bar part"
    assert [tuple(map(float, p)) for p in line.elements[0].points] == [(1, 1), (2, 4), (3, 9)]
    assert bars(bar) == [("x", "b", 3.0), ("y", "b", 4.0)]


def test_mixed_axes_are_unknown(mpl):
    ex = mpl.run_code(
        "fig = plt.figure()\n"
        "plt.plot([0, 1, 2], [0, 2, 1])\n"
        "plt.bar([0, 1], [1, 2])\n"
        "plt.title('Mixed')\n"
        "plt.show()"
    )
    chart = only_chart(ex)
    assert chart.type == ChartType.UNKNOWN
    assert chart.title == "Mixed"


def test_two_figures_two_charts(mpl):
    ex = mpl.run_code(
        "plt.figure(); plt.plot([1, 2], [3, 4]); plt.title('one'); plt.show()\n"
        "plt.figure(); plt.pie([1, 3]); plt.title('two'); plt.show()"
    )
    assert ex.error is None, ex.error
    got = [(r.chart.type, r.chart.title) for r in ex.results if r.chart is not None]
    assert got == [(ChartType.LINE, "one"), (ChartType.PIE, "two")]
