"""http and graphql steps against a real HTTP server on 127.0.0.1, and the outbound host policy."""

from __future__ import annotations

import socket
import time

import httpcore2
import httpx2
import pytest
import trio

from kit.declared import compiled, env
from mcpipe.declared import HttpPolicy, StepPolicy, StepScope, compile_step
from mcpipe.kinds._guarded import _GuardedTransport
from mcpipe.tools._base import ToolContext

CTX = ToolContext()
LOCAL = StepPolicy(http=HttpPolicy(allowed_hosts=["127.0.0.1"]))


async def run(raw, policy=LOCAL, args=None):
    with trio.fail_after(10):
        return await compiled(raw, policy).execute(env(args), CTX)


async def test_http_get_answers_status_headers_and_parsed_json_body(http_server):
    out = await run(
        {"kind": "http", "url": f"{http_server.url}/echo", "query": {"q": "${args.q}", "n": 3}}, args={"q": "a b"}
    )
    assert out.ok, out.error
    assert out.output["status"] == 200
    assert out.output["headers"]["content-type"] == "application/json"
    assert out.output["body"]["method"] == "GET"
    assert out.output["body"]["query"] == {"q": "a b", "n": "3"}


async def test_http_post_sends_an_object_body_as_json_with_templated_headers(http_server):
    raw = {
        "kind": "http",
        "method": "post",
        "url": "${args.base}/echo",
        "headers": {"x-order": "${args.id}"},
        "body": {"id": "${args.id}", "items": [1, 2]},
    }
    out = await run(raw, args={"base": http_server.url, "id": 9})
    body = out.output["body"]
    assert body["method"] == "POST" and body["body"] == {"id": 9, "items": [1, 2]}
    assert body["headers"]["x-order"] == "9" and body["headers"]["content-type"] == "application/json"


async def test_http_string_body_is_sent_as_text(http_server):
    out = await run({"kind": "http", "method": "PUT", "url": f"{http_server.url}/echo", "body": "hello"})
    assert out.output["body"]["body"] == "hello"
    assert out.output["body"]["headers"]["content-type"].startswith("text/plain")


async def test_http_text_response_is_text_and_json_under_a_text_type_parses_only_when_required(http_server):
    out = await run({"kind": "http", "url": f"{http_server.url}/text"})
    assert out.output["body"] == "plain words"
    loose = await run({"kind": "http", "url": f"{http_server.url}/json-as-text"})
    assert loose.output["body"] == '{"a": 1}'
    strict = await run({"kind": "http", "url": f"{http_server.url}/json-as-text", "require_json_response": True})
    assert strict.output["body"] == {"a": 1}


async def test_a_response_charset_that_is_no_text_encoding_is_read_as_utf8_without_stalling_the_server(http_server):
    # Python decodes `punycode` in quadratic time (a few hundred KiB would block the event loop for
    # minutes), and `idna` refuses errors="replace"; neither is a charset a web server should name.
    for charset in ("punycode", "idna"):
        started = time.monotonic()
        out = await run(
            {"kind": "http", "url": f"{http_server.url}/charset", "query": {"size": 200_000, "charset": charset}}
        )
        assert out.ok, out.error
        assert out.output["body"] == "a" * 200_000 + "-" + "99" * 100_000
        assert time.monotonic() - started < 20  # a request, on a loaded host too; punycode's decode: minutes


async def test_http_require_json_response_fails_on_a_text_body(http_server):
    out = await run({"kind": "http", "url": f"{http_server.url}/text", "require_json_response": True})
    assert out.error_code == "TOOL_ERROR" and "not JSON" in out.error


async def test_http_unexpected_status_fails_the_step_and_keeps_the_response(http_server):
    out = await run({"kind": "http", "url": f"{http_server.url}/status/503"})
    assert out.error_code == "TOOL_ERROR" and "HTTP 503" in out.error and "2xx" in out.error
    assert out.output == {"status": 503, "headers": out.output["headers"], "body": {"error": "as requested"}}


async def test_http_expected_status_codes_decide_what_success_is(http_server):
    out = await run({"kind": "http", "url": f"{http_server.url}/status/404", "expected_status_codes": [200, 404]})
    assert out.ok and out.output["status"] == 404
    out = await run({"kind": "http", "url": f"{http_server.url}/echo", "expected_status_codes": [201]})
    assert out.error_code == "TOOL_ERROR"


