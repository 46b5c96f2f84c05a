"""Cedar policies deciding tool calls, evaluated by the Cedar engine itself (``cedarpy``, the Rust
``cedar-policy`` crate), never by a parser of ours.

Each call becomes a Cedar request the way mcpg's ``dev.mcpg.policy.cedar`` builds it: principal
``<principal_type>::"<subject>"`` (``anonymous_principal`` without one), action
``<action_namespace>::"tool.call.pre"``, resource ``<resource_type>::"<id>"`` from the ``resource_types``
entry for the decision point (``*`` the catch-all), the arguments as context when asked. A matching
``forbid`` denies (naming the policies), a ``permit`` allows, and when nothing matches ``default`` decides:
``deny``, or ``defer`` (the gates after decide). A request the engine cannot evaluate denies.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from mcpipe._core import json_measure
from mcpipe.errors import ErrorCode, Problem

if TYPE_CHECKING:
    from mcpipe.access._config import CedarGate

__all__ = ["CedarEngine", "cedar_problems", "load_cedar"]

_log = logging.getLogger("mcpipe.access.cedar")

DECISION_POINT = "tool.call.pre"
MAX_POLICY_BYTES = 16 * 1024 * 1024
"""The most Cedar text (all files together) a gate loads."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the engine decided: ``allow``, ``deny`` or ``defer`` (no policy matched, ``default = "defer"``)."""

    effect: str
    reason: str = ""


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _policy_text(cfg: CedarGate, base_dir: str) -> str:
    """The gate's Cedar text: ``policies`` and every ``.cedar`` file under ``policy_dir``, in path order.

    Raises:
        OSError: a file cannot be read.
        ValueError: there is none, or too much.
    """
    parts: list[str] = []
    if cfg.policies is not None:
        parts.append(cfg.policies)
    if cfg.policy_dir is not None:
        root = Path(base_dir, os.path.expanduser(cfg.policy_dir))
        if not root.is_dir():
            raise ValueError(f"`{cfg.policy_dir}` is not a directory")
        files = sorted(p for p in root.rglob("*.cedar") if p.is_file())
        if not files:
            raise ValueError(f"`{cfg.policy_dir}` holds no .cedar file")
        parts.extend(_read(p) for p in files)
    if not parts:
        raise ValueError("set `policies` (Cedar text) or `policy_dir` (a directory of .cedar files)")
    text = "\n".join(parts)
    if len(text.encode()) > MAX_POLICY_BYTES:
        raise ValueError(f"the policies are larger than {MAX_POLICY_BYTES} bytes")
    return text


class CedarEngine:
    """One gate's parsed policies, entities and schema: parsed once, evaluated per call."""

    def __init__(self, cfg: CedarGate, *, base_dir: str = ".") -> None:
        import cedarpy  # with the first Cedar gate: a server without one never loads the engine

        self.cfg = cfg
        text = _policy_text(cfg, base_dir)
        self.policies = cedarpy.PolicySet.from_str(text)
        static = orjson.loads(cedarpy.policies_to_json_str(text)).get("staticPolicies", {})
        self._forbids = frozenset(pid for pid, p in static.items() if p.get("effect") == "forbid")
        self._labels = {pid: (p.get("annotations") or {}).get("id", pid) for pid, p in static.items()}
        self.schema: Any = None
        if cfg.schema_path is not None:
            raw = _read(Path(base_dir, os.path.expanduser(cfg.schema_path)))
            self.schema = (
                cedarpy.Schema.from_json_str(raw) if cfg.schema_path.endswith(".json") else cedarpy.Schema.from_str(raw)
            )
            result = cedarpy.validate_policies(text, self.schema)
            if not result.validation_passed:
                raise ValueError("; ".join(str(e) for e in result.errors) or "the policies do not fit the schema")
        entities = "[]"
        if cfg.entities_path is not None:
            entities = _read(Path(base_dir, os.path.expanduser(cfg.entities_path)))
        self.entities = cedarpy.Entities.from_json_str(entities)

    def _resource(self, tool: str, args: object) -> dict[str, str]:
        rt = next((r for r in self.cfg.resource_types if r.decision_point == DECISION_POINT), None)
        if rt is None:
            rt = next((r for r in self.cfg.resource_types if r.decision_point == "*"), None)
        if rt is None:
            raise LookupError(f"no resource_types entry covers `{DECISION_POINT}` (and no `*` catch-all)")
        if rt.resource_id == "tool":
            return {"type": rt.resource_type, "id": tool}
        if not rt.resource_id:
            return {"type": rt.resource_type, "id": "unspecified"}
        value = _pointer(args, rt.resource_id)
        if value is _MISSING:
            rid = "unknown"
        elif isinstance(value, str):
            rid = value
        else:
            rid = orjson.dumps(value).decode()
        return {"type": rt.resource_type, "id": rid}

    def decide(self, tool: str, args: object, subject: str | None) -> Verdict:
        """Cedar's verdict on ``subject`` calling ``tool`` with ``args``."""
        import cedarpy

        cfg = self.cfg
        try:
            context: Any = {}
            if cfg.arguments_as_context:
                # Cedar builds its own copy of the context and evaluates holding the interpreter: 4 MB of
                # arguments held the event loop 1.3 to 4.7 s per call (issue 20's review). Measured first.
                size = json_measure(args, max_bytes=cfg.max_context_bytes)[0]
                if size > cfg.max_context_bytes:
                    return Verdict(
                        "deny",
                        f"the arguments are larger than {cfg.max_context_bytes} bytes, the most a Cedar context "
                        "may hold (max_context_bytes)",
                    )
                context = args if isinstance(args, dict) else {"value": args}
            request = {
                "principal": {
                    "type": cfg.principal_type,
                    "id": subject if subject is not None else cfg.anonymous_principal,
                },
                "action": {"type": cfg.action_namespace, "id": DECISION_POINT},
                "resource": self._resource(tool, args),
                "context": context,
            }
            result = cedarpy.is_authorized(request, self.policies, self.entities, self.schema)
        except (LookupError, ValueError, TypeError) as exc:
            return Verdict("deny", f"cedar cannot evaluate the call: {exc}")
        if result.decision == cedarpy.Decision.Allow:
            return Verdict("allow")
        errors = list(result.diagnostics.errors)
        if result.decision != cedarpy.Decision.Deny or errors:
            return Verdict("deny", f"cedar cannot evaluate the call: {'; '.join(map(str, errors)) or result.decision}")
        forbids = [self._labels.get(p, p) for p in result.diagnostics.reasons if p in self._forbids]
        if forbids:
            return Verdict("deny", f"cedar forbid: {', '.join(forbids)}")
        if cfg.default == "defer":
            return Verdict("defer")
        return Verdict("deny", "cedar: no policy permits it (default deny)")


