"""Bulkhead's startup code for Python kernels of the `code-interpreter-v1` template.

Loaded by ipykernel with `--IPKernelApp.exec_files=[.../bulkhead_startup.py]`, which runs this file
in the user namespace. At the bottom, that run imports this same file as the module
`bulkhead_startup`, calls `install()`, and removes every name it defined from the user namespace,
so user code neither sees our helpers nor can break them by rebinding a global.

`install()` adds what E2B's SDKs expect from a code interpreter (see
shared/reference/e2b-protocol.md §3.1), without importing anything heavy at startup:
- `e2b/data` for pandas DataFrames (column -> list, JSON-safe values);
- `e2b/chart` for matplotlib Figures (bulkhead_charts), next to the usual `image/png`;
- `application/json` for dict/list results when they are JSON-representable (numpy-aware);
- `PIL.Image.Image.save(path)` called from user code also displays the image, and
  `Image.show()` always displays it (Pillow would first try a desktop viewer such as `xdg-open`,
  which the template has, through R's dependencies, and which shows nothing in a sandbox);
- `Axes.bxp` tags its artists so box plots are reported exactly.
Formatters are registered by type *name*, and the PIL/matplotlib patches are applied by an import
hook when those modules are first imported.
"""


# Names the user namespace had before this file ran (see the exec_files note at the bottom).
_BULKHEAD_NAMES_BEFORE = set(globals())
# ruff: noqa: E402  (imports follow the snapshot above on purpose)

import datetime
import decimal
import functools
import importlib.abc
import math
import os
import sys
import uuid
import warnings
from typing import Any, Callable, Optional

# ---------------------------------------------------------------------------------------------
# JSON-safe values


def _is_missing(value: Any) -> bool:
    return type(value).__name__ in ("NaTType", "NAType")


def json_key(key: Any) -> str:
    if isinstance(key, str):
        return key
    safe = json_safe(key)
    if safe is None or isinstance(safe, (list, dict)):
        return str(key)  # e.g. MultiIndex columns: "('m', 'n')"
    return str(safe)


