"""Pipelines that ask the client: elicitation, sampling, roots and gather, in both protocol eras.

See ``docs/interaction.md``. The pieces:

- :class:`Interaction` (per call) asks: over the session in 2025-11-25, by suspending in 2026-07-28;
- :class:`Interactions` (per server) turns a suspension into an input-required result and resumes a retry;
- :class:`StateSealer` seals the suspended state (AES-256-GCM, bound to call, principal, expiry, one use);
- the store (:mod:`mcpipe.store`) keeps large states and used-state claims;
- the ``ask_user``/``sample``/``list_roots`` tools; the asking step kinds are in :mod:`mcpipe.kinds`.
"""

from mcpipe.interaction._ask import GATHER_KINDS, OUTPUT_OF, BadInput, ask_one, elicitation_params, question
from mcpipe.interaction._core import (
    SKIPPED,
    AskFailed,
    CapabilityMissing,
    Escalated,
    Interaction,
    Suspended,
    interaction_of,
    only,
)
from mcpipe.interaction._relay import (
    Askers,
    call_relaying,
    caller_capabilities,
    keep_caller_capabilities,
    request_asking,
)
from mcpipe.interaction._serve import Interactions, sdk_call
from mcpipe.interaction._state import STATE_KEY_ENV, StateError, StateSealer, args_digest
from mcpipe.interaction._tools import INTERACTION_TOOL_NAMES, InteractionTools, interaction_tools
from mcpipe.store import InMemoryPipelineStore, PipelineStore, StoreUnavailable

__all__ = [
    "GATHER_KINDS",
    "INTERACTION_TOOL_NAMES",
    "OUTPUT_OF",
    "SKIPPED",
    "STATE_KEY_ENV",
    "AskFailed",
    "Askers",
    "BadInput",
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
    "ask_one",
    "call_relaying",
    "caller_capabilities",
    "elicitation_params",
    "interaction_of",
    "interaction_tools",
    "keep_caller_capabilities",
    "only",
    "question",
    "request_asking",
    "sdk_call",
]