_MISSING: Any = object()


def _pointer(value: object, pointer: str) -> Any:
    """RFC 6901: ``/a/0/b`` into a JSON value (``_MISSING`` when it leads nowhere)."""
    if pointer == "":
        return value
    if not pointer.startswith("/"):
        return _MISSING
    for raw in pointer[1:].split("/"):
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(value, dict):
            if token not in value:
                return _MISSING
            value = value[token]
        elif isinstance(value, list) and token.isdigit() and int(token) < len(value):
            value = value[int(token)]
        else:
            return _MISSING
    return value


def load_cedar(cfg: CedarGate, *, base_dir: str) -> CedarEngine:
    """The engine of one ``cedar`` gate (raises ``OSError``/``ValueError`` with the reason it cannot load)."""
    return CedarEngine(cfg, base_dir=base_dir)


def cedar_problems(cfg: CedarGate, at: str, *, base_dir: str) -> list[Problem]:
    """The located problems of a ``cedar`` gate: files that cannot be read, policies Cedar does not parse,
    policies that do not fit the schema."""
    problems: list[Problem] = []
    if cfg.policies is not None and cfg.policy_dir is not None:
        problems.append(Problem(at, ErrorCode.INVALID_CONFIG, "set `policies` or `policy_dir`, not both"))
        return problems
    for i, rt in enumerate(cfg.resource_types):
        if not rt.resource_type:
            problems.append(
                Problem(f"{at}.resource_types[{i}].resource_type", ErrorCode.INVALID_CONFIG, "must not be empty")
            )
        if rt.resource_id not in ("tool", "") and not rt.resource_id.startswith("/"):
            problems.append(
                Problem(
                    f"{at}.resource_types[{i}].resource_id",
                    ErrorCode.INVALID_CONFIG,
                    "is `tool` or a JSON pointer (`/account`)",
                )
            )
    points = [rt.decision_point for rt in cfg.resource_types]
    if len(set(points)) != len(points):
        problems.append(Problem(f"{at}.resource_types", ErrorCode.INVALID_CONFIG, "declares a decision point twice"))
    if problems:
        return problems
    where = at + (".policies" if cfg.policies is not None else ".policy_dir" if cfg.policy_dir is not None else "")
    try:
        load_cedar(cfg, base_dir=base_dir)
    except OSError as exc:
        problems.append(Problem(where, ErrorCode.INVALID_CONFIG, f"cannot read: {exc.strerror or exc}"))
    except ValueError as exc:
        problems.append(Problem(where, ErrorCode.INVALID_CONFIG, f"Cedar refuses it: {' '.join(str(exc).split())}"))
    return problems
