"""Sealing a suspended pipeline's state into the ``requestState`` a 2026-07-28 client echoes back.

The client holds the state between rounds and may alter it, so it is sealed with authenticated
encryption: the SDK's AES-256-GCM codec (:class:`mcp.server.request_state.AESGCMRequestStateCodec`, HKDF
from the server key, a fresh nonce per token, a key ring for rotation). Inside the seal go the claims
checked on the way back in:

- ``exp``: past it the state is refused (``expired``);
- ``t`` and ``a``: the tool and a digest of its arguments, so a state cannot resume another call;
- ``p``: the principal, so a state cannot be resumed by somebody else;
- ``aud``: the server's name, so a state minted by another service sharing the key is refused;
- ``jti``: a one-time id claimed in the :class:`~mcpipe.interaction.PipelineStore` when the state is
  used, so the same state cannot be replayed.

A state larger than ``inline_max_bytes`` stays in the store (sealed there too) and the token carries only
its handle; the handle is taken from the store when used, so it works once.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from mcpipe.store import ClaimUnverifiable, PipelineStore

if TYPE_CHECKING:
    from mcp.server.request_state import AESGCMRequestStateCodec

__all__ = ["DEFAULT_INLINE_MAX_BYTES", "DEFAULT_STATE_TTL_S", "STATE_KEY_ENV", "StateError", "StateSealer"]

STATE_KEY_ENV = "MCPIPE_STATE_KEY"
"""The environment variable holding the state key (at least 32 bytes; several, comma-separated, rotate)."""

DEFAULT_STATE_TTL_S = 600.0
DEFAULT_INLINE_MAX_BYTES = 16 * 1024

_VERSION = 1
_FUTURE_SKEW_S = 60.0

_log = logging.getLogger("mcpipe.interaction")


class StateError(Exception):
    """A ``requestState`` that cannot be resumed.

    Attributes:
        reason: a stable word: ``malformed``, ``tampered``, ``expired``, ``replayed``, ``unverifiable``,
            ``other_call``, ``other_principal``, ``other_server``.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def args_digest(tool: str, args: Any) -> str:
    """What binds a state to one call: the tool's name and its arguments (canonical JSON, SHA-256)."""
    return hashlib.sha256(tool.encode() + b"\0" + orjson.dumps(args, option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]


class StateSealer:
    """Seals and unseals suspended states.

    Args:
        store: where large states and the claims of used states live.
        keys: the key ring (``keys[0]`` seals, every key unseals); None reads ``key_env``, and without it a
            random key of this process is used (states then die with the process).
        key_env: the environment variable holding the key ring (default :data:`STATE_KEY_ENV`).
        ttl_s: how long a state can be resumed.
        inline_max_bytes: larger states are kept in the store behind a handle.
        audience: the server's identity (its name); a state minted for another audience is refused.
        clock: the time source.
    """

    def __init__(
        self,
        store: PipelineStore,
        *,
        keys: Sequence[str | bytes] | None = None,
        ttl_s: float = DEFAULT_STATE_TTL_S,
        inline_max_bytes: int = DEFAULT_INLINE_MAX_BYTES,
        audience: str | None = None,
        clock: Any = time.time,
        key_env: str = STATE_KEY_ENV,
    ) -> None:
        if keys is None:
            env = os.environ.get(key_env, "")
            keys = [k.strip() for k in env.split(",") if k.strip()] or None
        self.ephemeral = keys is None
        if keys is None:
            keys = [os.urandom(32)]
        self._keys = list(keys)
        self._sealing: AESGCMRequestStateCodec | None = None
        self.store = store
        self.ttl_s = ttl_s
        self.inline_max_bytes = inline_max_bytes
        self.audience = audience
        self._clock = clock

    async def seal(self, state: Mapping[str, object], *, tool: str, digest: str, principal: str | None) -> str:
        """A token for ``state``, bound to this call and principal, valid for ``ttl_s``."""
        now = self._clock()
        claims: dict[str, Any] = {
            "v": _VERSION,
            "iat": now,
            "exp": now + self.ttl_s,
            "jti": os.urandom(12).hex(),
            "t": tool,
            "a": digest,
            "p": principal,
            "aud": self.audience,
        }
        body = orjson.dumps(state)
        if len(body) <= self.inline_max_bytes:
            claims["s"] = state
        else:
            handle = os.urandom(16).hex()
            await self.store.put(handle, self._codec.seal(body).encode(), claims["exp"])
            claims["h"] = handle
        return self._codec.seal(orjson.dumps(claims))

    async def unseal(self, token: Any, *, tool: str, digest: str, principal: str | None) -> dict[str, Any]:
        """The state a token holds, once every claim checks out; the token is then used up.

        Raises:
            StateError: the token is malformed, altered or foreign, expired, replayed, or minted for
                another call or another principal.
        """
        if not isinstance(token, str) or not token:
            raise StateError("malformed", "requestState must be a non-empty string")
        claims = self._open(token)
        now = self._clock()
        exp, iat = claims.get("exp"), claims.get("iat")
        if not isinstance(iat, int | float) or not iat <= now + _FUTURE_SKEW_S:
            raise StateError("malformed", "requestState has no valid issue time")
        if not isinstance(exp, int | float) or not now < exp:
            raise StateError("expired", "requestState has expired; call the tool again from the start")
        if claims.get("aud") != self.audience:
            raise StateError("other_server", "requestState was issued by another server")
        if claims.get("t") != tool or claims.get("a") != digest:
            raise StateError("other_call", "requestState belongs to another tool call (name or arguments differ)")
        if claims.get("p") != principal:
            raise StateError("other_principal", "requestState was issued to another principal")
        jti = claims.get("jti")
        try:
            fresh = isinstance(jti, str) and await self.store.claim(jti, exp)
        except ClaimUnverifiable as e:
            raise StateError("unverifiable", str(e)) from None
        if not fresh:
            raise StateError("replayed", "requestState was already used (a state resumes once)")
        if "h" in claims:
            blob = await self.store.take(str(claims["h"]))
            if blob is None:
                raise StateError(
                    "expired",
                    "the suspended pipeline is no longer in the store (expired, or evicted as the oldest to keep "
                    "the store within its limits)",
                )
            from mcp.server.request_state import InvalidRequestState

            try:
                state = orjson.loads(self._codec.unseal(blob.decode()))
            except (InvalidRequestState, UnicodeDecodeError, orjson.JSONDecodeError):
                raise StateError("tampered", "the stored pipeline state failed verification") from None
        else:
            state = claims.get("s")
        if not isinstance(state, dict):
            raise StateError("malformed", "requestState holds no pipeline state")
        return state

    @property
    def _codec(self) -> AESGCMRequestStateCodec:
        """The SDK's codec (and ``cryptography``), imported when a first state is sealed or opened, not when the
        server starts."""
        if self._sealing is None:
            from mcp.server.request_state import AESGCMRequestStateCodec

            self._sealing = AESGCMRequestStateCodec(self._keys)
        return self._sealing

    def _open(self, token: str) -> dict[str, Any]:
        from mcp.server.request_state import InvalidRequestState

        try:
            payload = self._codec.unseal(token)
        except InvalidRequestState as e:
            _log.info("requestState refused: %s", e)
            raise StateError("tampered", "requestState is altered, or was not issued by this server") from None
        try:
            claims = orjson.loads(payload)
        except orjson.JSONDecodeError:
            raise StateError("malformed", "requestState is not a pipeline state") from None
        if not isinstance(claims, dict) or claims.get("v") != _VERSION:
            raise StateError("malformed", "requestState is not a pipeline state of this version")
        return claims