async def test_http_response_larger_than_the_policy_allows_fails(http_server):
    policy = StepPolicy(http=HttpPolicy(allowed_hosts=["127.0.0.1"], max_response_bytes=1000))
    out = await run({"kind": "http", "url": f"{http_server.url}/big"}, policy)
    assert out.error_code == "TOOL_FAILED" and "larger than 1000 bytes" in out.error


async def test_http_step_past_its_timeout_fails_and_the_connection_is_closed(http_server):
    out = await run({"kind": "http", "url": f"{http_server.url}/slow", "timeout_ms": 200})
    assert (out.error_code, out.error) == ("TIMEOUT", "timed out after 200 ms")
    with trio.fail_after(5):
        await http_server.log.slow_disconnected.wait()


async def test_cancelling_a_running_http_step_closes_its_connection(http_server):
    step = compiled({"kind": "http", "url": f"{http_server.url}/slow"}, LOCAL)
    finished = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:

            async def go() -> None:
                finished.append(await step.execute(env(), CTX))

            nursery.start_soon(go)
            await http_server.log.slow_started.wait()
            nursery.cancel_scope.cancel()
        await http_server.log.slow_disconnected.wait()
    assert finished == []  # cancellation went through the step; it did not turn into a result


# --- the policy -------------------------------------------------------------------------------------


async def test_loopback_is_refused_by_default_even_for_an_allowed_host(http_server):
    for policy in (
        StepPolicy(http=HttpPolicy(allowed_hosts=["*"])),
        StepPolicy(http=HttpPolicy(allowed_hosts=["localhost"])),
    ):
        out = await run({"kind": "http", "url": f"http://localhost:{http_server.port}/echo"}, policy)
        assert out.error_code == "FORBIDDEN" and "loopback" in out.error
    out = await run(
        {"kind": "http", "url": "${args.u}"},
        StepPolicy(http=HttpPolicy(allowed_hosts=["*"])),
        {"u": f"{http_server.url}/echo"},
    )
    assert out.error_code == "FORBIDDEN"
    assert http_server.log.requests == []


async def test_allow_private_admits_loopback_for_allowed_hosts(http_server):
    policy = StepPolicy(http=HttpPolicy(allowed_hosts=["localhost"], allow_private=True))
    out = await run({"kind": "http", "url": f"http://localhost:{http_server.port}/echo"}, policy)
    assert out.ok, out.error
    assert out.output["body"]["headers"]["host"] == f"localhost:{http_server.port}"


async def test_a_host_outside_the_allowlist_is_refused_before_any_connection():
    out = await run({"kind": "http", "url": "${args.u}"}, LOCAL, {"u": "http://example.com/"})
    assert out.error_code == "FORBIDDEN" and "example.com" in out.error


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data",  # link-local (cloud metadata)
        "http://10.1.2.3/",  # private
        "http://[::1]/",  # IPv6 loopback
        "http://[::ffff:127.0.0.1]/",  # IPv4-mapped loopback
        "http://0.0.0.0/",  # unspecified
    ],
)
async def test_non_public_addresses_are_refused_without_connecting(url):
    out = await run({"kind": "http", "url": "${args.u}"}, StepPolicy(http=HttpPolicy(allowed_hosts=["*"])), {"u": url})
    assert out.error_code == "FORBIDDEN", out.error


@pytest.mark.parametrize(
    "url",
    [
        "http://[64:ff9b::127.0.0.1]/",  # NAT64 of loopback
        "http://[64:ff9b::169.254.169.254]/",  # NAT64 of the cloud metadata address
        "http://[64:ff9b:1::a00:1]/",  # local-use NAT64 prefix
        "http://[2002:a00:1::1]/",  # 6to4 of 10.0.0.1
        "http://[::127.0.0.1]/",  # IPv4-compatible loopback
        "http://[::ffff:0:7f00:1]/",  # IPv4-translated loopback
        "http://[fec0::1]/",  # site-local
    ],
)
async def test_ipv6_addresses_embedding_a_non_public_ipv4_address_are_refused(url):
    out = await run({"kind": "http", "url": "${args.u}"}, StepPolicy(http=HttpPolicy(allowed_hosts=["*"])), {"u": url})
    assert out.error_code == "FORBIDDEN", out.error


