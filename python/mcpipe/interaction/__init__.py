"""Pipelines that ask the client: elicitation, sampling, roots and gather, in both protocol eras.

See ``docs/interaction.md``. The pieces:

- :class:`Interaction` (per call) asks: over the session in 2025-11-25, by suspending in 2026-07-28;
- :class:`Interactions` (per server) turns a suspension into an input-required result and resumes a retry;
- :class:`StateSealer` seals the suspended state (AES-256-GCM, bound to call, principal, expiry, one use);
- the store (:mod:`mcpipe.store`) keeps large states and used-state claims;
- the ``ask_user``/``sample``/``list_roots`` tools; the asking step kinds are in :mod:`mcpipe.kinds`.

Asking the client
-----------------

(`python/mcpipe/interaction/`). Steps that need the client (elicitation, sampling, roots) find a per-call
`Interaction` in the tool context. On 2025-11-25 it sends the request over the session and the step waits, like
any call in flight. On 2026-07-28 it raises `Suspended`, a `BaseException` no step handler turns into a failure;
the scheduler records every finished leaf step (by path) and lets the siblings of a suspended parallel child
finish, and the server answers an input-required result carrying those records sealed in `requestState`
(AES-256-GCM, bound to call, principal and expiry, one use). The client's retry re-runs the call with the
records: finished steps answer from them without running, so nothing runs twice. The pipeline store (in memory by
default, behind an interface) keeps large states and the one-use claims, swept by a task started with
`nursery.start`; both are bounded in count (claims by evicting the soonest-expiring and refusing, as
`unverifiable`, any state expiring no later than an evicted claim, so no replay passes). See docs/interaction.md.
A downstream server's questions during a call are relayed through the same `Interaction`
(`interaction/_relay.py`): a 2026-07-28 downstream's input-required result is asked of the caller (its
`requestState` carried in `Interaction.relayed`, sealed with the rest), and a 2025-11-25 downstream's mid-call
requests reach the downstream session's callbacks, routed to the call in flight. A 2026-07-28 downstream is told
the caller's capabilities with each call (the session's stamp is wrapped so a request's own entry wins), and with
`protocol = "auto"` an HTTP downstream is reached over a second, 2025-11-25 session (`DownstreamServer.twin`,
opened on first use) for 2025-11-25 callers.

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