def json_safe(value: Any) -> Any:
    """`value` as plain JSON data: NaN/NaT/NA -> None, datetimes -> ISO strings, numpy -> Python.

    Never fails: values with no JSON form become their str().
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    if _is_missing(value):
        return None
    if isinstance(value, dict):
        return {json_key(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_safe(v) for v in value]
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return str(value)
    if isinstance(value, decimal.Decimal):
        return json_safe(float(value))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, uuid.UUID):
        return str(value)
    module = type(value).__module__ or ""
    if module == "numpy" or module.startswith("numpy."):
        return _numpy_safe(value)
    return str(value)


def _numpy_safe(value: Any) -> Any:
    import numpy as np

    if isinstance(value, np.datetime64):
        return None if np.isnat(value) else str(np.datetime_as_string(value))
    if isinstance(value, np.timedelta64):
        return None if np.isnat(value) else str(value)
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "Mm":
            return [_numpy_safe(v) for v in value]
        return json_safe(value.tolist())
    if isinstance(value, np.generic):
        return json_safe(value.item())
    return str(value)


class _NotJSON(Exception):
    pass


def _strict_json(value: Any, depth: int = 0) -> Any:
    """Like json_safe, but refuses (raises _NotJSON) values JSON has no natural form for.

    Used for `application/json` of plain dict/list results, so e.g. a list of arbitrary objects
    does not get a misleading JSON rendering.
    """
    if depth > 100:
        raise _NotJSON("too deep")
    if value is None or isinstance(value, (bool, str, int, float)):
        return json_safe(value)
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise _NotJSON("non-string key")
            out[k] = _strict_json(v, depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        return [_strict_json(v, depth + 1) for v in value]
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)) or _is_missing(value):
        return json_safe(value)
    module = type(value).__module__ or ""
    if module == "numpy" or module.startswith("numpy."):
        import numpy as np

        if isinstance(value, np.ndarray):
            if value.dtype.kind not in "biufcMm?":
                raise _NotJSON("object array")
            return json_safe(value)
        if isinstance(value, np.generic):
            return json_safe(value)
    raise _NotJSON(type(value).__name__)


# ---------------------------------------------------------------------------------------------
# formatters


def dataframe_data(df: Any) -> Optional[dict]:
    """`e2b/data` for a pandas DataFrame: {column: [values...]} (index not included)."""
    with warnings.catch_warnings():
        # duplicate column names make to_dict warn into the user's output
        warnings.simplefilter("ignore")
        columns = df.to_dict(orient="list")
    return {json_key(k): [json_safe(v) for v in values] for k, values in columns.items()}


def figure_chart(fig: Any) -> Optional[dict]:
    """`e2b/chart` for a matplotlib Figure; None when there is no chart or extraction fails."""
    try:
        import bulkhead_charts

        return bulkhead_charts.chart_from_figure(fig)
    except Exception:
        # A chart we cannot read must never break the display of the figure itself.
        if os.environ.get("BULKHEAD_DEBUG"):
            raise
        return None


def _is_figure(obj: Any) -> bool:
    return any(
        c.__name__ == "Figure" and c.__module__ == "matplotlib.figure" for c in type(obj).__mro__
    )


def _formatter_classes():
    from IPython.core.formatters import BaseFormatter, JSONFormatter
    from traitlets import ObjectName, Unicode

    class E2BDataFormatter(BaseFormatter):
        format_type = Unicode("e2b/data")
        print_method = ObjectName("_repr_e2b_data_")
        _return_type = (dict,)

    class E2BChartFormatter(BaseFormatter):
        """Figures are recognised by class name here rather than through for_type: IPython's
        select_figure_formats (run when matplotlib_inline loads) pops Figure from every
        formatter's registry."""

        format_type = Unicode("e2b/chart")
        print_method = ObjectName("_repr_e2b_chart_")
        _return_type = (dict,)

        def __call__(self, obj):
            if self.enabled and _is_figure(obj):
                return figure_chart(obj)
            return super().__call__(obj)

    class NumpyAwareJSONFormatter(JSONFormatter):
        """application/json also for plain dict/list results that are JSON-representable."""

        def __call__(self, obj):
            if (
                self.enabled
                and isinstance(obj, (dict, list))
                and not hasattr(type(obj), "_repr_json_")
                and self.lookup_or_none(obj) is None
            ):
                try:
                    return _strict_json(obj)
                except (_NotJSON, RecursionError, ValueError):
                    return None
            return super().__call__(obj)

        def lookup_or_none(self, obj):
            try:
                return self.lookup(obj)
            except KeyError:
                return None

    return E2BDataFormatter, E2BChartFormatter, NumpyAwareJSONFormatter


def _install_formatters(ip) -> None:
    display_formatter = ip.display_formatter
    formatters = display_formatter.formatters
    data_cls, chart_cls, json_cls = _formatter_classes()

    data = data_cls(parent=display_formatter)
    # pandas >= 3 reports DataFrame.__module__ as "pandas", older ones "pandas.core.frame".
    for module in ("pandas", "pandas.core.frame"):
        data.for_type_by_name(module, "DataFrame", dataframe_data)
    chart = chart_cls(parent=display_formatter)

    old_json = formatters.get("application/json")
    new_json = json_cls(parent=display_formatter)
    if old_json is not None:
        new_json.type_printers.update(old_json.type_printers)
        new_json.deferred_printers.update(old_json.deferred_printers)
        new_json.enabled = old_json.enabled

    formatters["e2b/data"] = data
    formatters["e2b/chart"] = chart
    formatters["application/json"] = new_json

    active = list(display_formatter.active_types)
    for mime in ("e2b/data", "e2b/chart", "application/json"):
        if mime not in active:
            active.append(mime)
    display_formatter.active_types = active


# ---------------------------------------------------------------------------------------------
# patches applied when a module is first imported


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader, patch: Callable[[Any], None]) -> None:
        self._loader = loader
        self._patch = patch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        try:
            self._patch(module)
        except Exception:
            if os.environ.get("BULKHEAD_DEBUG"):
                raise

    def __getattr__(self, name):
        return getattr(self._loader, name)


