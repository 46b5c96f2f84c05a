"""NoETL's ``script`` sources on its own vendored playbooks: code or SQL read from a file under the playbook's
directory (or a parent up to the catalog's root, as NoETL reads it from its repository's root) when the step
runs; a path outside it, and remote sources, are refused."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
import trio

from kit.noetl import UPSTREAM, load, policy, run_file
from mcpipe.declared import load_sql
from mcpipe.formats.noetl import NoetlPlaybook, load_playbook, playbook_tool

PYTHON = "tests/fixtures/playbooks/script_execution/python_file_example.yaml"
SQL = "tests/fixtures/playbooks/script_execution/postgres_file_example.yaml"


async def test_python_code_read_from_a_file_runs_with_its_input():
    with trio.fail_after(60):
        answer = await run_file(PYTHON)
    assert answer["ok"], answer["error"]
    (ran,) = answer["noetl"]["steps"]["run_python_from_file"]
    assert ran["total_greetings"] == 3 and ran["script_source"] == "file"
    assert answer["noetl"]["steps"]["verify_result"][0]["status"] == "verified"


@pytest.mark.parametrize("path", ["/etc/passwd", "../../../../etc/passwd", "nothing/here.py"])
async def test_a_script_path_outside_the_playbooks_tree_or_missing_fails_the_step_located(path):
    with trio.fail_after(60):
        answer = await run_file(PYTHON, {"script_path": path})
    assert not answer["ok"]
    assert "workflow[1].tool.script.uri" in answer["error"]
    assert "run_python_from_file" in answer["noetl"]["failed_steps"]


async def test_sql_read_from_a_file_runs_on_the_credentials_database(noetl_postgres):
    with psycopg.connect(noetl_postgres, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS noetl_script_sql")
        conn.execute("CREATE DATABASE noetl_script_sql")
    url = noetl_postgres.rsplit("/", 1)[0] + "/noetl_script_sql"
    backends, _ = load_sql({"pg_k8s": {"url": url}, "pg_local": {"url": url}})
    pb, problems = load_playbook(SQL, base_dir=str(UPSTREAM), policy=replace(policy(), sql=backends))
    assert problems == [] and isinstance(pb, NoetlPlaybook)
    try:
        with trio.fail_after(60):
            answer = await playbook_tool(pb).run({})
    finally:
        for b in backends.values():
            if b is not None:
                await b.aclose()
    assert answer["ok"], answer["error"]
    steps = answer["noetl"]["steps"]
    assert steps["run_postgres_from_file"][0]["statement_count"] == 4  # the file's statements
    assert len(steps["verify_records"][0]["rows"]) == 3  # what it inserted


def test_code_fetched_from_cloud_storage_or_a_template_is_refused_at_check_time(tmp_path):
    (tmp_path / "p.yaml").write_text(
        """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: p, path: p}
workload: {name: x}
workflow:
  - step: start
    tool: {kind: python, script: {uri: inline, source: {type: inline, code: "print('{{ name }}')"}}}
"""
    )
    for base, rel, why in (
        (UPSTREAM, "tests/fixtures/playbooks/script_execution/python_gcs_example.yaml", "fetched from `gcs`"),
        (tmp_path, "p.yaml", "code from a template is refused"),
    ):
        _, problems = load_playbook(rel, base_dir=str(base), policy=policy())
        assert any(why in str(p) for p in problems), problems
    assert Path(UPSTREAM, "tests/fixtures/playbooks/script_execution/scripts/hello_world.py").is_file()
    assert load(PYTHON).steps["run_python_from_file"].tasks[0].parts["script"]["field"] == "code"


@pytest.mark.parametrize(
    "rel", ["test_script_loading.yaml", "tests/fixtures/playbooks/root_scripts/test_script_loading.yaml"]
)
async def test_code_from_a_template_naming_the_workloads_own_text_runs_that_text(rel):
    # `code: "{{ workload.test_code }}"` (or `{{ test_code }}`): the code is the playbook's own workload value,
    # read when it loads. (Their `end` steps read a `result` NoETL's scope does not have: they fail, located.)
    with trio.fail_after(60):
        answer = await run_file(rel)
    assert answer["noetl"]["steps"]["start"] == [{"message": "Script loading works!", "status": "success"}]
    assert answer["noetl"]["failed_steps"] == ["end"]


async def test_a_call_that_sets_the_value_a_step_takes_its_code_from_is_refused():
    # NoETL lays the call's arguments over the workload: its code would be the caller's text.
    with trio.fail_after(60):
        answer = await run_file("test_script_loading.yaml", {"test_code": "import os; result = os.environ"})
    assert not answer["ok"] and answer["error_code"] == "FORBIDDEN"
    assert "workflow[0].tool.script.source.code: the argument `test_code` is this step's code" in answer["error"]
    with trio.fail_after(60):
        nested = await run_file("test_script_loading.yaml", {"ctx": {"test_code": "result = 1"}})
    assert nested["error_code"] == "FORBIDDEN"
