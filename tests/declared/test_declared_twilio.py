"""The ``twilio`` step kind against a small real server on 127.0.0.1 speaking Twilio's REST API shapes
(``/2010-04-01/Accounts/{AC}/Messages.json`` and friends, HTTP Basic auth, form bodies, Twilio's error
objects), and TwiML rendered byte for byte as mcpg's plugin renders it (its own golden strings)."""

from __future__ import annotations

import base64
import json
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

import pytest

from kit.declared import compiled, env, run_result
from kit.llm import _answer, _body, lifespan, serving
from mcpipe.access import Credentials, EnvCredential
from mcpipe.declared import StepPolicy
from mcpipe.kinds._policy import HttpPolicy
from mcpipe.kinds.twilio import render_twiml
from mcpipe.tools import ToolContext

AC = "AC" + "1" * 32
SK = "SK" + "2" * 32
SM = "SM" + "a" * 32


@dataclass
class FakeTwilio:
    """Twilio's REST API as far as the tests go: it checks Basic auth and records every request."""

    url: str = ""
    seen: list[dict[str, Any]] = field(default_factory=list)
    script: deque[tuple[int, Any, dict[str, str]]] = field(default_factory=deque)
    """Answers to give first (status, body, headers), before the regular ones."""

    def app(self) -> Any:
        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "lifespan":
                await lifespan(receive, send)
                return
            headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
            body = (await _body(receive)).decode()
            req = {
                "method": scope["method"],
                "path": scope["path"],
                "raw_path": scope["raw_path"].decode(),
                "query": dict(parse_qsl(scope["query_string"].decode())),
                "form": parse_qsl(body, keep_blank_values=True),
                "auth": base64.b64decode(headers.get("authorization", "Basic ").split()[1] or b"").decode(),
            }
            self.seen.append(req)
            if req["auth"] != f"{SK}:key-secret":
                await _answer(
                    send,
                    401,
                    {
                        "code": 20003,
                        "message": "Authenticate",
                        "more_info": "https://www.twilio.com/docs/errors/20003",
                        "status": 401,
                    },
                )
                return
            if self.script:
                status, doc, extra = self.script.popleft()
                data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
                start = [(b"content-type", b"application/json"), *[(k.encode(), v.encode()) for k, v in extra.items()]]
                await send({"type": "http.response.start", "status": status, "headers": start})
                await send({"type": "http.response.body", "body": data})
                return
            await self.regular(req, send)

        return app

    async def regular(self, req: dict[str, Any], send: Any) -> None:
        base = f"/2010-04-01/Accounts/{AC}/"
        path = req["path"]
        form = dict(req["form"])
        if path == base + "Messages.json" and req["method"] == "POST":
            await _answer(
                send,
                201,
                {"sid": SM, "status": "queued", "to": form["To"], "body": form["Body"], "from": form.get("From")},
            )
        elif path == base + "Messages.json":
            page = {
                "messages": [{"sid": SM, "direction": "inbound"}],
                "next_page_uri": f"{base}Messages.json?Page=1&PageToken=PA",
            }
            await _answer(send, 200, page)
        elif path == base + f"Messages/{SM}.json" and req["method"] == "DELETE":
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})
        elif path.startswith("/v2/PhoneNumbers/"):
            await _answer(send, 200, {"phone_number": path.rsplit("/", 1)[1], "valid": True})
        else:
            await _answer(send, 404, {"code": 20404, "message": "The requested resource was not found", "status": 404})


@asynccontextmanager
async def fake_twilio() -> AsyncIterator[FakeTwilio]:
    api = FakeTwilio()
    async with serving(api.app()) as base:
        api.url = base
        yield api


def _policy(creds: Credentials | None = None) -> StepPolicy:
    return StepPolicy(http=HttpPolicy(allowed_hosts=("127.0.0.1",)), credentials=creds or Credentials())


def _step(api: str, operation: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": "tw",
        "kind": "twilio",
        "operation": operation,
        "account_sid": AC,
        "api_key_sid": SK,
        "api_key_secret": "key-secret",
        "from": "+14155550100",
        "api_base": api,
        "lookups_base": api,
        **extra,
    }


