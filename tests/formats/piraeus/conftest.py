"""Fixtures of the piraeus format's tests: the stand-in APIs on 127.0.0.1 (``kit.piraeus``) and the scripted
OpenAI-compatible model server (``kit.llm``); mcpipe is reached through the SDK's own client."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from kit.llm import FakeOpenAI, fake_openai
from kit.piraeus import StandIn, stand_in


@pytest.fixture
async def api() -> AsyncIterator[StandIn]:
    """The APIs piraeus's example tools call, on a free port of 127.0.0.1."""
    async with stand_in() as served:
        yield served


@pytest.fixture
async def model() -> AsyncIterator[FakeOpenAI]:
    """A scripted chat-completions endpoint (``model.says(text(...))``)."""
    async with fake_openai() as fake:
        yield fake


@pytest.fixture(autouse=True)
def alpha_vantage_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """The secret the upstream example names (``${ALPHA_VANTAGE_API_KEY}``), set in the environment."""
    monkeypatch.setenv("ALPHA_VANTAGE_API_KEY", "av-secret-key")
