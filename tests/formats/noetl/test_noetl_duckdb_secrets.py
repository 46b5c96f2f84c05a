"""NoETL's DuckDB ``auth`` (secrets from credentials, for ``ATTACH ... (TYPE postgres, SECRET pg_db)`` and
buckets) on its own vendored playbook, with the real ``duckdb`` package: each credential is resolved when the
step runs (a postgres one from the config's ``[sql.NAME]``, an HMAC one from ``NOETL_SECRET_<NAME>``) into a
``CREATE SECRET`` whose values are quoted literals, after the extension it needs is loaded. This server's DuckDB
has no ``postgres`` extension (nothing is downloaded), so the step fails there, located, and no credential
appears in the answer."""

from __future__ import annotations

from dataclasses import replace

import orjson
import pytest
import trio

from kit.noetl import UPSTREAM, policy
from mcpipe.declared import load_sql
from mcpipe.formats.noetl import NoetlPlaybook, load_playbook, playbook_tool
from mcpipe.kinds.duckdb import secret_statements
from mcpipe.results import StepFailure

GCS = "tests/fixtures/playbooks/duckdb_gcs/duckdb_gcs_workload_identity.yaml"


def test_a_secret_is_created_with_every_value_quoted_after_its_extension_is_loaded():
    got = secret_statements(
        [
            {"name": "pg_db", "type": "postgres", "params": {"host": "db", "port": 5432, "password": "it's"}},
            {"name": "gcs_secret", "type": "gcs", "params": {"key_id": "K", "secret": "S", "scope": "gs://b"}},
        ],
        install=False,
    )
    assert got == [
        "LOAD postgres",
        "LOAD httpfs",
        "CREATE OR REPLACE SECRET pg_db (TYPE postgres, HOST 'db', PORT 5432, PASSWORD 'it''s')",
        "CREATE OR REPLACE SECRET gcs_secret (TYPE gcs, KEY_ID 'K', SECRET 'S', SCOPE 'gs://b')",
    ]
    with pytest.raises(StepFailure, match=r"secrets\[0\]\.name"):
        secret_statements([{"name": "x; DROP", "type": "gcs"}], install=False)


async def test_a_duckdb_step_resolves_its_credentials_and_fails_located_where_the_extension_is_missing(monkeypatch):
    monkeypatch.setenv("NOETL_SECRET_GCS_HMAC_LOCAL", '{"key_id": "GOOG1E", "secret_key": "hm4c-s3cret"}')
    backends, _ = load_sql({"pg_local": {"url": "postgresql://noetl:pg-s3cret@127.0.0.1:1/demo"}})
    pb, problems = load_playbook(GCS, base_dir=str(UPSTREAM), policy=replace(policy(), sql=backends))
    assert problems == [] and isinstance(pb, NoetlPlaybook)
    with trio.fail_after(60):
        answer = await playbook_tool(pb).run({})
    assert not answer["ok"]
    (failed,) = answer["noetl"]["steps"]["test_data"]
    assert failed["status"] == "error" and "LOAD postgres" in failed["error"]
    assert "workflow[1]" in answer["error"]
    text = orjson.dumps(answer, default=str).decode()
    assert "pg-s3cret" not in text and "hm4c-s3cret" not in text