async def _run(raw: dict[str, Any], args: dict[str, Any], policy: StepPolicy | None = None) -> dict[str, Any]:
    step = compiled(raw, policy or _policy())
    return await run_result(step, env(args), ToolContext())


async def test_send_sms_posts_the_form_with_basic_auth_and_answers_twilios_message():
    async with fake_twilio() as api:
        r = await _run(
            _step(api.url, "send_sms"),
            {"to": "+15551230000", "body": "hi & bye", "media_url": ["https://cdn.example/a.png"]},
        )
    assert r["ok"] and r["output"] == {
        "sid": SM,
        "status": "queued",
        "to": "+15551230000",
        "body": "hi & bye",
        "from": "+14155550100",
    }
    (req,) = api.seen
    assert req["path"] == f"/2010-04-01/Accounts/{AC}/Messages.json" and req["auth"] == f"{SK}:key-secret"
    assert req["form"] == [
        ("To", "+15551230000"),
        ("Body", "hi & bye"),
        ("From", "+14155550100"),
        ("MediaUrl", "https://cdn.example/a.png"),
    ]


async def test_the_api_key_secret_can_come_from_a_credential(monkeypatch):
    monkeypatch.setenv("TW_TEST_SECRET", "key-secret")
    async with fake_twilio() as api:
        creds = Credentials({"tw": EnvCredential(env="TW_TEST_SECRET")})
        raw = _step(api.url, "list_messages")
        del raw["api_key_secret"]
        raw["api_key_secret_credential"] = "tw"
        r = await _run(raw, {"to": "+1555"}, _policy(creds))
    assert r["ok"] and r["output"]["messages"] == [{"sid": SM, "direction": "inbound"}]
    assert r["output"]["next_page_uri"].endswith("PageToken=PA")
    assert api.seen[0]["query"] == {"To": "+1555", "PageSize": "50"}


async def test_twilios_own_errors_fail_the_step_as_a_tool_error_with_its_code():
    async with fake_twilio() as api:
        api.script.append(
            (
                400,
                {
                    "code": 21211,
                    "message": "The 'To' number is not a valid phone number.",
                    "more_info": "https://www.twilio.com/docs/errors/21211",
                    "status": 400,
                },
                {},
            )
        )
        r = await _run(_step(api.url, "send_sms"), {"to": "x", "body": "b"})
    assert not r["ok"] and r["error_code"] == "TOOL_ERROR"
    assert (
        r["error"]
        == "Twilio error 21211: The 'To' number is not a valid phone number. (https://www.twilio.com/docs/errors/21211)"
    )


async def test_a_429_or_5xx_is_retried_twice_honouring_retry_after():
    async with fake_twilio() as api:
        api.script.extend(
            [
                (429, {"code": 20429, "message": "Too Many Requests"}, {"retry-after": "0"}),
                (503, b"", {"retry-after": "0"}),
            ]
        )
        ok = await _run(_step(api.url, "send_sms"), {"to": "+1", "body": "b"})
        api.script.extend([(500, b"oops", {"retry-after": "0"})] * 3)
        failed = await _run(_step(api.url, "send_sms"), {"to": "+1", "body": "b"})
    assert ok["ok"] and len(api.seen) == 3 + 3
    assert not failed["ok"] and failed["error"] == "Twilio returned HTTP 500"


async def test_a_bad_sid_and_missing_arguments_fail_before_any_request():
    async with fake_twilio() as api:
        bad_sid = await _run(_step(api.url, "get_message"), {"sid": "SM123"})
        no_body = await _run(_step(api.url, "send_sms"), {"to": "+1"})
        http_media = await _run(_step(api.url, "send_sms"), {"to": "+1", "body": "b", "media_url": ["http://x"]})
    assert "is not a Twilio SID" in bad_sid["error"] and no_body["error"] == "missing required argument `body`"
    assert http_media["error"] == "media_url must be an https:// URL" and api.seen == []


async def test_delete_answers_deleted_and_lookup_encodes_the_number_into_its_path():
    async with fake_twilio() as api:
        deleted = await _run(_step(api.url, "delete_message"), {"sid": SM})
        looked = await _run(
            _step(api.url, "lookup"), {"phone": "+1 555/0", "fields": ["line_type_intelligence", "caller_name"]}
        )
    assert deleted["output"] == {"deleted": True}
    assert api.seen[1]["raw_path"] == "/v2/PhoneNumbers/%2B1%20555%2F0"  # one path segment, whatever it holds
    assert looked["ok"] and api.seen[1]["query"] == {"Fields": "line_type_intelligence,caller_name"}


