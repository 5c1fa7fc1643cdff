"""Exceptions raised by pydsec.

Every error derives from :class:`DsecError`, which carries the API error ``code`` (see docs/api.md), the HTTP
``status`` (``None`` for errors raised before a request reached the server) and a human readable ``message``.

Two classes also derive from the matching builtin, so generic handlers keep working without pydsec shadowing
builtin names: :class:`DsecTimeoutError` is a ``TimeoutError`` and :class:`DsecConnectionError` is a
``ConnectionError``. Neither is exported under the builtin's name.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Optional

__all__ = [
    "DsecError",
    "InvalidRequestError",
    "TooLargeError",
    "AuthError",
    "NotFoundError",
    "ConflictError",
    "CapacityError",
    "UnsupportedError",
    "DsecTimeoutError",
    "ServerError",
    "DsecConnectionError",
    "error_from_response",
]


class DsecError(Exception):
    """Base class of every pydsec error."""

    default_code = "error"

    def __init__(self, message: str, code: Optional[str] = None, status: Optional[int] = None):
        super().__init__(message)
        self.message = message
        self.code = code if code is not None else self.default_code
        self.status = status

    def __str__(self) -> str:
        if self.status is not None:
            return f"{self.message} (HTTP {self.status} {self.code})"
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, status={self.status!r}, message={self.message!r})"


class InvalidRequestError(DsecError):
    """400 ``invalid_request``, or an argument rejected client-side before any request."""

    default_code = "invalid_request"


class TooLargeError(InvalidRequestError):
    """413 ``too_large``: the request body is over the route's limit."""

    default_code = "too_large"


class AuthError(DsecError):
    """401 ``unauthorized``: missing or wrong token."""

    default_code = "unauthorized"


class NotFoundError(DsecError):
    """404 ``not_found``: unknown sandbox, image layer, file or route."""

    default_code = "not_found"


class ConflictError(DsecError):
    """409 ``conflict``: wrong state for the request (e.g. a layer that already exists)."""

    default_code = "conflict"


class CapacityError(DsecError):
    """429 ``capacity``: the node has no room. ``retry_after`` is the server's hint in seconds (or None)."""

    default_code = "capacity"

    def __init__(self, message: str, code: Optional[str] = None, status: Optional[int] = None,
                 retry_after: Optional[float] = None):
        super().__init__(message, code, status)
        self.retry_after = retry_after


class UnsupportedError(DsecError):
    """501 ``unsupported``: the host lacks a kernel feature for that backend."""

    default_code = "unsupported"


class DsecTimeoutError(DsecError, TimeoutError):
    """504 ``timeout`` from the server, or the client gave up waiting for a response.

    Note: a command that exceeds its exec timeout is *not* an error; its ExecResult has ``timed_out=True``.
    """

    default_code = "timeout"


class ServerError(DsecError):
    """500 ``internal`` (or any other unexpected server response)."""

    default_code = "internal"


class DsecConnectionError(DsecError, ConnectionError):
    """The fleet endpoint cannot be reached (refused, reset, DNS...)."""

    default_code = "connection"


_BY_CODE = {
    "invalid_request": InvalidRequestError,
    "too_large": TooLargeError,
    "unauthorized": AuthError,
    "not_found": NotFoundError,
    "conflict": ConflictError,
    "capacity": CapacityError,
    "unsupported": UnsupportedError,
    "timeout": DsecTimeoutError,
    "internal": ServerError,
}

_BY_STATUS = {
    400: InvalidRequestError,
    401: AuthError,
    403: AuthError,
    404: NotFoundError,
    409: ConflictError,
    413: TooLargeError,
    429: CapacityError,
    501: UnsupportedError,
    504: DsecTimeoutError,
}


def _parse_retry_after(value: Any) -> Optional[float]:
    if value is None or isinstance(value, bool):
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return seconds if seconds >= 0 else None


def error_from_response(status: int, body: bytes, headers: Optional[Mapping[str, str]] = None) -> DsecError:
    """Build the exception for a non-2xx response: the API's error code wins, the HTTP status is the fallback."""
    code: Optional[str] = None
    message: Optional[str] = None
    retry_after: Optional[float] = None
    try:
        doc = json.loads(body.decode("utf-8")) if body else None
    except (UnicodeDecodeError, ValueError):
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
        err = doc["error"]
        if isinstance(err.get("code"), str):
            code = err["code"]
        if isinstance(err.get("message"), str):
            message = err["message"]
        retry_after = _parse_retry_after(err.get("retry_after"))
    if message is None:
        text = body.decode("utf-8", errors="replace").strip() if body else ""
        message = text[:500] if text else f"HTTP {status} with no error body"
    if retry_after is None and headers is not None:
        retry_after = _parse_retry_after(headers.get("Retry-After"))

    cls = _BY_CODE.get(code or "")
    if cls is None:
        cls = _BY_STATUS.get(status)
    if cls is None:
        cls = ServerError if status >= 500 else DsecError
    if code is None:
        code = cls.default_code if cls is not DsecError else f"http_{status}"
    if cls is CapacityError:
        return CapacityError(message, code, status, retry_after=retry_after)
    return cls(message, code, status)
