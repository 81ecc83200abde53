"""Matplotlib figure -> E2B chart JSON (the `e2b/chart` MIME type).

Bulkhead's own implementation of the chart shapes described in
shared/reference/e2b-protocol.md §3.1 (field names as in the `e2b_code_interpreter` SDK's
`charts.py`). Every value is plain JSON: floats (NaN/inf -> null), strings, lists, dicts.

Entry point: `chart_from_figure(fig) -> dict | None` (None = the figure holds no chart).
Reads the artists as they are drawn, so seaborn (which draws through matplotlib) is covered too.
Box plots are recognised from the artists `Axes.bxp` returned (tagged by `tag_bxp_artists`, which
bulkhead_startup hooks into matplotlib), falling back to geometry for untagged PathPatch boxes.
"""

from __future__ import annotations

import math
import re
from typing import Any, Optional

import matplotlib.dates as mdates
from matplotlib.category import StrCategoryConverter, UnitData
from matplotlib.collections import LineCollection, PathCollection, PolyCollection
from matplotlib.container import BarContainer
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import PathPatch, Rectangle, Wedge
from matplotlib.ticker import FixedFormatter, FuncFormatter

# Scale names the SDKs know; anything else is reported as "unknown".
_KNOWN_SCALES = {"linear", "log", "symlog", "logit", "function", "functionlog", "asinh"}

# Attribute set on artists returned by Axes.bxp: (call token, role, box index).
BXP_TAG = "_bulkhead_bxp"
_bxp_calls = 0


def tag_bxp_artists(result: Any) -> Any:
    """Mark the artists of one `Axes.bxp` call so the box plot can be read back exactly."""
    global _bxp_calls
    _bxp_calls += 1
    token = _bxp_calls
    if not isinstance(result, dict):
        return result
    for role, artists in result.items():
        for i, artist in enumerate(artists or []):
            # whiskers and caps come two per box
            index = i // 2 if role in ("whiskers", "caps") else i
            try:
                setattr(artist, BXP_TAG, (token, role, index))
            except Exception:
                pass
    return result


# ---------------------------------------------------------------------------------------------
# small helpers


def _num(value: Any) -> Optional[float]:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _text_or_none(text: Optional[str]) -> Optional[str]:
    if text is None:
        return None
    text = str(text)
    return text if text.strip() else None


_UNIT_PATTERNS = (re.compile(r"\(([^()]*)\)"), re.compile(r"\[([^\[\]]*)\]"))


def _unit(label: Optional[str]) -> Optional[str]:
    """Unit from "Distance (km)" or "Distance [km]"; the last such group wins."""
    if not label:
        return None
    for pattern in _UNIT_PATTERNS:
        found = [m.strip() for m in pattern.findall(label) if m.strip()]
        if found:
            return found[-1]
    return None


_MATHDEFAULT = re.compile(r"\\mathdefault\{((?:[^{}]|\{[^{}]*\})*)\}")


def _clean_tick_label(text: str) -> str:
    # Log axes format ticks as mathtext ("$\mathdefault{10^{2}}$"); keep the readable part.
    if "$" in text:
        text = _MATHDEFAULT.sub(r"\1", text).replace("$", "")
        text = text.replace("\\times", "×").replace("\\cdot", "·").replace("\\minus", "−")
    return text


def _axis_converter(axis) -> Any:
    getter = getattr(axis, "get_converter", None)
    if getter is not None:
        try:
            return getter()
        except Exception:
            pass
    return getattr(axis, "converter", None)


_DATE_CONVERTERS = tuple(
    c
    for c in (
        getattr(mdates, "DateConverter", None),
        getattr(mdates, "_SwitchableDateConverter", None),
        getattr(mdates, "ConciseDateConverter", None),
    )
    if c is not None
)
_DATE_FORMATTERS = (mdates.DateFormatter, mdates.AutoDateFormatter, mdates.ConciseDateFormatter)


def _is_date_axis(axis) -> bool:
    conv = _axis_converter(axis)
    if conv is not None and _DATE_CONVERTERS:
        if isinstance(conv, _DATE_CONVERTERS):
            return True
        if isinstance(conv, type) and issubclass(conv, _DATE_CONVERTERS):
            return True
    return isinstance(axis.get_major_formatter(), _DATE_FORMATTERS)


def _category_mapping(axis) -> Optional[dict]:
    """position -> category name for axes using matplotlib's string category units."""
    conv = _axis_converter(axis)
    units = getattr(axis, "units", None)
    if isinstance(units, UnitData) and (
        conv is None or isinstance(conv, StrCategoryConverter) or conv is StrCategoryConverter
    ):
        return {float(pos): str(name) for name, pos in units._mapping.items()}
    return None


