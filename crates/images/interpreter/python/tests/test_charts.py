"""e2b/chart JSON produced by real matplotlib/seaborn figures in a kernel with our startup file."""

from __future__ import annotations

import datetime

import pytest


def test_line_chart_values_labels_units_and_linear_scale(kernel):
    chart = kernel.chart(
        """
import matplotlib.pyplot as plt
plt.figure()
plt.plot([0, 1, 2, 3], [0, 10, 20, 30], label="speed")
plt.plot([0, 1, 2, 3], [5, 5, 5, 5])
plt.xlabel("Time (s)")
plt.ylabel("Distance [m]")
plt.title("Motion")
plt.xlim(0, 3)
plt.ylim(0, 30)
plt.xticks([0, 1, 2, 3])
plt.yticks([0, 10, 20, 30])
plt.show()
"""
    )
    assert chart["type"] == "line"
    assert chart["title"] == "Motion"
    assert (chart["x_label"], chart["x_unit"]) == ("Time (s)", "s")
    assert (chart["y_label"], chart["y_unit"]) == ("Distance [m]", "m")
    assert chart["x_scale"] == "linear" and chart["y_scale"] == "linear"
    assert chart["x_ticks"] == [0.0, 1.0, 2.0, 3.0]
    assert chart["x_tick_labels"] == ["0", "1", "2", "3"]
    assert chart["y_ticks"] == [0.0, 10.0, 20.0, 30.0]
    assert chart["y_tick_labels"] == ["0", "10", "20", "30"]
    assert chart["elements"] == [
        {"label": "speed", "points": [[0.0, 0.0], [1.0, 10.0], [2.0, 20.0], [3.0, 30.0]]},
        {"label": "Line 1", "points": [[0.0, 5.0], [1.0, 5.0], [2.0, 5.0], [3.0, 5.0]]},
    ]


def test_datetime_axis_points_and_ticks_are_iso_strings(kernel):
    chart = kernel.chart(
        """
import datetime
import matplotlib.pyplot as plt
days = [datetime.datetime(2023, 9, 1) + datetime.timedelta(days=i) for i in range(3)]
plt.figure()
plt.plot(days, [1.5, 2.5, 3.5], label="temp")
plt.show()
"""
    )
    assert chart["type"] == "line"
    assert chart["x_scale"] == "datetime" and chart["y_scale"] == "linear"
    (line,) = chart["elements"]
    assert line["label"] == "temp"
    xs = [datetime.datetime.fromisoformat(p[0]) for p in line["points"]]
    assert [x.replace(tzinfo=None) for x in xs] == [datetime.datetime(2023, 9, d) for d in (1, 2, 3)]
    assert [p[1] for p in line["points"]] == [1.5, 2.5, 3.5]
    assert chart["x_ticks"], "datetime axis lost its ticks"
    for tick in chart["x_ticks"]:
        parsed = datetime.datetime.fromisoformat(tick).replace(tzinfo=None)
        assert datetime.datetime(2023, 9, 1) <= parsed <= datetime.datetime(2023, 9, 3)
    assert len(chart["x_tick_labels"]) == len(chart["x_ticks"])


def test_log_axis(kernel):
    chart = kernel.chart(
        """
import matplotlib.pyplot as plt
plt.figure()
plt.plot([1, 2, 3], [10, 100, 1000], label="growth")
plt.yscale("log")
plt.ylabel("Cases (log scale)")
plt.show()
"""
    )
    assert chart["type"] == "line"
    assert chart["y_scale"] == "log" and chart["x_scale"] == "linear"
    assert chart["y_unit"] == "log scale"
    assert chart["y_ticks"] == [10.0, 100.0, 1000.0]
    assert chart["y_tick_labels"] == ["10^{1}", "10^{2}", "10^{3}"]
    assert chart["elements"][0]["points"] == [[1.0, 10.0], [2.0, 100.0], [3.0, 1000.0]]


def test_categorical_axis_reports_category_names(kernel):
    chart = kernel.chart(
        """
import matplotlib.pyplot as plt
plt.figure()
plt.plot([1, 2, 3], ["low", "mid", "high"])
plt.show()
"""
    )
    assert chart["x_scale"] == "linear" and chart["y_scale"] == "categorical"
    assert chart["y_ticks"] == ["low", "mid", "high"]
    assert chart["y_tick_labels"] == ["low", "mid", "high"]
    assert chart["elements"][0]["points"] == [[1.0, "low"], [2.0, "mid"], [3.0, "high"]]


