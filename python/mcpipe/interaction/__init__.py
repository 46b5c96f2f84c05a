"""Pipelines that ask the client: elicitation, sampling, roots and gather, in both protocol eras.

See ``docs/interaction.md``. The pieces:

- :class:`Interaction` (per call) asks: over the session in 2025-11-25, by suspending in 2026-07-28;
- :class:`Interactions` (per server) turns a suspension into an input-required result and resumes a retry;
- :class:`StateSealer` seals the suspended state (AES-256-GCM, bound to call, principal, expiry, one use);
- the store (:mod:`mcpipe.store`) keeps large states and used-state claims;
- the ``ask_user``/``sample``/``list_roots`` tools; the asking step kinds are in :mod:`mcpipe.kinds`.
"""

from typing import TYPE_CHECKING

from mcpipe._lazy import lazy_names
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
from mcpipe.interaction._tools import INTERACTION_TOOL_NAMES, InteractionTools, interaction_tools
from mcpipe.store import InMemoryPipelineStore, PipelineStore, StoreUnavailable

if TYPE_CHECKING:
    from mcpipe.interaction._relay import (
        Askers,
        call_relaying,
        caller_capabilities,
        keep_caller_capabilities,
        request_asking,
    )
    from mcpipe.interaction._serve import Interactions, sdk_call
    from mcpipe.interaction._state import STATE_KEY_ENV, StateError, StateSealer, args_digest

# What talks to the client's session, or seals state, imports the MCP SDK: loaded on first use, so the step
# kinds (which import this package) do not load the SDK for a command that never serves.
__getattr__ = lazy_names(
    __name__,
    {
        **dict.fromkeys(
            ["Askers", "call_relaying", "caller_capabilities", "keep_caller_capabilities", "request_asking"],
            "._relay",
        ),
        **dict.fromkeys(["Interactions", "sdk_call"], "._serve"),
        **dict.fromkeys(["STATE_KEY_ENV", "StateError", "StateSealer", "args_digest"], "._state"),
    },
)

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