def _is_number(text: str) -> bool:
    t = text.strip().replace("−", "-")
    for decoration in (",", "%", "$", "€", "£", "¥", " "):
        t = t.replace(decoration, "")
    if not t:
        return True
    try:
        float(t)
        return True
    except ValueError:
        return False


class _Axis:
    """One x or y axis: scale, value converter, visible ticks and their labels."""

    def __init__(self, axis) -> None:
        self.axis = axis
        self.categories = _category_mapping(axis)
        self.tick_locs, self.tick_labels = self._visible_ticks()
        self.scale = self._scale()

    def _visible_ticks(self) -> tuple[list, list]:
        axis = self.axis
        try:
            locs = [float(v) for v in axis.get_majorticklocs()]
        except Exception:
            return [], []
        lo, hi = sorted(float(v) for v in axis.get_view_interval())
        tol = abs(hi - lo) * 1e-9
        locs = [v for v in locs if math.isfinite(v) and lo - tol <= v <= hi + tol]
        try:
            labels = [str(s) for s in axis.get_major_formatter().format_ticks(locs)]
        except Exception:
            labels = [str(t.get_text()) for t in axis.get_majorticklabels()]
        if len(labels) != len(locs):
            labels = [f"{v:g}" for v in locs]
        return locs, [_clean_tick_label(s) for s in labels]

    def _scale(self) -> str:
        name = self.axis.get_scale()
        if name != "linear":
            return name if name in _KNOWN_SCALES else "unknown"
        if _is_date_axis(self.axis):
            return "datetime"
        if self.categories is not None:
            return "categorical"
        # set_ticklabels installs a FixedFormatter (FuncFormatter since matplotlib 3.10)
        if isinstance(self.axis.get_major_formatter(), (FixedFormatter, FuncFormatter)) and not all(
            _is_number(s) for s in self.tick_labels
        ):
            return "categorical"
        return "linear"

    def value(self, v: Any) -> Any:
        """A data coordinate as the chart reports it (ISO string on date axes, category name)."""
        f = _num(v)
        if f is None:
            return None
        if self.scale == "datetime":
            try:
                return mdates.num2date(f).isoformat()
            except (ValueError, OverflowError):
                return None
        if self.categories is not None:
            name = self.categories.get(float(round(f)))
            if name is not None and abs(f - round(f)) < 1e-9:
                return name
        return f

    def ticks(self) -> list:
        # Locators step in binary floating point (1.2000000000000002); report what they meant.
        return [self.value(float(f"{v:.12g}")) for v in self.tick_locs]

    def label_at(self, pos: float) -> str:
        """Category label for a bar/box centred at `pos` on this axis.

        On category-like axes (string units, or fixed tick labels) a dodged bar takes the label of
        the nearest tick within half a tick spacing; on numeric axes only an exact tick counts.
        """
        if self.categories is not None:
            nearest = min(self.categories, key=lambda c: abs(c - pos), default=None)
            if nearest is not None and abs(nearest - pos) < 0.5:
                return self.categories[nearest]
        span = max((abs(v) for v in self.tick_locs), default=1.0) or 1.0
        for loc, text in zip(self.tick_locs, self.tick_labels):
            if abs(loc - pos) <= 1e-6 * span and text.strip():
                return text
        if self.scale == "categorical" and self.tick_locs:
            locs = sorted(self.tick_locs)
            spacing = min((b - a for a, b in zip(locs, locs[1:]) if b > a), default=1.0)
            best = min(range(len(self.tick_locs)), key=lambda i: abs(self.tick_locs[i] - pos))
            if abs(self.tick_locs[best] - pos) < spacing / 2 and self.tick_labels[best].strip():
                return self.tick_labels[best]
        if self.scale == "datetime":
            return str(self.value(pos))
        return f"{pos:g}"


# ---------------------------------------------------------------------------------------------
# per-axes extraction


def _title(ax, fallback: Optional[str] = None) -> Optional[str]:
    for loc in ("center", "left", "right"):
        t = _text_or_none(ax.get_title(loc))
        if t:
            return t
    return fallback


def _suptitle(fig) -> Optional[str]:
    sup = getattr(fig, "_suptitle", None)
    return _text_or_none(sup.get_text()) if sup is not None else None


def _chart2d_fields(ax, swap: bool = False) -> dict:
    x_label = _text_or_none(ax.get_xlabel())
    y_label = _text_or_none(ax.get_ylabel())
    if swap:
        x_label, y_label = y_label, x_label
    return {"x_label": x_label, "y_label": y_label, "x_unit": _unit(x_label), "y_unit": _unit(y_label)}


