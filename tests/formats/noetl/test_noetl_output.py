"""NoETL's result storage (a step's ``output`` block: ``output_select``, ``inline_max_bytes``, ``store``) on its
own vendored playbooks: what later steps see of a result, and a large one kept in the run behind a ``_ref`` that
an ``artifact`` ``get`` reads back; cloud stores are refused."""

from __future__ import annotations

import trio

from kit.noetl import UPSTREAM, load, policy, run_file
from mcpipe.formats.noetl import load_playbook
from mcpipe.formats.noetl._layout import OutputSpec
from mcpipe.formats.noetl._steps import stored_view


async def test_a_small_result_is_its_selected_fields_and_inline_as_noetl_keeps_it_below_its_threshold():
    with trio.fail_after(60):
        answer = await run_file("tests/fixtures/playbooks/test_large_result_extraction.yaml")
    assert answer["ok"], answer["error"]
    (start,) = answer["noetl"]["steps"]["start"]
    assert {k: start[k] for k in ("status", "count", "metadata")} == {
        "status": "ok",
        "count": 500,
        "metadata": {"generated_by": "test"},
    }
    assert len(start["_inline"]["items"]) == 500 and "_ref" not in start  # 100 KB: under NoETL's 10 MiB
    (check,) = answer["noetl"]["steps"]["check_extraction"]
    assert check["extraction_success"] is True and check["externalized"] is False


def test_a_result_over_the_threshold_is_kept_behind_a_ref_with_its_selected_fields():
    spec = OutputSpec("workflow[0].output", select=("status", "items[1].id", "note"), inline_max_bytes=10)
    view, full = stored_view(
        spec, {"status": "ok", "items": [{"id": 1}, {"id": 2}], "note": "x" * 600}, "fetch", "7", "fetch"
    )
    assert full is not None and full["status"] == "ok"
    assert view["status"] == "ok" and view["id"] == 2 and view["note"] == "x" * 500 + "..."
    assert view["_ref"]["ref"] == "noetl://execution/7/result/fetch/fetch" and view["_ref"]["kind"] == "result_ref"


async def test_an_artifact_get_reads_back_what_a_step_kept_behind_its_ref():
    pb = load("tests/fixtures/playbooks/test_output_select.yaml")
    for sp in pb.steps.values():  # the run is NoETL's store: externalize everything, as `inline_max_bytes: 0` does
        if sp.output is not None:
            sp.output.inline_max_bytes = 0
    from mcpipe.formats.noetl import playbook_tool

    with trio.fail_after(60):
        answer = await playbook_tool(pb).run({})
    steps = answer["noetl"]["steps"]
    (start,) = steps["start"]
    assert "_ref" in start and "items" not in start
    (loaded,) = steps["lazy_load_full_data"]
    assert loaded["source"] == "result_store" and len(loaded["data"]["items"]) == 1000  # the whole result


def test_a_result_stored_in_cloud_storage_is_refused_at_check_time():
    _, problems = load_playbook(
        "tests/fixtures/playbooks/test_gcs_storage.yaml", base_dir=str(UPSTREAM), policy=policy()
    )
    assert any("workflow[0].output.store.kind: a result stored in `gcs`" in str(p) for p in problems)
