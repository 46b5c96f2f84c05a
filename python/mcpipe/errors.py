"""The one exception hierarchy of mcpipe.

Every error a user can cause carries a stable ``code`` (the error codes of the pipeline contract) and a
location naming where in their input it is, written like ``steps[2].parallel[0].args.url``.

The Rust core raises :class:`TemplateSyntaxError` and :class:`InterpolationError` from here, so there is
one hierarchy whether an error starts in Rust or in Python.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import msgspec

__all__ = [
    "ConfigError",
    "ErrorCode",
    "ExpressionError",
    "InterpolationError",
    "MCPipeError",
    "OutputTooLargeError",
    "Problem",
    "SpecError",
    "TemplateSyntaxError",
    "UnknownToolError",
]


class ErrorCode(StrEnum):
    """The stable error codes of the pipeline contract (section 6) and of mcpipe's own answers.

    A ``StrEnum``: each member is its string, so answers, audit records and JSON carry the plain code.
    """

    INVALID_SPEC = "INVALID_SPEC"
    INVALID_CONFIG = "INVALID_CONFIG"
    INVALID_OUTPUT = "INVALID_OUTPUT"
    LIMIT_EXCEEDED = "LIMIT_EXCEEDED"
    UNKNOWN_TOOL = "UNKNOWN_TOOL"
    FORBIDDEN = "FORBIDDEN"
    INTERPOLATION_FAILED = "INTERPOLATION_FAILED"
    TOOL_ERROR = "TOOL_ERROR"
    TOOL_FAILED = "TOOL_FAILED"
    GATE_REJECTED = "GATE_REJECTED"
    TIMEOUT = "TIMEOUT"
    OUTPUT_TOO_LARGE = "OUTPUT_TOO_LARGE"
    CANCELLED = "CANCELLED"
    SUSPENDED = "SUSPENDED"
    INTERNAL = "INTERNAL"


class MCPipeError(Exception):
    """Base class of every error mcpipe raises on purpose.

    Attributes:
        code: the error code a step that fails with it answers.
        retryable: the call may succeed if made again (the transport failed, the server is down): a tool
            step with ``retry`` makes it again.
    """

    code: str = ErrorCode.INTERNAL
    retryable: bool = False

    def step_fields(self) -> dict[str, Any]:
        """Structured facts a failed step's result carries beside ``error`` and ``error_code`` (none here;
        a downstream server's JSON-RPC error adds ``jsonrpc_error``)."""
        return {}


class TemplateSyntaxError(MCPipeError, ValueError):
    """A template that cannot be compiled: a bad placeholder, path, ``$ref`` or root.

    Attributes:
        location: where in the template (``args.items[2]``), prefixed by the location the template was
            compiled under; ``""`` for the template's root.
        reason: what is wrong, e.g. ``\\`${\\` has no closing \\`}\\` (character 5)``.
    """

    code = ErrorCode.INVALID_SPEC

    def __init__(self, reason: str, location: str = "") -> None:
        self.reason = reason
        self.location = location
        super().__init__(f"{location}: {reason}" if location else reason)


class InterpolationError(MCPipeError, LookupError):
    """A reference whose value is missing at run time (contract section 5).

    Attributes:
        reference: the normalized reference, e.g. ``steps.fetch.structured.content``.
        location: where in the template the reference is (``args.materials``).
        segment: the path segment that could not be followed (a key, an index, ``*`` or the root).
        found_type: the JSON type found where the segment was applied (``object``, ``array``,
            ``string``, ``number``, ``boolean``, ``null``, or ``environment`` for a missing root).
        found_keys: up to 10 keys of the object found there, else None.
        found_length: the length of the array (or the key count of the object) found there, else None.
        step: the id of the step whose arguments failed, filled in by the runtime (None in a bare resolve).
    """

    code = ErrorCode.INTERPOLATION_FAILED

    def __init__(
        self,
        reference: str,
        location: str,
        segment: str,
        found_type: str,
        found_keys: list[str] | None = None,
        found_length: int | None = None,
    ) -> None:
        self.reference = reference
        self.location = location
        self.segment = segment
        self.found_type = found_type
        self.found_keys = found_keys
        self.found_length = found_length
        self.step: str | None = None
        super().__init__(self._message())

    def _message(self) -> str:
        where = f"{self.location}: " if self.location else ""
        return f"{where}cannot resolve `{self.reference}`: `{self.segment}` not found in {self.describe_found()}"

    def describe_found(self) -> str:
        """Describe what was found where the failing segment was applied, for messages."""
        kind = self.found_type
        if kind in ("object", "environment"):
            keys = self.found_keys or []
            n = self.found_length if self.found_length is not None else len(keys)
            if n == 0:
                return f"empty {kind}"
            shown = ", ".join(_quote(k) for k in keys)
            more = ", ..." if n > len(keys) else ""
            return f"{kind} with {n} key{'s' if n != 1 else ''}: {shown}{more}"
        if kind == "array":
            return f"array of length {self.found_length}"
        return kind

    def with_step(self, step: str) -> InterpolationError:
        """Record the step whose arguments failed (and say so in the message)."""
        self.step = step
        self.args = (f"step '{step}': {self._message()}",)
        return self

    def to_dict(self) -> dict[str, Any]:
        """The error's facts as JSON-ready data (for step results and logs)."""
        return {
            "step": self.step,
            "location": self.location,
            "reference": self.reference,
            "segment": self.segment,
            "found_type": self.found_type,
            "found_keys": self.found_keys,
            "found_length": self.found_length,
        }