def _point_fields(ax, x: _Axis, y: _Axis) -> dict:
    fields = _chart2d_fields(ax)
    fields.update(
        {
            "x_ticks": x.ticks(),
            "x_tick_labels": list(x.tick_labels),
            "x_scale": x.scale,
            "y_ticks": y.ticks(),
            "y_tick_labels": list(y.tick_labels),
            "y_scale": y.scale,
        }
    )
    return fields


def _is_data_line(ax, line: Line2D) -> bool:
    # axhline/axvline and axes-relative decorations are not data series.
    if not line.get_visible() or line.get_transform() is not ax.transData:
        return False
    try:
        return len(line.get_xydata()) > 0
    except Exception:
        return False


def _is_error_bar_line(line: Line2D) -> bool:
    """Marker-only cap lines, or a two-point vertical/horizontal segment (seaborn's CI)."""
    if line.get_linestyle() in ("None", "none", "", " "):
        return True
    xy = line.get_xydata()
    if len(xy) != 2:
        return False
    (x0, y0), (x1, y1) = xy[0], xy[1]
    return x0 == x1 or y0 == y1


def _series_label(artist, fallback: str) -> str:
    label = artist.get_label()
    if label is None or str(label).startswith("_") or not str(label).strip():
        return fallback
    return str(label)


def _auto_number(artist, prefix: str, index: int) -> int:
    """matplotlib names unlabelled artists `_child<N>` / `_container<N>`; E2B numbers unnamed
    series with that N, so we do too (falling back to the position)."""
    label = str(artist.get_label() or "")
    if label.startswith(prefix) and label[len(prefix):].isdigit():
        return int(label[len(prefix):])
    return index


def _line_chart(ax, title, lines) -> dict:
    x, y = _Axis(ax.xaxis), _Axis(ax.yaxis)
    elements = []
    for i, line in enumerate(lines):
        points = [[x.value(px), y.value(py)] for px, py in line.get_xydata()]
        fallback = f"Line {_auto_number(line, '_child', i)}"
        elements.append({"label": _series_label(line, fallback), "points": points})
    return {"type": "line", "title": title, **_point_fields(ax, x, y), "elements": elements}


def _scatter_chart(ax, title, collections) -> dict:
    x, y = _Axis(ax.xaxis), _Axis(ax.yaxis)
    elements = []
    for i, coll in enumerate(collections):
        offsets = coll.get_offsets()
        points = [[x.value(px), y.value(py)] for px, py in offsets]
        elements.append({"label": _series_label(coll, f"Scatter {i + 1}"), "points": points})
    return {"type": "scatter", "title": title, **_point_fields(ax, x, y), "elements": elements}


def _bar_orientation(container: Optional[BarContainer], rects) -> str:
    orientation = getattr(container, "orientation", None) if container is not None else None
    if orientation in ("vertical", "horizontal"):
        return orientation
    # Without a container: bars of equal height but differing widths run horizontally.
    heights = {round(abs(r.get_height()), 9) for r in rects}
    widths = {round(abs(r.get_width()), 9) for r in rects}
    return "horizontal" if len(heights) == 1 and len(widths) > 1 else "vertical"


def _legend_labels_by_color(ax) -> dict:
    """facecolor -> legend text, for plots (seaborn hue) whose legend is built from proxy patches."""
    legend = ax.get_legend()
    if legend is None:
        return {}
    handles = getattr(legend, "legend_handles", None) or getattr(legend, "legendHandles", None) or []
    out = {}
    for handle, text in zip(handles, legend.get_texts()):
        get_fc = getattr(handle, "get_facecolor", None)
        if get_fc is None:
            continue
        try:
            key = tuple(round(float(c), 4) for c in get_fc())
        except (TypeError, ValueError):
            continue
        if text.get_text():
            out.setdefault(key, text.get_text())
    return out


def _bar_group_name(container, rects, index: int, legend_colors: dict) -> str:
    fallback = f"Group {index}"
    if container is not None:
        fallback = f"Group {_auto_number(container, '_container', index)}"
        name = _series_label(container, "")
        if name:
            return name
    if legend_colors and rects:
        key = tuple(round(float(c), 4) for c in rects[0].get_facecolor())
        if key in legend_colors:
            return legend_colors[key]
    return fallback


