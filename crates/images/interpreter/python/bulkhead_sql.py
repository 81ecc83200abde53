"""The SQL context of the `code-interpreter-v1` template: DuckDB inside an IPython kernel.

The agent sends each SQL execution as the cell `_bulkhead_sql_run(<python string literal>)`.
`_bulkhead_sql_run` runs the statements on ONE DuckDB connection per kernel (in memory, or the
database file named by $BULKHEAD_SQL_DATABASE), so tables persist across executions, and returns
the last result set as an object IPython shows as the execute_result (`text/plain` table,
`text/html` table, `e2b/data` columns). SQL errors are raised as DuckDB's own exception and
shown as just `CatalogException: ...` (ename/evalue intact), not a traceback through our code.

Loaded as an extra `exec_files` entry (after bulkhead_startup.py): run that way it binds only
`_bulkhead_sql_run` in the user namespace and removes everything else it defined.
"""


# Names the user namespace had before this file ran (see the exec_files note at the bottom).
_BULKHEAD_NAMES_BEFORE = set(globals())
# ruff: noqa: E402  (imports follow the snapshot above on purpose)

import html
import os
from typing import Any, Optional

# Rows shown per result; more are cut off (and say so) to keep messages a sane size.
DEFAULT_MAX_ROWS = 10_000
# Rows rendered into text/plain and text/html (e2b/data carries all fetched rows).
_PREVIEW_ROWS = 200

_connection = None


class SqlSetupError(RuntimeError):
    """The SQL engine could not be started (message says what to fix)."""


def _max_rows() -> int:
    raw = os.environ.get("BULKHEAD_SQL_MAX_ROWS", "")
    try:
        value = int(raw)
    except ValueError:
        return DEFAULT_MAX_ROWS
    return value if value > 0 else DEFAULT_MAX_ROWS


def connection():
    """The kernel's DuckDB connection, opened on first use."""
    global _connection
    if _connection is None:
        try:
            import duckdb
        except ImportError as e:
            raise SqlSetupError(
                "the SQL context needs the `duckdb` Python package; install it in the template "
                "(pip install duckdb)"
            ) from e
        path = os.environ.get("BULKHEAD_SQL_DATABASE") or ":memory:"
        _connection = duckdb.connect(path)
    return _connection


def _has_result_set(statement_type: str, columns: list) -> bool:
    # DuckDB answers DDL/DML with a one-column "Count" table and settings PRAGMAs with "Success";
    # those are status, not results.
    if statement_type in ("SELECT", "EXPLAIN", "CALL", "RELATION", "EXECUTE"):
        return True
    if statement_type == "PRAGMA":
        return columns != ["Success"]
    if statement_type in ("INSERT", "UPDATE", "DELETE", "MERGE_INTO"):
        return columns != ["Count"]  # ... RETURNING
    return False


def _unique_names(names: list) -> list:
    # e2b/data is keyed by column name; `SELECT 1 AS a, 2 AS a` must not lose a column.
    used: set = set()
    out = []
    for name in names:
        base = candidate = str(name)
        n = 0
        while candidate in used:
            n += 1
            candidate = f"{base}_{n}"
        used.add(candidate)
        out.append(candidate)
    return out


def _cell_text(value: Any) -> str:
    if value is None:
        return "NULL"
    return str(value)