def test_scatter_chart(kernel):
    chart = kernel.chart(
        """
import matplotlib.pyplot as plt
plt.figure()
plt.scatter([1, 2, 3], [4, 5, 6], label="Dataset 1")
plt.scatter([7], [8])
plt.xlabel("A")
plt.ylabel("B")
plt.show()
"""
    )
    assert chart["type"] == "scatter"
    assert chart["title"] is None
    assert (chart["x_label"], chart["y_label"]) == ("A", "B")
    assert (chart["x_unit"], chart["y_unit"]) == (None, None)
    assert chart["x_scale"] == "linear" and chart["y_scale"] == "linear"
    assert chart["elements"] == [
        {"label": "Dataset 1", "points": [[1.0, 4.0], [2.0, 5.0], [3.0, 6.0]]},
        {"label": "Scatter 2", "points": [[7.0, 8.0]]},
    ]
    assert all(isinstance(t, float) for t in chart["x_ticks"] + chart["y_ticks"])
    assert all(isinstance(t, str) for t in chart["x_tick_labels"] + chart["y_tick_labels"])


def test_vertical_bar_chart(kernel):
    chart = kernel.chart(
        """
import matplotlib.pyplot as plt
plt.figure()
plt.bar(["Author A", "Author B", "Author C"], [100, 200, 300], label="Books Sold")
plt.xlabel("Authors")
plt.ylabel("Number of Books Sold")
plt.title("Book Sales by Authors")
plt.show()
"""
    )
    assert chart["type"] == "bar"
    assert chart["title"] == "Book Sales by Authors"
    assert (chart["x_label"], chart["y_label"]) == ("Authors", "Number of Books Sold")
    assert chart["elements"] == [
        {"label": "Author A", "group": "Books Sold", "value": 100.0},
        {"label": "Author B", "group": "Books Sold", "value": 200.0},
        {"label": "Author C", "group": "Books Sold", "value": 300.0},
    ]
    assert "x_ticks" not in chart  # bar charts carry no tick lists


def test_horizontal_bar_chart_swaps_axes(kernel):
    chart = kernel.chart(
        """
import matplotlib.pyplot as plt
plt.figure()
plt.barh(["red", "blue"], [5, 7])
plt.xlabel("Votes (k)")
plt.ylabel("Colour")
plt.show()
"""
    )
    assert chart["type"] == "bar"
    # the category axis is reported as x, the value axis as y
    assert (chart["x_label"], chart["x_unit"]) == ("Colour", None)
    assert (chart["y_label"], chart["y_unit"]) == ("Votes (k)", "k")
    assert chart["elements"] == [
        {"label": "red", "group": "Group 0", "value": 5.0},
        {"label": "blue", "group": "Group 0", "value": 7.0},
    ]


def test_grouped_bars_keep_their_groups(kernel):
    chart = kernel.chart(
        """
import numpy as np
import matplotlib.pyplot as plt
x = np.arange(2)
plt.figure()
plt.bar(x - 0.2, [1, 2], 0.4, label="2023")
plt.bar(x + 0.2, [3, 4], 0.4, label="2024")
plt.xticks(x, ["Q1", "Q2"])
plt.show()
"""
    )
    assert chart["type"] == "bar"
    # dodged bars take the label of the category tick they sit next to
    assert [(e["label"], e["group"], e["value"]) for e in chart["elements"]] == [
        ("Q1", "2023", 1.0), ("Q2", "2023", 2.0), ("Q1", "2024", 3.0), ("Q2", "2024", 4.0)
    ]


def test_histogram_bars_on_a_numeric_axis_are_labelled_by_position(kernel):
    chart = kernel.chart(
        """
import matplotlib.pyplot as plt
plt.figure()
plt.hist([1, 1, 2, 3, 3, 3], bins=[0.5, 1.5, 2.5, 3.5])
plt.show()
"""
    )
    assert chart["type"] == "bar"
    assert [(e["label"], e["value"]) for e in chart["elements"]] == [("1.0", 2.0), ("2.0", 1.0), ("3.0", 3.0)]