def _bar_chart(ax, title, groups: list) -> dict:
    """groups: [(container or None, [Rectangle, ...]), ...]"""
    orientation = _bar_orientation(groups[0][0], groups[0][1])
    horizontal = orientation == "horizontal"
    cat_axis = _Axis(ax.yaxis if horizontal else ax.xaxis)
    legend_colors = _legend_labels_by_color(ax)
    elements = []
    for g, (container, rects) in enumerate(groups):
        group = _bar_group_name(container, rects, g, legend_colors)
        for rect in rects:
            if horizontal:
                pos = rect.get_y() + rect.get_height() / 2
                value = rect.get_width()
            else:
                pos = rect.get_x() + rect.get_width() / 2
                value = rect.get_height()
            elements.append({"label": cat_axis.label_at(pos), "group": group, "value": _num(value)})
    return {"type": "bar", "title": title, **_chart2d_fields(ax, swap=horizontal), "elements": elements}


def _pie_chart(ax, title, wedges) -> dict:
    elements = []
    for w in wedges:
        label = w.get_label()
        elements.append(
            {
                "label": "" if label is None or str(label).startswith("_") else str(label),
                # degrees; rounded so 90% of a pie reads 324, not 323.99999999999994
                "angle": _num(round(w.theta2 - w.theta1, 9)),
                "radius": _num(w.r),
            }
        )
    return {"type": "pie", "title": title, "elements": elements}


def _artist_xy(artist):
    """Data-space vertices of a Line2D or PathPatch as a list of (x, y)."""
    if isinstance(artist, Line2D):
        return [(float(px), float(py)) for px, py in artist.get_xydata()]
    path = artist.get_path()
    # PathPatch paths are in data space unless the patch has its own patch transform.
    verts = artist.get_patch_transform().transform(path.vertices) if hasattr(artist, "get_patch_transform") else path.vertices
    return [(float(px), float(py)) for px, py in verts]


def _box_element(parts: dict, vertical: bool, cat_axis: _Axis) -> Optional[dict]:
    def values(artists):
        out = []
        for a in artists:
            for px, py in _artist_xy(a):
                v = py if vertical else px
                if math.isfinite(v):
                    out.append(v)
        return out

    def positions(artists):
        out = []
        for a in artists:
            for px, py in _artist_xy(a):
                p = px if vertical else py
                if math.isfinite(p):
                    out.append(p)
        return out

    box_vals = values(parts.get("boxes", []))
    med_vals = values(parts.get("medians", []))
    if not box_vals and not med_vals:
        return None
    whisk_vals = values(parts.get("whiskers", [])) + values(parts.get("caps", []))
    q1 = min(box_vals) if box_vals else min(med_vals)
    q3 = max(box_vals) if box_vals else max(med_vals)
    median = med_vals[0] if med_vals else (q1 + q3) / 2
    lo = min(whisk_vals + [q1])
    hi = max(whisk_vals + [q3])
    pos_vals = positions(parts.get("medians", [])) or positions(parts.get("boxes", []))
    pos = (min(pos_vals) + max(pos_vals)) / 2 if pos_vals else 0.0
    return {
        "label": cat_axis.label_at(pos),
        "min": float(lo),
        "first_quartile": float(q1),
        "median": float(median),
        "third_quartile": float(q3),
        "max": float(hi),
        "outliers": [float(v) for v in values(parts.get("fliers", []))],
    }


def _box_vertical(groups: list) -> bool:
    for parts in groups:
        for med in parts.get("medians", []):
            pts = _artist_xy(med)
            if len(pts) >= 2:
                xs = {round(p[0], 12) for p in pts}
                ys = {round(p[1], 12) for p in pts}
                if len(ys) == 1 and len(xs) > 1:
                    return True
                if len(xs) == 1 and len(ys) > 1:
                    return False
    return True


def _box_chart(ax, title, groups: list) -> dict:
    vertical = _box_vertical(groups)
    cat_axis = _Axis(ax.xaxis if vertical else ax.yaxis)
    elements = [e for e in (_box_element(p, vertical, cat_axis) for p in groups) if e is not None]
    return {"type": "box_and_whisker", "title": title, **_chart2d_fields(ax, swap=not vertical), "elements": elements}


def _tagged_box_groups(artists) -> list:
    groups: dict = {}
    for a in artists:
        tag = getattr(a, BXP_TAG, None)
        if tag is None:
            continue
        token, role, index = tag
        groups.setdefault((token, index), {}).setdefault(role, []).append(a)
    return [groups[k] for k in sorted(groups)]