async def test_a_non_http_scheme_is_refused():
    out = await run({"kind": "http", "url": "${args.u}"}, LOCAL, {"u": "file:///etc/passwd"})
    assert out.error_code == "FORBIDDEN" and "scheme" in out.error


async def test_redirects_are_not_followed_unless_asked(http_server):
    to = f"{http_server.url}/echo"
    out = await run(
        {"kind": "http", "url": f"{http_server.url}/redirect", "query": {"to": to}, "expected_status_codes": [302]}
    )
    assert out.ok and out.output["headers"]["location"] == to
    out = await run(
        {"kind": "http", "url": f"{http_server.url}/redirect", "query": {"to": to}, "follow_redirects": True}
    )
    assert out.ok and out.output["body"]["method"] == "GET"


async def test_a_redirect_to_a_host_outside_the_allowlist_is_refused(http_server):
    for to in (f"http://localhost:{http_server.port}/echo", "http://169.254.169.254/"):
        raw = {"kind": "http", "url": f"{http_server.url}/redirect", "query": {"to": to}, "follow_redirects": True}
        out = await run(raw)
        assert out.error_code == "FORBIDDEN", out.error
    assert [r["path"] for r in http_server.log.requests] == ["/redirect", "/redirect"]


def test_a_constant_url_outside_the_allowlist_is_rejected_at_load():
    _, problems = compile_step(
        {"kind": "http", "url": "https://evil.example/x"}, "pipelines.p.steps[1]", StepScope(policy=LOCAL)
    )
    assert [(p.location, p.code) for p in problems] == [("pipelines.p.steps[1].url", "FORBIDDEN")]


def test_host_patterns_match_exact_names_subdomains_and_literals():
    policy = HttpPolicy(allowed_hosts=["api.example.com", "*.corp.example", "127.0.0.1", "[::1]"])
    assert policy.host_allowed("API.example.com")
    assert not policy.host_allowed("example.com")
    assert policy.host_allowed("a.b.corp.example") and not policy.host_allowed("corp.example")
    assert policy.host_allowed("127.0.0.1") and policy.host_allowed("::1") and not policy.host_allowed("127.0.0.2")
    assert not HttpPolicy().host_allowed("anything")


# --- graphql ----------------------------------------------------------------------------------------


async def test_graphql_posts_the_operation_and_variables_and_answers_data(http_server):
    raw = {
        "kind": "graphql",
        "url": f"{http_server.url}/graphql",
        "operation": "query Q($id: ID!) { user(id: $id) { name } }",
        "operation_name": "Q",
        "variables": {"id": "${args.id}"},
    }
    out = await run(raw, args={"id": 4})
    assert out.ok, out.error
    assert out.output == {"echo": {"id": 4}, "op": "Q"}


async def test_graphql_errors_fail_the_step(http_server):
    out = await run({"kind": "graphql", "url": f"{http_server.url}/graphql", "operation": "{ boom }"})
    assert out.error_code == "TOOL_ERROR" and "field 'boom' does not exist" in out.error


async def test_graphql_is_held_to_the_same_host_policy(http_server):
    policy = StepPolicy(http=HttpPolicy(allowed_hosts=["*"]))
    out = await run(
        {"kind": "graphql", "url": "${args.u}", "operation": "{ x }"}, policy, {"u": f"{http_server.url}/graphql"}
    )
    assert out.error_code == "FORBIDDEN"


async def test_graphql_non_json_answer_fails(http_server):
    out = await run({"kind": "graphql", "url": f"{http_server.url}/text", "operation": "{ x }"})
    assert not out.ok and "not a GraphQL response" in out.error


async def test_an_http_step_without_a_timeout_gets_the_policys_default(http_server):
    policy = StepPolicy(http=HttpPolicy(allowed_hosts=["127.0.0.1"], timeout_ms=150))
    step = compiled({"kind": "http", "url": f"{http_server.url}/slow"}, policy)
    assert step.timeout_ms == 150
    with trio.fail_after(10):
        out = await step.execute(env(), CTX)
    assert out.error_code == "TIMEOUT"
    assert compiled({"kind": "http", "url": f"{http_server.url}/slow", "timeout_ms": 5}, policy).timeout_ms == 5


