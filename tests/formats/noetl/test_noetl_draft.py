"""NoETL's interpreters of 2025 on their own vendored playbooks: the draft engine (``noetl/agent.py`` of 2025-06-27
as ``noetl agent`` runs it, kept by the broker of 2025-07: ``call:`` steps, loops whose body is their ``next``
steps, ``end_loop`` steps, routing by the first ``next`` candidate, its template rules) and the runtime before it
(``noetl/runtime/playbook.py`` of 2025-05: ``context:`` and ``run:`` steps); the services they call are a real
HTTP server on 127.0.0.1."""

from __future__ import annotations

from typing import Any

import trio

from kit.noetl import UPSTREAM, origin
from mcpipe.formats.noetl import NoetlPlaybook, load_playbook, playbook_tool
from mcpipe.kinds import HttpPolicy, StepPolicy

CITIES = [("51.51", "-0.13"), ("48.85", "2.35"), ("52.52", "13.41")]


def load(rel: str) -> NoetlPlaybook:
    # The playbooks' constant services (`alert-service.local`, ...) are allowed hosts; the tests' origin stands
    # in for the weather API (`base_url`).
    pol = StepPolicy(http=HttpPolicy(allowed_hosts=("127.0.0.1", "*.local")))
    pb, problems = load_playbook(rel, base_dir=str(UPSTREAM), policy=pol)
    assert problems == [], [str(p) for p in problems]
    assert isinstance(pb, NoetlPlaybook) and pb.layout in ("draft", "runtime")
    return pb


async def run(rel: str, args: dict[str, Any]) -> dict[str, Any]:
    with trio.fail_after(60):
        return await playbook_tool(load(rel)).run(args)


async def test_a_loop_runs_its_next_step_per_city_then_its_end_loop_step_then_the_steps_after() -> None:
    with origin() as weather:
        answer = await run("data/catalog/playbooks/weather_example.yaml", {"base_url": weather.url})
        asked = [(r["path"], r["query"]) for r in weather.requests]
    assert answer["ok"], answer["error"]
    run_ = answer["noetl"]
    # start -> city_loop (its body, `fetch_and_evaluate`, once per city) -> end_city_loop -> aggregate_alerts.
    assert list(run_["steps"]) == ["start", "city_loop", "end_city_loop", "aggregate_alerts"]
    assert asked == [
        ("/forecast", f"latitude={lat}&longitude={lon}&hourly=temperature_2m&forecast_days=1") for lat, lon in CITIES
    ]
    per_city = run_["steps"]["city_loop"]
    assert [r["fetch_and_evaluate"]["status_code"] for r in per_city] == [200, 200, 200]
    assert [r["fetch_and_evaluate"]["data"]["args"]["latitude"] for r in per_city] == [lat for lat, _ in CITIES]
    # `end_city_loop`'s `result: {alerts: "{{ alert }}"}` reads a name nothing wrote: the engine renders it None.
    assert run_["steps"]["end_city_loop"] == [{"alerts": None}]
    assert run_["steps"]["aggregate_alerts"] == [{}] and run_["failed_steps"] == []


async def test_the_engines_own_quirks_are_kept_a_failed_step_ends_the_run() -> None:
    # noetl/agent.py of 2025-06-27: its loop body's python task fails (or answers no alert); the loop goes on,
    # `end_city_loop` aggregates, `aggregate_alerts` finds no alert, `log_aggregate_result` is the first `next`
    # candidate (it always holds, so the conditional ones after it are never asked), and the run ends failed
    # at `store_aggregate_result` (its DuckDB file's directory is not there).
    with origin() as weather:
        answer = await run("catalog/playbooks/weather_example.yaml", {"base_url": weather.url})
    run_ = answer["noetl"]
    assert list(run_["steps"]) == [
        "start",
        "city_loop",
        "end_city_loop",
        "aggregate_alerts",
        "log_aggregate_result",
        "store_aggregate_result",
    ]
    assert len(run_["steps"]["city_loop"]) == 3
    assert run_["steps"]["aggregate_alerts"] == [{"global_alert": False, "summary": {"alert_cities": [], "count": 0}}]
    assert run_["steps"]["log_aggregate_result"][0]["logged"] is True
    assert not answer["ok"] and run_["failed_steps"] == ["store_aggregate_result"]


