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
        ('context.principal_id == "u"', 'context.identity.subject_id == "u"'),
        ('request_context.trust_level == "verified"', 'context.identity.trust_level == "verified"'),
        (
            'principal_id != null && trust_level == "verified"',
            'context.identity.subject_id != null && context.identity.trust_level == "verified"',
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