def test_pie_chart_angles(kernel):
    chart = kernel.chart(
        """
import matplotlib.pyplot as plt
plt.figure()
plt.pie([90, 10], labels=["No", "No, in blue"], startangle=90, autopct="%1.1f%%")
plt.xlabel("x")
plt.title("Will I wake up early tomorrow?")
plt.show()
"""
    )
    assert chart == {
        "type": "pie",
        "title": "Will I wake up early tomorrow?",
        "elements": [
            # matplotlib 3.10 keeps wedge angles in float32 (35.999996 for 36).
            {"label": "No", "angle": pytest.approx(324.0, abs=1e-4), "radius": 1.0},
            {"label": "No, in blue", "angle": pytest.approx(36.0, abs=1e-4), "radius": 1.0},
        ],
    }


BOX_EXPECTED = [
    # numpy percentiles (linear) of [1,2,3,4,5,20]: q1 2.25, median 3.5, q3 4.75;
    # 20 > q3 + 1.5 IQR = 8.5 is an outlier; the upper whisker stops at 5.
    {"label": "a", "min": 1.0, "first_quartile": 2.25, "median": 3.5, "third_quartile": 4.75,
     "max": 5.0, "outliers": [20.0]},
    {"label": "b", "min": 2.0, "first_quartile": 2.5, "median": 3.0, "third_quartile": 3.5,
     "max": 4.0, "outliers": []},
]


@pytest.mark.parametrize("patch_artist", [False, True])
def test_matplotlib_boxplot(kernel, patch_artist):
    chart = kernel.chart(
        f"""
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.boxplot([[1, 2, 3, 4, 5, 20], [2, 3, 4]], tick_labels=["a", "b"], patch_artist={patch_artist})
ax.set_title("Scores")
ax.set_xlabel("Class")
ax.set_ylabel("Score (pts)")
plt.show()
"""
    )
    assert chart["type"] == "box_and_whisker"
    assert chart["title"] == "Scores"
    assert (chart["x_label"], chart["y_label"], chart["y_unit"]) == ("Class", "Score (pts)", "pts")
    assert chart["elements"] == BOX_EXPECTED


def test_horizontal_boxplot_swaps_axes(kernel):
    chart = kernel.chart(
        """
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.boxplot([[1, 2, 3, 4, 5, 20], [2, 3, 4]], tick_labels=["a", "b"], orientation="horizontal")
ax.set_xlabel("Score")
ax.set_ylabel("Class")
plt.show()
"""
    )
    assert chart["type"] == "box_and_whisker"
    assert (chart["x_label"], chart["y_label"]) == ("Class", "Score")
    assert chart["elements"] == BOX_EXPECTED


def test_seaborn_boxplot_and_barplot(kernel):
    box = kernel.chart(
        """
import pandas as pd, seaborn as sns, matplotlib.pyplot as plt
df = pd.DataFrame({"g": ["x"] * 5 + ["y"] * 5, "v": [1, 2, 3, 4, 50, 5, 6, 7, 8, 9]})
plt.figure()
sns.boxplot(data=df, x="g", y="v")
plt.show()
"""
    )
    assert box["type"] == "box_and_whisker"
    assert (box["x_label"], box["y_label"]) == ("g", "v")
    assert box["elements"] == [
        {"label": "x", "min": 1.0, "first_quartile": 2.0, "median": 3.0, "third_quartile": 4.0,
         "max": 4.0, "outliers": [50.0]},
        {"label": "y", "min": 5.0, "first_quartile": 6.0, "median": 7.0, "third_quartile": 8.0,
         "max": 9.0, "outliers": []},
    ]

    bar = kernel.chart(
        """
df = pd.DataFrame({"g": ["x", "x", "y", "y"], "h": ["p", "q", "p", "q"], "v": [1, 3, 5, 7]})
plt.figure()
sns.barplot(data=df, x="g", y="v", hue="h")
plt.show()
"""
    )
    assert bar["type"] == "bar"
    assert sorted((e["label"], e["group"], e["value"]) for e in bar["elements"]) == [
        ("x", "p", 1.0), ("x", "q", 3.0), ("y", "p", 5.0), ("y", "q", 7.0)
    ]

    # mean bars with confidence-interval lines are still a bar chart
    mean_bar = kernel.chart(
        """
plt.figure()
sns.barplot(data=df, x="g", y="v")
plt.show()
"""
    )
    assert mean_bar["type"] == "bar"
    assert [(e["label"], e["value"]) for e in mean_bar["elements"]] == [("x", 2.0), ("y", 6.0)]


