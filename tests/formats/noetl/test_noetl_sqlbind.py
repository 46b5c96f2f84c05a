"""A NoETL step's SQL templates with their values kept out of the SQL (``formats/noetl/_sqlbind.py``): what
becomes a bound parameter, what is written as a checked name, what is refused; the rendered statements run on
a real DuckDB (the served attacks, on DuckDB and PostgreSQL: ``tests/hostile/test_hostile_noetl_front.py``)."""

from __future__ import annotations

from typing import Any

import duckdb
import pytest
import trio

from mcpipe.formats.noetl import load_playbook, playbook_tool
from mcpipe.formats.noetl._sqlbind import rendered_sql, sql_template
from mcpipe.formats.noetl._tmpl import compile_tmpl
from mcpipe.kinds._sqltext import split_duckdb
from mcpipe.results import StepFailure


async def render(text: str, scope: dict[str, Any], dialect: str = "postgres", workload: Any = None) -> Any:
    tpl, why = sql_template(text, dialect, workload)
    assert why is None, why
    problems: list[tuple[str, str]] = []
    compiled = compile_tmpl(tpl.source, "workflow[0].tool.command", problems, "text")
    assert problems == []
    return await rendered_sql(compiled, scope, tpl)


@pytest.mark.parametrize(
    ("text", "scope", "sql", "params"),
    [
        (
            "SELECT * FROM t WHERE name LIKE '%{{ q }}%'",
            {"q": "x' OR '1'='1"},
            "SELECT * FROM t WHERE name LIKE :noetl_p0",
            {"noetl_p0": "%x' OR '1'='1%"},
        ),
        (
            "SELECT * FROM t WHERE id = {{ id }} LIMIT {{ n }}",
            {"id": "1 OR true", "n": 5},
            "SELECT * FROM t WHERE id = :noetl_p0 LIMIT :noetl_p1",
            {"noetl_p0": "1 OR true", "noetl_p1": 5},
        ),
        (
            "INSERT INTO t VALUES ({{ item.id }}, $${{ item.title }}$$, '{{ doc | tojson }}'::jsonb, 'it''s {{ w }}')",
            {"item": {"id": 7, "title": "a $$ b"}, "doc": {"k": "v'"}, "w": "ok"},
            "INSERT INTO t VALUES (:noetl_p0, :noetl_p1, :noetl_p2::jsonb, :noetl_p3)",
            {"noetl_p0": 7, "noetl_p1": "a $$ b", "noetl_p2": '{"k":"v\'"}', "noetl_p3": "it's ok"},
        ),
        (
            "SELECT * FROM t WHERE n IN ({% for v in vs %}'{{ v }}'{% if not loop.last %}, {% endif %}{% endfor %})",
            {"vs": ["a", "b'c"]},
            "SELECT * FROM t WHERE n IN (:noetl_p0, :noetl_p1)",
            {"noetl_p0": "a", "noetl_p1": "b'c"},
        ),
        (
            "SELECT {{ t }}.id FROM public.{{ t }} ORDER BY {{ col }} {{ dir }}",
            {"t": "users", "col": "name", "dir": "DESC"},
            "SELECT users.id FROM public.users ORDER BY name DESC",
            {},
        ),
        (
            "CREATE TABLE t (d date DEFAULT '{{ day }}'); SELECT now() - interval '{{ n }} hours'",
            {"day": "2025-01-01", "n": 3},
            "CREATE TABLE t (d date DEFAULT '2025-01-01'); SELECT now() - interval '3 hours'",
            {},
        ),
    ],
    ids=["partial-literal", "bare-values", "values-kinds", "for-block", "names", "ddl-typed-literals"],
)
async def test_a_value_is_bound_where_a_value_stands_and_written_as_a_name_where_a_name_does(text, scope, sql, params):
    assert await render(text, scope) == (sql, params)


async def test_duckdb_placeholders_are_dollar_names_and_the_rendered_statements_run_bound():
    text = (
        "CREATE TABLE u AS SELECT * FROM (VALUES ('alice', 1), ('o''brien', 2)) v(name, id);\n"
        "SELECT name FROM u WHERE name = '{{ name }}' OR id = {{ id }}"
    )
    sql, params = await render(text, {"name": "' UNION SELECT 'leak', 0 --", "id": 2}, "duckdb")
    assert sql.endswith("WHERE name = $noetl_p0 OR id = $noetl_p1")
    conn = duckdb.connect()
    rows = None
    for stmt in split_duckdb(sql):
        named = {k: v for k, v in params.items() if f"${k}" in stmt}
        rows = conn.execute(stmt, named).fetchall() if named else conn.execute(stmt).fetchall()
    assert rows == [("o'brien",)]