def _geometric_box_groups(patches, lines) -> list:
    """Untagged boxes: one PathPatch per box; lines within the box's span belong to it."""
    spans = []
    for box in (p for p in patches if isinstance(p, PathPatch)):
        pts = _artist_xy(box)
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        spans.append((box, min(xs), max(xs), min(ys), max(ys)))
    # A median spans the box across the category axis: constant y with the box's x extent
    # means vertical boxes, constant x with its y extent means horizontal ones.
    vertical = True
    for line in lines:
        pts = _artist_xy(line)
        if len(pts) != 2:
            continue
        (ax0, ay0), (ax1, ay1) = pts
        for _, x0, x1, y0, y1 in spans:
            if ay0 == ay1 and math.isclose(abs(ax1 - ax0), x1 - x0, rel_tol=1e-6):
                vertical = True
                break
            if ax0 == ax1 and math.isclose(abs(ay1 - ay0), y1 - y0, rel_tol=1e-6):
                vertical = False
                break
        else:
            continue
        break
    groups = [{"boxes": [box]} for box, *_ in spans]
    for line in lines:
        pts = [p for p in _artist_xy(line) if math.isfinite(p[0]) and math.isfinite(p[1])]
        if not pts:
            continue
        pos = [p[0] if vertical else p[1] for p in pts]
        val = [p[1] if vertical else p[0] for p in pts]
        for group, (_, x0, x1, y0, y1) in zip(groups, spans):
            p0, p1 = (x0, x1) if vertical else (y0, y1)
            v0, v1 = (y0, y1) if vertical else (x0, x1)
            if not all(p0 - 1e-9 <= p <= p1 + 1e-9 for p in pos):
                continue
            if line.get_linestyle() in ("None", "none", "", " "):
                group.setdefault("fliers", []).append(line)
            elif len({round(v, 12) for v in val}) == 1 and v0 - 1e-9 <= val[0] <= v1 + 1e-9:
                group.setdefault("medians", []).append(line)
            else:
                group.setdefault("whiskers", []).append(line)
            break
    return groups


def _axes_chart(ax, title: Optional[str]) -> Optional[dict]:
    lines = [line for line in ax.lines if _is_data_line(ax, line)]
    collections = [c for c in ax.collections if c.get_visible()]
    patches = [p for p in ax.patches if p.get_visible()]
    others = [a for a in list(ax.images) + list(ax.tables) + list(ax.artists) if a.get_visible()]

    tagged = _tagged_box_groups(lines + patches)
    if tagged:
        return _box_chart(ax, title, tagged)

    if not (lines or collections or patches or others):
        return None

    if others:
        return {"type": "unknown", "title": title, "elements": []}

    if patches and all(isinstance(p, Wedge) for p in patches) and not lines and not collections:
        return _pie_chart(ax, title, patches)

    if patches and all(type(p) is Rectangle for p in patches):
        # error bars (matplotlib yerr or seaborn's CI lines) may accompany the bars; a real line
        # series drawn over bars makes a mixed chart, which E2B reports as unknown
        if all(isinstance(c, LineCollection) for c in collections) and all(
            _is_error_bar_line(line) for line in lines
        ):
            visible = {id(p) for p in patches}
            groups = []
            seen = set()
            for container in ax.containers:
                if isinstance(container, BarContainer):
                    rects = [r for r in container.patches if id(r) in visible]
                    if rects:
                        groups.append((container, rects))
                        seen.update(id(r) for r in rects)
            loose = [p for p in patches if id(p) not in seen]
            if loose and not groups:
                groups.append((None, loose))
            if groups:
                return _bar_chart(ax, title, groups)

    if lines and not patches:
        # a line may carry a confidence band (seaborn lineplot, fill_between)
        if all(isinstance(c, PolyCollection) for c in collections):
            return _line_chart(ax, title, lines)

    if collections and not lines and not patches and all(type(c) is PathCollection for c in collections):
        return _scatter_chart(ax, title, collections)

    if patches and lines and not collections and all(isinstance(p, PathPatch) for p in patches):
        groups = _geometric_box_groups(patches, lines)
        if groups:
            return _box_chart(ax, title, groups)

    return {"type": "unknown", "title": title, "elements": []}


def _chart_axes(fig: Figure) -> list:
    # Colorbars are axes of their own but annotate the main plot rather than being a chart.
    return [ax for ax in fig.axes if ax.get_visible() and getattr(ax, "_colorbar", None) is None]


def chart_from_figure(fig: Figure) -> Optional[dict]:
    """The E2B chart dict for a figure, or None when it has nothing to chart."""
    axes = _chart_axes(fig)
    if not axes:
        return None
    suptitle = _suptitle(fig)
    if len(axes) == 1:
        return _axes_chart(axes[0], _title(axes[0], suptitle))
    charts = [c for c in (_axes_chart(ax, _title(ax)) for ax in axes) if c is not None]
    if not charts:
        return None
    return {"type": "superchart", "title": suptitle, "elements": charts}


__all__ = ["chart_from_figure", "tag_bxp_artists"]
