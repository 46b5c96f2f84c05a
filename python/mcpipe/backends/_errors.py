"""The one error every backend raises, with the step error code it maps to."""

from __future__ import annotations

__all__ = ["BackendError"]


class BackendError(Exception):
    """A backend operation failed.

    Attributes:
        code: the step's error code: ``TOOL_FAILED`` (the server could not be reached or the request not
            made; the default), ``TOOL_ERROR`` (the server answered with an error), ``TIMEOUT``. A subclass
            may change the default.
    """

    code: str = "TOOL_FAILED"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