@pytest.mark.parametrize(
    ("text", "scope", "said"),
    [
        ("SELECT * FROM {{ t }}", {"t": "users; DROP TABLE x"}, "must be a number or a name"),
        ("SELECT * FROM t ORDER BY {{ col }}", {"col": "(SELECT secret FROM s)"}, "must be a number or a name"),
        ("SELECT date '{{ d }}'", {"d": "2025-01-01' UNION SELECT '"}, 'may not hold "\'"'),
        ("ATTACH '{{ path }}' AS db", {"path": "x'; COPY t TO '/tmp/y"}, 'may not hold "\'"'),
        ("SELECT 1 -- {{ note }}", {"note": "a\nDROP TABLE t"}, "may not hold '\\n'"),
        ("SELECT 1 -- {{ note }}", {"note": "a; DROP TABLE t"}, "may not hold ';'"),
        ("{{ query }}", {"query": "DROP TABLE t"}, "must be a number or a name"),
    ],
)
async def test_a_value_that_would_be_sql_where_no_parameter_can_stand_is_refused(text, scope, said):
    with pytest.raises(StepFailure, match=r"stands in the SQL|written into a quoted literal") as e:
        await render(text, scope)
    assert said in str(e.value) and e.value.code == "FORBIDDEN"
    assert str(e.value).startswith("workflow[0].tool.command: ")


async def test_an_expression_naming_a_workload_entry_writes_that_entrys_own_text_as_it_is():
    workload = {"query": "SELECT 42 AS answer, 'success' AS status", "other": "t; DROP TABLE users"}
    for text in ("{{ query }}", "{{ workload.query }}"):
        scope = {"query": workload["query"], "workload": workload}
        assert await render(text, scope, "duckdb", workload) == (workload["query"], {})
    with pytest.raises(StepFailure, match="must be a number or a name"):
        await render("{{ query }}", {"query": "SELECT 43"}, "duckdb", workload)  # a caller's other text
    with pytest.raises(StepFailure, match="must be a number or a name"):  # another entry's text: not this one's
        await render("SELECT * FROM {{ table }}", {"table": workload["other"]}, "duckdb", workload)


def test_a_literal_whose_quotes_open_and_close_in_different_branches_of_a_block_is_refused_at_load():
    for text in (
        "{% if a %}'{% endif %}{{ v }}'",
        "SELECT '{% if a %}x{% else %}{{ v }}' {% endif %}",
        "{% if a %}--{% endif %} {{ v }}",
    ):
        _, why = sql_template(text, "postgres")
        assert why is not None and "different branches of a `{% %}` block" in why, text
    assert sql_template("SELECT '{% if a %}x{% else %}{{ v }}{% endif %}'", "postgres")[1] is None


async def test_the_bind_filters_refuse_to_run_outside_a_steps_sql():
    problems: list[tuple[str, str]] = []
    compiled = compile_tmpl("{{ x | noetl_sql_value }}", "workflow[0].tool.input.x", problems)
    with pytest.raises(Exception, match="mcpipe's own filter for a NoETL step's SQL"):
        await compiled.render_async({"x": 1})


SEED = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: seed_duck, path: x/seed_duck}
mcp:
  prompts: []
workbook:
  - name: lookup
    type: duckdb
    database: ":memory:"
    commands: |
      CREATE TABLE u AS SELECT * FROM (VALUES ('alice'), ('bob')) v(name);
      SELECT name FROM u WHERE name = '{{ input.name }}'
workflow:
  - {step: start, next: b}
  - {step: b, type: workbook, task: lookup}
"""


async def test_a_seed_004_workbook_actions_sql_values_are_bound_too(tmp_path):
    (tmp_path / "seed.yaml").write_text(SEED)
    pb, problems = load_playbook(str(tmp_path / "seed.yaml"))
    assert problems == [] and pb is not None
    for name, rows in (("bob", [["bob"]]), ("' OR 1=1 --", None)):
        with trio.fail_after(30):
            answer = await playbook_tool(pb).run({"name": name})
        assert answer["ok"], answer["error"]
        assert answer["result"].get("command_2_sample") == rows