async def test_a_condition_renders_to_text_and_an_undefined_name_makes_it_not_hold() -> None:
    rel = "data/catalog/playbooks/weather_loop_chain_example.yaml"
    with origin() as weather:
        # No `state` in the workload: `{{ workload.state == 'ready' }}` cannot render (None), the `then` is not
        # taken, and the `- else:` entry names no step (the engine's `get_next_steps`): the run ends.
        stopped = await run(rel, {"base_url": weather.url})
        # Any `state`: the condition renders to the text "True" or "False", and both hold.
        going = await run(rel, {"base_url": weather.url, "state": "not ready at all"})
    assert stopped["ok"] and list(stopped["noetl"]["steps"]) == ["start"]
    assert "city_loop" in going["noetl"]["steps"]
    # Its body calls a `type: task` workbook task, which the engine cannot run: each item's result is None, and
    # after the loop (no `end_loop` step) the run goes on at its first `next` step, which fails the run.
    assert going["noetl"]["steps"]["city_loop"] == [{"fetch_and_evaluate": None}] * 3
    assert going["noetl"]["failed_steps"] == ["fetch_and_evaluate"]
    assert "Unsupported task type: task" in going["error"]


async def test_the_brokers_steps_name_their_task_with_type_and_name() -> None:
    # playbook/weather_loop_example.yaml (2025-07-24): `type: workbook` + `name` on the step, read by the broker.
    with origin() as weather:
        answer = await run("playbook/weather_loop_example.yaml", {"base_url": weather.url})
    steps = answer["noetl"]["steps"]
    assert list(steps)[:4] == ["start", "city_loop", "end_city_loop", "aggregate_alerts"]
    assert steps["aggregate_alerts"] == [{"global_alert": False, "summary": {"alert_cities": [], "count": 0}}]


def test_what_the_engine_never_reads_or_cannot_run_is_a_check_warning() -> None:
    pb = load("data/catalog/playbooks/weather_return_example.yaml")
    text = "\n".join(pb.warnings)
    assert "workbook[0].type: Nested loop task execution not supported" in text
    assert "workflow[2].call: `call` beside `loop`" in text
    assert "workflow[3].call: a list, which NoETL's 2025 draft engine cannot read" in text
    questionable = load("data/catalog/playbooks/weather_loop_chain_commented_questionable.yaml")
    assert any("workflow[1].loop: `loop` beside `end_loop`" in w for w in questionable.warnings)


# --- NoETL's runtime of May 2025 (noetl/runtime/playbook.py): `context:` and `run:` steps ---


async def test_a_run_step_runs_its_tasks_and_routes_on_their_results_by_name() -> None:
    rel = "data/catalog/playbooks/csv_import_export.yaml"
    with origin() as pg_router:
        answer = await run(rel, {"baseUrl": pg_router.url})
        asked = [(r["method"], r["path"]) for r in pg_router.requests]
    assert answer["ok"], answer["error"]
    steps = answer["noetl"]["steps"]
    # `{{ results.import_csv.status == 'success' }}` renders "True", which the runtime's `eval` reads as True.
    assert list(steps) == ["start", "import_data", "export_data", "complete"]
    assert asked == [("POST", "/pg/csv/import"), ("POST", "/pg/csv/export")]
    assert steps["import_data"][0]["import_csv"]["status"] == "success"
    # Its python task's `return` is rewritten to `result =`, as the runtime rewrites it, and its status set.
    done = steps["complete"][0]["update_status"]
    assert done["status"] == "success" and done["job_id"] == "{{ job.uuid }}" and "completed_at" in done