class _FixedResolver(trio.abc.HostnameResolver):
    """Answers one public address for every name, and notes the names asked."""

    def __init__(self) -> None:
        self.asked: list[bytes] = []

    async def getaddrinfo(self, host, port, family=0, type=0, proto=0, flags=0):
        self.asked.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", port))]

    async def getnameinfo(self, sockaddr, flags):
        raise NotImplementedError


async def test_the_tls_server_name_of_an_international_host_is_its_ascii_form_the_name_that_was_checked():
    # faß.example is xn--fa-hia.example; Python's own IDNA 2003 codec would turn it into fass.example, a
    # different name, so the certificate would be checked against a host nobody allowed.
    resolver = _FixedResolver()
    trio.socket.set_custom_hostname_resolver(resolver)
    sent = []

    class Pool:
        async def handle_async_request(self, request):
            sent.append(request)
            raise httpcore2.ConnectError("not connecting in this test")

    transport = _GuardedTransport(HttpPolicy(allowed_hosts=["faß.example"]))
    transport._pool = Pool()
    try:
        with pytest.raises(httpcore2.ConnectError):
            await transport.handle_async_request(httpx2.Request("GET", "https://faß.example/x"))
    finally:
        trio.socket.set_custom_hostname_resolver(None)
    assert resolver.asked == [b"xn--fa-hia.example"]
    [request] = sent
    assert request.url.host == b"93.184.216.34"
    assert request.extensions["sni_hostname"] == "xn--fa-hia.example"
    assert dict(request.headers)[b"Host"] == b"xn--fa-hia.example"


# --- the public request API that formats build on (mcpg's bindings, piraeus, the workflow) ----------


async def test_send_request_answers_the_status_headers_and_body_and_decodes_by_content_type(http_server):
    from mcpipe.kinds.http import send_request

    with trio.fail_after(10):
        r = await send_request(LOCAL.http, "POST", f"{http_server.url}/echo", headers={"x-a": "1"}, content=b"[1]")
        text = await send_request(LOCAL.http, "GET", f"{http_server.url}/text")
    assert r.status == 200 and r.header_map()["content-type"] == "application/json" and not r.truncated
    assert r.decoded() == ({"method": "POST", "query": {}, "headers": r.decoded()[0]["headers"], "body": [1]}, True)
    assert r.decoded()[0]["headers"]["x-a"] == "1"
    assert text.decoded() == ("plain words", False) and text.charset == "utf-8"


async def test_send_request_cuts_a_long_body_when_asked_and_fails_it_otherwise(http_server):
    from mcpipe.kinds.http import send_request
    from mcpipe.results import StepFailure

    with trio.fail_after(10):
        cut = await send_request(LOCAL.http, "GET", f"{http_server.url}/big", max_bytes=100, truncate=True)
        with pytest.raises(StepFailure, match="larger than 100 bytes"):
            await send_request(LOCAL.http, "GET", f"{http_server.url}/big", max_bytes=100)
    assert cut.body == b"x" * 100 and cut.truncated


async def test_send_request_failures_say_their_stage_and_whether_the_deadline_passed(http_server):
    from mcpipe.kinds.http import HttpRequestFailed, send_request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # bound, not listening: the connection is refused
        with trio.fail_after(10):
            with pytest.raises(HttpRequestFailed) as refused:
                await send_request(LOCAL.http, "GET", f"http://127.0.0.1:{closed}/")
            with pytest.raises(HttpRequestFailed) as slow:
                await send_request(LOCAL.http, "GET", f"{http_server.url}/slow", timeout_s=0.2)
            with pytest.raises(HttpRequestFailed) as bad:
                await send_request(LOCAL.http, "GET", "http://[::1/")
    assert refused.value.stage == "send" and not refused.value.timed_out
    assert slow.value.stage == "send" and slow.value.timed_out and "did not answer within 0.2 s" in str(slow.value)
    assert bad.value.stage == "url"
