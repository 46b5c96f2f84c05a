"""Pipelines that ask the client: elicitation, sampling, roots and gather, in both protocol eras.

See ``docs/interaction.md``. The pieces:

- :class:`Interaction` (per call) asks: over the session in 2025-11-25, by suspending in 2026-07-28;
- :class:`Interactions` (per server) turns a suspension into an input-required result and resumes a retry;
- :class:`StateSealer` seals the suspended state (AES-256-GCM, bound to call, principal, expiry, one use);
- the store (:mod:`mcpipe.store`) keeps large states and used-state claims;
- the ``ask_user``/``sample``/``list_roots`` tools; the asking step kinds are in :mod:`mcpipe.kinds`.
"""

from mcpipe.interaction._core import (
    SKIPPED,
    AskFailed,
    CapabilityMissing,
    Escalated,
    Interaction,
    Suspended,
    interaction_of,
)
from mcpipe.interaction._serve import Interactions, sdk_call
from mcpipe.interaction._state import STATE_KEY_ENV, StateError, StateSealer, args_digest
from mcpipe.interaction._tools import INTERACTION_TOOL_NAMES, InteractionTools, interaction_tools
from mcpipe.store import InMemoryPipelineStore, PipelineStore, StoreUnavailable

__all__ = [
    "INTERACTION_TOOL_NAMES",
    "SKIPPED",
    "STATE_KEY_ENV",
    "AskFailed",
    "CapabilityMissing",
    "Escalated",
    "InMemoryPipelineStore",
    "Interaction",
    "InteractionTools",
    "Interactions",
    "PipelineStore",
    "StateError",
    "StateSealer",
    "StoreUnavailable",
    "Suspended",
    "args_digest",
    "interaction_of",
    "interaction_tools",
    "sdk_call",
]