class PostImportPatcher(importlib.abc.MetaPathFinder):
    """Runs `patch(module)` right after `name` is imported (at once if it already is)."""

    def __init__(self, patches: dict) -> None:
        self._patches = dict(patches)
        self._busy: set = set()

    def find_spec(self, fullname, path, target=None):
        patch = self._patches.get(fullname)
        if patch is None or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._busy.discard(fullname)
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _PatchingLoader(spec.loader, patch)
        return spec

    def install(self) -> None:
        for name, patch in list(self._patches.items()):
            module = sys.modules.get(name)
            if module is not None:
                patch(module)
        if not any(isinstance(f, PostImportPatcher) for f in sys.meta_path):
            sys.meta_path.insert(0, self)


def _called_from_user_code(depth: int) -> bool:
    # Cell code (and functions defined in cells) run with the user namespace, whose __name__ is
    # "__main__"; libraries saving images internally (matplotlib's savefig) do not.
    try:
        frame = sys._getframe(depth + 1)
    except ValueError:
        return False
    return frame.f_globals.get("__name__") == "__main__"


def patch_pil_image(module) -> None:
    image_cls = getattr(module, "Image", None)
    original = getattr(image_cls, "save", None)
    if original is None or getattr(original, "_bulkhead_patched", False):
        return

    @functools.wraps(original)
    def save(self, fp, *args, **kwargs):
        result = original(self, fp, *args, **kwargs)
        if isinstance(fp, (str, os.PathLike)) and _called_from_user_code(1):
            try:
                from IPython.display import display

                display(self)
            except Exception:
                pass
        return result

    save._bulkhead_patched = True  # type: ignore[attr-defined]
    image_cls.save = save


def patch_pil_imageshow(module) -> None:
    viewer = getattr(module, "IPythonViewer", None)
    viewers = getattr(module, "_viewers", None)
    if viewer is None or not isinstance(viewers, list) or getattr(module, "_bulkhead_patched", False):
        return
    # Pillow registers desktop viewers (xdg-open, display, ...) found on PATH before IPython's;
    # the first that accepts the image wins. In a kernel the notebook display is the only one.
    viewers[:] = [v for v in viewers if not isinstance(v, viewer)]
    module.register(viewer, 0)
    module._bulkhead_patched = True


def patch_matplotlib_axes(module) -> None:
    axes_cls = getattr(module, "Axes", None)
    original = getattr(axes_cls, "bxp", None)
    if original is None or getattr(original, "_bulkhead_patched", False):
        return

    @functools.wraps(original)
    def bxp(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        try:
            import bulkhead_charts

            bulkhead_charts.tag_bxp_artists(result)
        except Exception:
            pass
        return result

    bxp._bulkhead_patched = True  # type: ignore[attr-defined]
    axes_cls.bxp = bxp


_PATCHER = PostImportPatcher(
    {
        "PIL.Image": patch_pil_image,
        "PIL.ImageShow": patch_pil_imageshow,
        "matplotlib.axes._axes": patch_matplotlib_axes,
    }
)


def _ensure_on_path(here: str) -> None:
    # bulkhead_charts / bulkhead_sql live next to this file; appended so they never shadow
    # anything the user installs. IPython's exec_files runner puts the file's directory at
    # sys.path[0] only while the file runs, so that entry does not count.
    if here not in sys.path[1:]:
        sys.path.append(here)


def install(ip=None) -> None:
    """Set up the current IPython shell (no-op outside IPython). Safe to call twice."""
    _ensure_on_path(os.path.dirname(os.path.abspath(__file__)))
    if ip is None:
        try:
            from IPython import get_ipython

            ip = get_ipython()
        except ImportError:
            ip = None
    _PATCHER.install()
    if ip is not None and not getattr(ip, "_bulkhead_installed", False):
        _install_formatters(ip)
        ip._bulkhead_installed = True


if __name__ == "__main__":

    def _bulkhead_boot(ns: dict, before: set) -> None:
        import importlib

        _ensure_on_path(os.path.dirname(os.path.abspath(ns.get("__file__") or __file__)))
        try:
            importlib.import_module("bulkhead_startup").install()
        finally:
            # leave the user namespace as we found it
            for name in [n for n in ns if n not in before]:
                del ns[name]

    _bulkhead_boot(globals(), _BULKHEAD_NAMES_BEFORE)
