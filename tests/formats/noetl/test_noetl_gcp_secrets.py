"""NoETL 1.0's ``secrets`` tasks of ``provider: google`` on its own vendored playbooks: the application default
credentials (a service account's key) exchanged for a token, then Secret Manager's ``:access`` call, against a
real stand-in of Google's token endpoint and Secret Manager on 127.0.0.1 (``tests/kit/gcp.py``), the endpoint set
by gcloud's ``CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import trio

from kit.gcp import SecretManager, service_account
from kit.noetl import run_file

SECRETS_TEST = "examples/google_secret_manager/secrets_test.yaml"


@pytest.fixture
def google(tmp_path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SecretManager]:
    with SecretManager({("noetl-demo-19700101", "test-secret"): "s3cr3t-value"}) as stand_in:
        stand_in.public_key = service_account(tmp_path / "sa.json", f"{stand_in.url}/token")
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "sa.json"))
        monkeypatch.setenv("CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER", f"{stand_in.url}/")
        yield stand_in


async def run(rel: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    with trio.fail_after(60):
        return await run_file(rel, args)


async def test_a_secret_is_read_with_a_service_accounts_token_and_the_next_step_uses_it(google) -> None:
    answer = await run(SECRETS_TEST)
    assert answer["ok"], answer["error"]
    steps = answer["noetl"]["steps"]
    (got,) = steps["get_secret_step"]
    assert got["status"] == "success"
    assert got["data"] == {"secret_value": "s3cr3t-value", "version": "latest", "provider": "google"}
    # `{{ get_secret_step.secret_value }}` reads through the result's `data` (NoETL 1.x).
    assert steps["use_secret_step"][0]["secret_length"] == len("s3cr3t-value")
    assert google.requests == [
        ("POST", "/token"),
        ("GET", "/v1/projects/noetl-demo-19700101/secrets/test-secret/versions/latest:access"),
    ]


async def test_a_secret_google_does_not_hold_answers_noetls_fallback_value(google) -> None:
    google.secrets.clear()
    answer = await run(SECRETS_TEST)
    (got,) = answer["noetl"]["steps"]["get_secret_step"]
    assert got["data"] == {
        "secret_value": "fallback-value-for-test-secret",
        "version": "fallback",
        "provider": "google",
    }


async def test_without_credentials_the_step_fails_with_noetls_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    answer = await run(SECRETS_TEST)
    assert not answer["ok"]
    (got,) = answer["noetl"]["steps"]["get_secret_step"]
    assert got["status"] == "error" and "GOOGLE_APPLICATION_CREDENTIALS is not set" in got["error"]


async def test_a_token_the_service_accounts_key_did_not_sign_is_refused(google, tmp_path) -> None:
    service_account(tmp_path / "sa.json", f"{google.url}/token")  # a new key: the stand-in knows the old one
    answer = await run(SECRETS_TEST)
    (got,) = answer["noetl"]["steps"]["get_secret_step"]
    assert got["status"] == "error" and "the token endpoint answered 400" in got["error"]
    assert google.requests == [("POST", "/token")]