class SqlResult:
    """One result set; IPython renders it through `_repr_mimebundle_`."""

    def __init__(self, columns: list, types: list, rows: list, truncated: bool) -> None:
        self.columns = columns
        self.types = types
        self.rows = rows
        self.truncated = truncated

    def data(self) -> dict:
        from bulkhead_startup import json_safe

        names = _unique_names(self.columns)
        return {name: [json_safe(row[i]) for row in self.rows] for i, name in enumerate(names)}

    def _footer(self) -> str:
        n = len(self.rows)
        more = " (more rows not shown; raise BULKHEAD_SQL_MAX_ROWS or add LIMIT)" if self.truncated else ""
        return f"({n} row{'s' if n != 1 else ''}{more})"

    def text(self) -> str:
        preview = self.rows[:_PREVIEW_ROWS]
        cells = [[_cell_text(v) for v in row] for row in preview]
        numeric = [
            all(isinstance(row[i], (int, float)) or row[i] is None for row in preview) and bool(preview)
            for i in range(len(self.columns))
        ]
        widths = [len(str(c)) for c in self.columns]
        for row in cells:
            for i, text in enumerate(row):
                widths[i] = max(widths[i], len(text))

        def fmt(values, align_numbers):
            parts = []
            for i, text in enumerate(values):
                parts.append(text.rjust(widths[i]) if align_numbers and numeric[i] else text.ljust(widths[i]))
            return " " + " | ".join(parts).rstrip()

        lines = [fmt([str(c) for c in self.columns], False), "-" + "-+-".join("-" * w for w in widths) + "-"]
        lines += [fmt(row, True) for row in cells]
        if len(self.rows) > len(preview):
            lines.append(f" ... {len(self.rows) - len(preview)} more rows")
        lines.append(self._footer())
        return "\n".join(lines)

    def html(self) -> str:
        preview = self.rows[:_PREVIEW_ROWS]
        head = "".join(f"<th>{html.escape(str(c))}</th>" for c in self.columns)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(_cell_text(v))}</td>" for v in row) + "</tr>" for row in preview
        )
        note = ""
        if len(self.rows) > len(preview):
            note = f"<p>{len(self.rows) - len(preview)} more rows not shown</p>"
        return (
            f'<table class="dataframe bulkhead-sql"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table>{note}<p>{html.escape(self._footer())}</p>"
        )

    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"text/plain": self.text(), "text/html": self.html(), "e2b/data": self.data()}

    def __repr__(self) -> str:
        return self.text()


def run(sql_text: str) -> Optional[SqlResult]:
    """Run `sql_text` (one or more `;`-separated statements); the last result set, if any."""
    conn = connection()
    limit = _max_rows()
    result: Optional[SqlResult] = None
    for statement in conn.extract_statements(sql_text):
        conn.execute(statement)
        description = conn.description
        if description is None:
            continue
        columns = [d[0] for d in description]
        kind = getattr(statement.type, "name", str(statement.type))
        if not _has_result_set(kind, columns):
            continue
        rows = conn.fetchmany(limit + 1)
        truncated = len(rows) > limit
        result = SqlResult(columns, [str(d[1]) for d in description], rows[:limit], truncated)
    return result


_error_display_installed = False


def _raised_by_helper(tb) -> bool:
    codes = {run.__code__, _bulkhead_sql_run.__code__}
    while tb is not None:
        if tb.tb_frame.f_code in codes:
            return True
        tb = tb.tb_next
    return False


def _install_error_display() -> None:
    """Show DuckDB errors from our helper as `CatalogException: ...` without a traceback.

    IPython always prints the innermost frame (ours), so frame hiding cannot do this; a custom
    exception handler can. It only takes over when no other handler is registered, and other
    DuckDB errors keep their full traceback.
    """
    global _error_display_installed
    if _error_display_installed:
        return
    _error_display_installed = True
    try:
        from IPython import get_ipython
    except ImportError:
        return
    ip = get_ipython()
    if ip is None or ip.custom_exceptions:
        return
    import duckdb

    def show(shell, etype, value, tb, tb_offset=None):
        if _raised_by_helper(tb):
            try:
                # what showtraceback(exception_only=True) does, minus its "use %tb" preamble
                shell._showtraceback(etype, value, shell.InteractiveTB.get_exception_only(etype, value))
            except AttributeError:
                shell.showtraceback((etype, value, tb), exception_only=True)
        else:
            shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
        return []

    ip.set_custom_exc((duckdb.Error,), show)


def _bulkhead_sql_run(sql_text: str):
    """Cell entry point used by the agent's SQL context."""
    __tracebackhide__ = True
    connection()
    _install_error_display()
    return run(sql_text)


if __name__ == "__main__":

    def _bulkhead_boot(ns: dict, before: set) -> None:
        import importlib
        import sys

        here = os.path.dirname(os.path.abspath(ns.get("__file__") or __file__))
        # exec_files puts our directory at sys.path[0] only while this file runs
        if here not in sys.path[1:]:
            sys.path.append(here)
        module = importlib.import_module("bulkhead_sql")
        for name in [n for n in ns if n not in before]:
            del ns[name]
        ns["_bulkhead_sql_run"] = module._bulkhead_sql_run
        # hidden from %who like the rest of the startup namespace
        try:
            from IPython import get_ipython

            ip = get_ipython()
            if ip is not None:
                ip.user_ns_hidden["_bulkhead_sql_run"] = module._bulkhead_sql_run
        except ImportError:
            pass

    _bulkhead_boot(globals(), _BULKHEAD_NAMES_BEFORE)