async def test_a_task_that_fails_answers_an_error_and_its_step_routes_to_the_error_handler() -> None:
    # The pg router is not there: the import answers an error result, `results.import_csv.status` is not
    # `success`, and the `- else:` entry goes to `error_handler`, whose task runs; the run completes.
    answer = await run("data/catalog/playbooks/csv_import_export.yaml", {"baseUrl": "http://127.0.0.1:9"})
    steps = answer["noetl"]["steps"]
    assert answer["ok"] and list(steps) == ["start", "import_data", "error_handler"]
    assert steps["import_data"][0]["import_csv"]["status"] == "error"
    assert steps["error_handler"][0]["log_error"]["status"] == "success"


# --- NoETL's workflow engine of April 2023 (workflow_engine/): jobs of shell and rest_api tasks ---

WORKFLOW_2023 = "workflow_engine/example_workflow.yaml"


def test_the_2023_workflow_is_read_as_its_engine_read_it() -> None:
    pb, problems = load_playbook(WORKFLOW_2023, base_dir=str(UPSTREAM), policy=_shell_policy("api.github.com"))
    assert problems == [] and isinstance(pb, NoetlPlaybook) and pb.layout == "2023"
    assert list(pb.steps) == ["job1.task1", "job1.task2", "job2.task1"]
    text = "\n".join(pb.warnings)
    assert "workflow.jobs[0].conditions: a job's `conditions` is not read" in text  # its Job.execute never asks
    assert "workflow.jobs[0].tasks[1].loop: a task's `loop` is not read" in text


async def test_the_2023_workflows_tasks_run_in_order_and_a_condition_reads_an_earlier_tasks_status(tmp_path) -> None:
    # The vendored file calls GitHub's API; the same file with its URL on the tests' origin runs here.
    source = (UPSTREAM / WORKFLOW_2023).read_text()
    with origin() as api:
        (tmp_path / "wf.yaml").write_text(source.replace("https://api.github.com/octocat", f"{api.url}/octocat"))
        pb, problems = load_playbook("wf.yaml", base_dir=str(tmp_path), policy=_shell_policy("127.0.0.1"))
        assert problems == [], problems
        with trio.fail_after(60):
            answer = await playbook_tool(pb).run({})
        asked = [r["path"] for r in api.requests]
    assert answer["ok"], answer["error"]
    steps = answer["noetl"]["steps"]
    assert steps["job1.task1"] == [{"status": "success", "output": "Hello, World"}]
    # `'{{example_workflow.jobs.job1.tasks.task1.status}}' == 'success'` held: task2 made its request.
    assert steps["job1.task2"][0]["status"] == "success" and asked == ["/octocat"]
    assert steps["job2.task1"] == [{"status": "success", "output": "Job2 Task1"}]


async def test_a_false_condition_skips_its_task_and_the_next_job_still_runs(tmp_path) -> None:
    source = (UPSTREAM / WORKFLOW_2023).read_text().replace("echo 'Hello, World'", "exit 3")
    (tmp_path / "wf.yaml").write_text(source)
    pb, problems = load_playbook("wf.yaml", base_dir=str(tmp_path), policy=_shell_policy("api.github.com"))
    assert problems == [], problems
    with trio.fail_after(60):
        answer = await playbook_tool(pb).run({})
    steps = answer["noetl"]["steps"]
    assert steps["job1.task1"] == [{"status": "failure", "output": ""}]
    assert steps["job1.task2"] == [{"status": "skipped"}]  # `'failure' == 'success'` is false: no request
    assert steps["job2.task1"] == [{"status": "success", "output": "Job2 Task1"}]


def _shell_policy(host: str) -> StepPolicy:
    from mcpipe.kinds import CommandPolicy

    return StepPolicy(http=HttpPolicy(allowed_hosts=(host,)), command=CommandPolicy(commands={"sh": "/bin/sh"}))