def _quote(key: str) -> str:
    return msgspec.json.encode(key).decode()


class OutputTooLargeError(MCPipeError, ValueError):
    """A value past a size limit: interpolated text, a step's output or a whole answer (issue 9).

    Nothing that large is built: the core measures before it allocates, the runtime before it keeps.

    Attributes:
        size: the size found, in bytes (a lower bound when the measure stopped at the limit).
        limit: the limit, in bytes.
        location: where (``steps[3].args.v``), or ``""``.
    """

    code = ErrorCode.OUTPUT_TOO_LARGE

    def __init__(
        self, size: int, limit: int, location: str = "", what: str = "the interpolated text", why: str = ""
    ) -> None:
        self.size = size
        self.limit = limit
        self.location = location
        where = f"{location}: " if location else ""
        super().__init__(f"{where}{what} {why or f'would be at least {size} bytes; the limit is {limit}'}")


class UnknownToolError(MCPipeError, LookupError):
    """A call to a tool name that no registry holds."""

    code = ErrorCode.UNKNOWN_TOOL

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"unknown tool '{name}'")


UNSET_ENV = "UNSET_ENV"
"""The code of a config problem that is only an environment variable the config reads and the environment
lacks, while the config is parsed: :func:`mcpipe.config.parse_config` turns it into ``INVALID_CONFIG``
(``mcpipe serve`` refuses the file) or, when asked for warnings (``mcpipe check``), into a warning."""

UNSET_ENV_PER_CALL = "UNSET_ENV_PER_CALL"
"""The code of an environment variable an mcpg binding reads and the environment lacks: the binding is served
and fails each call saying so (mcpg refuses to start). ``mcpipe check`` warns of it, located; ``mcpipe serve``
logs it once and serves the rest."""


class Problem(msgspec.Struct, frozen=True):
    """One problem found while validating a spec or a config.

    Attributes:
        location: where it is (``steps[2].parallel[0].args.url``; ``""`` for the whole document).
        code: the error code (``INVALID_SPEC``, ``UNKNOWN_TOOL``, ``FORBIDDEN``, ``LIMIT_EXCEEDED``).
        message: what is wrong, in a sentence.
    """

    location: str
    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.location}: {self.message}" if self.location else self.message


class SpecError(MCPipeError, ValueError):
    """A spec (or config) that failed validation; ``problems`` lists every problem found, not only the
    first. ``code`` is the code of the first problem."""

    def __init__(self, problems: list[Problem]) -> None:
        if not problems:
            raise ValueError("SpecError needs at least one problem")
        self.problems = list(problems)
        self.code = problems[0].code
        lines = [str(p) for p in problems]
        head = lines[0] if len(lines) == 1 else f"{len(lines)} problems:\n  " + "\n  ".join(lines)
        super().__init__(head)


class ConfigError(SpecError):
    """A config file that cannot be used; ``problems`` lists every problem found, each located.

    Attributes:
        unreadable: the file itself could not be read (missing, unreadable, a name no format goes with), as
            opposed to a file read whose content has problems (``mcpipe check --config`` exits 2, not 1).
    """

    def __init__(self, problems: list[Problem], *, unreadable: bool = False) -> None:
        super().__init__(problems)
        self.unreadable = unreadable


class ExpressionError(MCPipeError):
    """An expression (CEL, JSONata, a plugin) that failed while evaluating.

    Attributes:
        missing: True when it failed because a value was absent (an unknown key, an undefined variable):
            the step fails with ``INTERPOLATION_FAILED`` then, else with ``TOOL_FAILED``.
        timeout: True when it ran past the expression deadline (``pipe.expression_timeout_ms``).
        code: the code of a step that fails with this error: ``TIMEOUT``, ``INTERPOLATION_FAILED`` (a
            missing value) or ``TOOL_FAILED``.
    """

    code = ErrorCode.TOOL_FAILED

    def __init__(self, message: str, *, missing: bool = False, timeout: bool = False) -> None:
        super().__init__(message)
        self.missing = missing
        self.timeout = timeout
        self.code = (
            ErrorCode.TIMEOUT if timeout else ErrorCode.INTERPOLATION_FAILED if missing else ErrorCode.TOOL_FAILED
        )
