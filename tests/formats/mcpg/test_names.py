"""mcpg's expression variables are read as mcpipe's (``mcpipe.formats.mcpg._names``)."""

from __future__ import annotations

import pytest

from mcpipe.expr import CelExpr
from mcpipe.formats.mcpg._names import rename_cel, rename_jsonata


@pytest.mark.parametrize(
    ("mcpg", "mcpipe"),
    [
        ("steps.fetch.output.user.name", "steps.fetch.output.user.name"),
        ("arguments.n + args.m", "args.n + args.m"),
        (
            'completed_steps.a.output.x + original_args.y + "completed_steps"',
            'steps.a.output.x + args.y + "completed_steps"',
        ),
        ("!steps.a.is_error && completed_steps.b.is_error", "!(!steps.a.ok) && (!steps.b.ok)"),
        ('context.principal_id == "u"', '(has(context.identity) ? context.identity.subject_id : null) == "u"'),
        ("has(request_context.request_id)", "has(context.request_id)"),
        (
            'principal_id != null && trust_level == "verified"',
            "(has(context.identity) ? context.identity.subject_id : null) != null && "
            '(has(context.identity) ? context.identity.trust_level : "unauthenticated") == "verified"',
        ),
        ('tool_name == "t"', '"orders.charge" == "t"'),
        ("[1, 2].map(arguments, arguments * 2)", "[1, 2].map(arguments, arguments * 2)"),
    ],
)
def test_mcpg_variables_in_cel_are_read_as_mcpipes(mcpg: str, mcpipe: str) -> None:
    out = rename_cel(mcpg, tool_name="orders.charge")
    assert out == mcpipe
    CelExpr.compile(out)  # what mcpipe compiles


def test_mcpgs_jsonata_document_names_arguments_args() -> None:
    assert (
        rename_jsonata('{"ids": arguments.orders.id, "by": tool_name}', tool_name="t")
        == '{"ids": args.orders.id, "by": "t"}'
    )


ANONYMOUS = {"request_id": "7", "client": {}, "principal": None, "session_id": None, "transport": "http"}
VERIFIED = {
    **ANONYMOUS,
    "principal": "ada",
    "session_id": "s-1",
    "identity": {
        "subject_id": "ada",
        "trust_level": "verified",
        "auth_provider": "oidc",
        "issuer": "https://idp.example",
        "roles": ["admin"],
        "groups": [],
        "scopes": ["orders:write"],
        "attributes": {},
    },
}
HEADER = {
    **ANONYMOUS,
    "principal": "bob",
    "identity": {
        **VERIFIED["identity"],
        "subject_id": "bob",
        "trust_level": "header_asserted",
        "auth_provider": "header",
    },
}


@pytest.mark.parametrize(
    ("source", "facts", "expected"),
    [
        ("principal_id", ANONYMOUS, None),
        ("trust_level", ANONYMOUS, "unauthenticated"),
        ("context.trust_level", ANONYMOUS, "unauthenticated"),
        ("auth_provider", HEADER, None),
        ("auth_provider", VERIFIED, "oidc"),
        ("request_context.request_id", ANONYMOUS, "7"),
        ("request_context.identity", ANONYMOUS, {"kind": "anonymous", "source": "no_subject_header"}),
        (
            "request_context.identity",
            HEADER,
            {"kind": "http_header", "subject_id": "bob", "source": "x-mcpg-subject-id"},
        ),
        ("request_context.identity.kind", VERIFIED, "verified"),
        ("request_context.identity.scopes", VERIFIED, ["orders:write"]),
        ("request_context.session_id", VERIFIED, "s-1"),
        ("context.principal_id", VERIFIED, "ada"),
        ('context["roles"]', VERIFIED, ["admin"]),
    ],
)
def test_mcpgs_request_variables_read_for_every_caller_anonymous_included(
    source: str, facts: dict, expected: object
) -> None:
    """mcpg's variables are there for every caller: an anonymous one is no missing key (mcpipe's
    ``context.identity`` is absent then)."""
    env = {"args": {}, "steps": {}, "vars": {}, "last": None, "context": facts}
    assert CelExpr.compile(rename_cel(source, tool_name="t")).evaluate(env) == expected