def test_seaborn_lineplot_with_band_is_a_line_chart(kernel):
    chart = kernel.chart(
        """
import pandas as pd, seaborn as sns, matplotlib.pyplot as plt
plt.figure()
sns.lineplot(data=pd.DataFrame({"x": [1, 1, 2, 2], "y": [1, 2, 3, 4]}), x="x", y="y")
plt.show()
"""
    )
    assert chart["type"] == "line"
    assert chart["elements"][0]["points"] == [[1.0, 1.5], [2.0, 3.5]]


def test_superchart(kernel):
    chart = kernel.chart(
        """
import matplotlib.pyplot as plt
fig, axs = plt.subplots(1, 2)
fig.suptitle("Multiple Graphs Example")
axs[0].plot([0, 1, 2], [0, 1, 4], "r")
axs[0].set_title("Sine Wave")
axs[1].scatter([1, 2], [3, 4], label="Dataset 1")
axs[1].set_xlabel("X")
axs[1].set_ylabel("Y")
axs[1].set_title("Scatter Plot")
plt.show()
"""
    )
    assert chart["type"] == "superchart"
    assert chart["title"] == "Multiple Graphs Example"
    first, second = chart["elements"]
    assert (first["type"], first["title"], first["x_label"], first["y_label"]) == ("line", "Sine Wave", None, None)
    assert first["elements"] == [{"label": "Line 0", "points": [[0.0, 0.0], [1.0, 1.0], [2.0, 4.0]]}]
    assert (second["type"], second["title"], second["x_label"], second["y_label"]) == ("scatter", "Scatter Plot", "X", "Y")
    assert second["elements"] == [{"label": "Dataset 1", "points": [[1.0, 3.0], [2.0, 4.0]]}]


def test_unknown_chart(kernel):
    chart = kernel.chart(
        """
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.add_artist(plt.Circle((0, 0), 1, fill=False))
ax.add_artist(plt.Circle((0, 0), 2, fill=False))
ax.grid(True)
plt.title("Two Concentric Circles")
plt.show()
"""
    )
    assert chart == {"type": "unknown", "title": "Two Concentric Circles", "elements": []}


def test_blank_figure_has_no_chart_but_still_an_image(kernel):
    res = kernel.results(
        """
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
plt.show()
"""
    )
    assert len(res) == 1
    kind, content = res[0]
    assert kind == "display_data"
    assert "image/png" in content["data"]
    assert "e2b/chart" not in content["data"]


def test_show_emits_png_text_and_chart_then_closes_figures(kernel):
    res = kernel.results(
        """
import matplotlib.pyplot as plt
plt.plot([1, 2], [3, 4])
plt.show()
"""
    )
    ((kind, content),) = res
    assert kind == "display_data"
    data = content["data"]
    assert set(data) >= {"image/png", "text/plain", "e2b/chart"}
    assert data["text/plain"].startswith("<Figure size")
    assert data["e2b/chart"]["type"] == "line"
    # the next cell neither re-shows the figure nor still has it open
    assert kernel.results("x = 1") == []
    assert kernel.stream("print(plt.get_fignums())").strip() == "[]"


def test_figure_left_open_at_end_of_cell_is_shown_once(kernel):
    res = kernel.results(
        """
import matplotlib.pyplot as plt
plt.figure()
plt.bar(["a"], [1])
"""
    )
    charts = [c["data"].get("e2b/chart") for k, c in res if k == "display_data"]
    assert [c["type"] for c in charts if c] == ["bar"]
    assert kernel.results("y = 2") == []


def test_untagged_patch_boxes_are_read_from_geometry(kernel):
    # Box plots drawn without going through our Axes.bxp hook (here: tags removed) still classify
    # and read back the same numbers from the drawn boxes, medians, whiskers, caps and fliers.
    chart = kernel.chart(
        """
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
parts = ax.boxplot([[1, 2, 3, 4, 5, 20], [2, 3, 4]], tick_labels=["a", "b"], patch_artist=True)
for artists in parts.values():
    for artist in artists:
        if hasattr(artist, "_bulkhead_bxp"):
            del artist._bulkhead_bxp
plt.show()
"""
    )
    assert chart["type"] == "box_and_whisker"
    assert chart["elements"] == BOX_EXPECTED
