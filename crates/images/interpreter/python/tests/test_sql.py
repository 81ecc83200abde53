"""The SQL context: `_bulkhead_sql_run(<literal>)` cells on a kernel started with both exec files."""

from __future__ import annotations

import pytest

from conftest import SQL, STARTUP


@pytest.fixture(scope="module")
def sql_kernel(tmp_path_factory):
    from conftest import Kernel

    k = Kernel(tmp_path_factory.mktemp("sql"), "bulkhead-sql", [STARTUP, SQL])
    yield k
    k.close()


def sql(kernel, text: str) -> dict:
    return kernel.run(f"_bulkhead_sql_run({text!r})")


def main_result(out: dict) -> dict:
    errors = [c for k, c in out["msgs"] if k == "error"]
    assert not errors, errors
    results = [c for k, c in out["msgs"] if k == "execute_result"]
    assert len(results) == 1, out["msgs"]
    assert not [c for k, c in out["msgs"] if k == "display_data"]
    return results[0]["data"]


def test_state_persists_across_cells(sql_kernel):
    out = sql(sql_kernel, "CREATE TABLE people(id INTEGER, name VARCHAR, score DOUBLE);")
    assert out["reply"]["status"] == "ok"
    assert [k for k, _ in out["msgs"] if k in ("execute_result", "display_data", "error")] == []

    out = sql(sql_kernel, "INSERT INTO people VALUES (1, 'ada', 9.5), (2, 'bob', NULL), (10, 'cy', 7.25)")
    assert [k for k, _ in out["msgs"] if k in ("execute_result", "display_data", "error")] == []

    data = main_result(sql(sql_kernel, "SELECT id, name, score FROM people ORDER BY id"))
    assert data["e2b/data"] == {"id": [1, 2, 10], "name": ["ada", "bob", "cy"], "score": [9.5, None, 7.25]}
    assert data["text/plain"] == "\n".join(
        [
            " id | name | score",
            "----+------+-------",
            "  1 | ada  |   9.5",
            "  2 | bob  |  NULL",
            " 10 | cy   |  7.25",
            "(3 rows)",
        ]
    )
    html = data["text/html"]
    assert "<th>id</th><th>name</th><th>score</th>" in html
    assert "<tr><td>2</td><td>bob</td><td>NULL</td></tr>" in html


def test_multiple_statements_show_the_last_result_set(sql_kernel):
    data = main_result(
        sql(
            sql_kernel,
            """
            CREATE TABLE t AS SELECT * FROM range(5) r(x);
            SELECT count(*) AS n FROM t;
            INSERT INTO t VALUES (99);
            """,
        )
    )
    # the INSERT's row count is status, not a result: the SELECT before it is shown
    assert data["e2b/data"] == {"n": [5]}
    data = main_result(sql(sql_kernel, "SELECT max(x) AS m FROM t; SELECT 'a<b' AS s, 1 AS s"))
    assert data["e2b/data"] == {"s": ["a<b"], "s_1": [1]}
    assert "<td>a&lt;b</td>" in data["text/html"]


def test_json_safe_values(sql_kernel):
    data = main_result(
        sql(
            sql_kernel,
            "SELECT DATE '2024-02-29' AS d, TIMESTAMP '2024-01-02 03:04:05' AS ts, 1.25::DECIMAL(6,2) AS dec, "
            "[1, 2] AS l, {'k': 'v'} AS st, 'nan'::DOUBLE AS nan_value, INTERVAL 1 DAY AS iv",
        )
    )
    assert data["e2b/data"] == {
        "d": ["2024-02-29"],
        "ts": ["2024-01-02T03:04:05"],
        "dec": [1.25],
        "l": [[1, 2]],
        "st": [{"k": "v"}],
        "nan_value": [None],
        "iv": ["1 day, 0:00:00"],
    }


def test_sql_error_is_a_short_duckdb_exception(sql_kernel):
    out = sql(sql_kernel, "SELECT * FROM missing_table")
    assert out["reply"]["status"] == "error"
    assert out["reply"]["ename"] == "CatalogException"
    (error,) = [c for k, c in out["msgs"] if k == "error"]
    assert error["ename"] == "CatalogException"
    assert "missing_table" in error["evalue"]
    tb = "\n".join(error["traceback"])
    assert "bulkhead_sql" not in tb and "Traceback" not in tb
    assert "CatalogException" in tb

    out = sql(sql_kernel, "SELEC 1")
    assert out["reply"]["ename"] == "ParserException"
    # and the connection still works afterwards
    assert main_result(sql(sql_kernel, "SELECT 42 AS answer"))["e2b/data"] == {"answer": [42]}


def test_row_limit_is_reported(fresh_kernel):
    k = fresh_kernel(exec_files=(STARTUP, SQL), env={"BULKHEAD_SQL_MAX_ROWS": "3"}, name="sqllimit")
    data = main_result(k.run("_bulkhead_sql_run('SELECT * FROM range(10) r(x)')"))
    assert data["e2b/data"] == {"x": [0, 1, 2]}
    assert "more rows not shown" in data["text/plain"]


def test_database_file_from_env(fresh_kernel, tmp_path):
    db = tmp_path / "data.duckdb"
    k = fresh_kernel(exec_files=(STARTUP, SQL), env={"BULKHEAD_SQL_DATABASE": str(db)}, name="sqlfile")
    out = k.run("_bulkhead_sql_run('CREATE TABLE kept(v INTEGER); INSERT INTO kept VALUES (7)')")
    assert out["reply"]["status"] == "ok"
    k.close()
    k2 = fresh_kernel(exec_files=(STARTUP, SQL), env={"BULKHEAD_SQL_DATABASE": str(db)}, name="sqlfile2")
    assert main_result(k2.run("_bulkhead_sql_run('SELECT v FROM kept')"))["e2b/data"] == {"v": [7]}


def test_timestamp_with_time_zone(sql_kernel):
    data = main_result(sql(sql_kernel, "SELECT TIMESTAMPTZ '2024-05-06 07:08:09+00' AS at"))
    assert data["e2b/data"] == {"at": ["2024-05-06T07:08:09+00:00"]}