async def test_make_call_renders_its_verbs_into_the_twiml_it_posts():
    async with fake_twilio() as api:
        api.script.append((201, {"sid": "CA" + "b" * 32, "status": "queued"}, {}))
        r = await _run(
            _step(api.url, "make_call"),
            {"to": "+1", "twiml_verbs": [{"verb": "say", "text": "hi"}, {"verb": "hangup"}]},
        )
    assert (
        r["ok"]
        and dict(api.seen[0]["form"])["Twiml"]
        == '<?xml version="1.0" encoding="UTF-8"?><Response><Say>hi</Say><Hangup/></Response>'
    )


@pytest.mark.parametrize(
    ("verbs", "twiml"),
    [
        (
            [
                {"verb": "say", "text": "Welcome", "voice": "alice"},
                {
                    "verb": "gather",
                    "input": "dtmf",
                    "action": "/hooks/gather/CA123",
                    "num_digits": 1,
                    "timeout": 5,
                    "nested": [{"verb": "say", "text": "Press one"}],
                },
            ],
            '<?xml version="1.0" encoding="UTF-8"?><Response><Say voice="alice">Welcome</Say>'
            '<Gather input="dtmf" action="/hooks/gather/CA123" numDigits="1" timeout="5">'
            "<Say>Press one</Say></Gather></Response>",
        ),
        (
            [{"verb": "dial", "number": "+15551234567", "caller_id": "+15557654321"}],
            '<?xml version="1.0" encoding="UTF-8"?><Response>'
            '<Dial callerId="+15557654321">+15551234567</Dial></Response>',
        ),
        ([{"verb": "reject"}], '<?xml version="1.0" encoding="UTF-8"?><Response><Reject/></Response>'),
        (
            [{"verb": "message", "body": "Thanks, we got your message"}],
            '<?xml version="1.0" encoding="UTF-8"?><Response>'
            "<Message><Body>Thanks, we got your message</Body></Message></Response>",
        ),
        (
            [{"verb": "say", "text": 'a < b & c > "d"'}],
            '<?xml version="1.0" encoding="UTF-8"?><Response><Say>a &lt; b &amp; c &gt; &quot;d&quot;</Say></Response>',
        ),
    ],
)
async def test_build_twiml_renders_mcpgs_golden_strings_without_a_request(verbs, twiml):
    r = await _run(_step("https://api.twilio.com", "build_twiml"), {"twiml_verbs": verbs})
    assert r["ok"] and r["output"] == {"twiml": twiml} and render_twiml(verbs) == twiml


async def test_a_verb_written_another_way_is_refused_as_mcpg_refuses_it():
    r = await _run(_step("https://api.twilio.com", "build_twiml"), {"twiml_verbs": [{"say": {"text": "hi"}}]})
    assert not r["ok"] and "missing field `verb`" in r["error"]


@pytest.mark.parametrize(
    ("change", "where", "says"),
    [
        ({"from": None}, "steps[0]", "send_sms requires a `from` number"),
        ({"api_key_sid": None, "api_key_secret": None}, "steps[0]", "REST operations require"),
        ({"from": "cred://x/y"}, "steps[0].from", "bare cred:// URI"),
        ({"account_sid": " "}, "steps[0].account_sid", "account_sid is required"),
        ({"api_key_secret_credential": "nope"}, "steps[0].api_key_secret", "not both"),
        ({"operation": "teleport"}, "steps[0].operation", "Invalid enum value"),
        ({"operation": "stage_call_response"}, "steps[0].operation", "inbound-voice webhook, which mcpipe does not"),
    ],
)
def test_a_binding_mcpg_would_refuse_is_refused_located(change, where, says):
    from mcpipe.declared import StepScope, compile_step

    raw = {k: v for k, v in {**_step("https://api.twilio.com", "send_sms"), **change}.items() if v is not None}
    _, problems = compile_step(raw, "steps[0]", StepScope(policy=_policy()))
    assert any(p.location == where and says in p.message for p in problems), problems
