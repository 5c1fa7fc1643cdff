"""Exceptions raised by pydsec.

Every error derives from :class:`DsecError`, which carries the API error ``code`` (see docs/api.md), the HTTP
``status`` (``None`` for errors raised before a request reached the server) and a human readable ``message``.

The errors fall in two families, so that a trainer can tell a rollout the platform lost from one the policy
failed (docs/fleet.md, "Masking rollouts lost to the infrastructure")::

    DsecError
    |-- InvalidRequestError, TooLargeError   the caller's request is wrong (a bug in the caller: fix it)
    |-- AuthError, NotFoundError, ConflictError, UnsupportedError
    `-- InfraError                           the platform failed; the request and the sandbox's code did not
        |-- CapacityError                    no room now (429); retry_after
        |-- DsecTimeoutError                 the platform did not finish in time (504, 408, no answer)
        |-- DsecConnectionError              the endpoint cannot be reached, or the connection broke
        `-- ServerError                      500 internal, a malformed answer
            `-- UnavailableError             503: the fleet or node cannot serve now; retry_after
                `-- NodeLostError            the sandbox's node is lost or not answering (node, node_state)

What the sandbox's own code does is never an exception: a non-zero exit, a command over its exec timeout
(``timed_out``) and an OOM kill of user code (``oom_killed``) are fields of the ExecResult.

Two classes also derive from the matching builtin, so generic handlers keep working without pydsec shadowing
builtin names: :class:`DsecTimeoutError` is a ``TimeoutError`` and :class:`DsecConnectionError` is a
``ConnectionError``. Neither is exported under the builtin's name.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Optional

__all__ = [
    "DsecError",
    "InfraError",
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
    "UnavailableError",
    "NodeLostError",
    "error_from_code",
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


class UnsupportedError(DsecError):
    """501 ``unsupported``: the host lacks a kernel feature for that backend."""

    default_code = "unsupported"


class InfraError(DsecError):
    """The platform failed this request: the request was valid and the sandbox's code is not at fault.

    A rollout that ends in an InfraError says nothing about the policy: mask it out of the reward statistics
    (and retry it if you like). ``retry_after`` is the server's hint in seconds, or None.
    """

    default_code = "infrastructure"

    def __init__(self, message: str, code: Optional[str] = None, status: Optional[int] = None,
                 retry_after: Optional[float] = None):
        super().__init__(message, code, status)
        self.retry_after = retry_after


class CapacityError(InfraError):
    """429 ``capacity`` (the node or fleet has no room) or ``too_many_connections``. See ``retry_after``."""

    default_code = "capacity"


class DsecTimeoutError(InfraError, TimeoutError):
    """504 ``timeout`` (a platform operation ran out of time), 408 ``request_timeout``, or the client gave up
    waiting for a response.

    Note: a command that exceeds its exec timeout is *not* an error; its ExecResult has ``timed_out=True``.
    """

    default_code = "timeout"


class ServerError(InfraError):
    """500 ``internal`` (or any other unexpected server response)."""

    default_code = "internal"


class DsecConnectionError(InfraError, ConnectionError):
    """The fleet endpoint cannot be reached (refused, reset, DNS...), or the connection broke mid-answer."""

    default_code = "connection"


class UnavailableError(ServerError):
    """503 ``unavailable``: the fleet or node cannot serve the request now (connection cap, no live node, a
    node that has not registered yet). See ``retry_after``."""

    default_code = "unavailable"


class NodeLostError(UnavailableError):
    """The node of the sandbox is gone: the gateway's 503 naming ``node_state`` ``"lost"`` (declared lost after
    missing its heartbeats) or ``"unreachable"`` (it did not answer this request; it may come back, or be
    declared lost within the gateway's --lost-after seconds).

    ``node`` is the node's name and ``sandbox_id`` the sandbox the request named (or None).
    """

    default_code = "unavailable"

    def __init__(self, message: str, code: Optional[str] = None, status: Optional[int] = None,
                 retry_after: Optional[float] = None, node: Optional[str] = None,
                 node_state: Optional[str] = None, sandbox_id: Optional[str] = None):
        super().__init__(message, code, status, retry_after)
        self.node = node
        self.node_state = node_state
        self.sandbox_id = sandbox_id


_BY_CODE = {
    "invalid_request": InvalidRequestError,
    "too_large": TooLargeError,
    "unauthorized": AuthError,
    "not_found": NotFoundError,
    "conflict": ConflictError,
    "capacity": CapacityError,
    "too_many_connections": CapacityError,
    "unsupported": UnsupportedError,
    "timeout": DsecTimeoutError,
    "request_timeout": DsecTimeoutError,
    "unavailable": UnavailableError,
    "internal": ServerError,
}

_BY_STATUS = {
    400: InvalidRequestError,
    401: AuthError,
    403: AuthError,
    404: NotFoundError,
    408: DsecTimeoutError,
    409: ConflictError,
    413: TooLargeError,
    429: CapacityError,
    501: UnsupportedError,
    503: UnavailableError,
    504: DsecTimeoutError,
}

# The gateway's node_state on a 503 for a sandbox whose node is gone (docs/fleet.md, "Lost nodes").
NODE_GONE_STATES = ("lost", "unreachable")


def _parse_retry_after(value: Any) -> Optional[float]:
    if value is None or isinstance(value, bool):
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return seconds if seconds >= 0 else None


def _text(value: Any) -> Optional[str]:
    return value if isinstance(value, str) and value else None


def error_from_code(status: Optional[int], code: Optional[str], message: str,
                    detail: Optional[Mapping[str, Any]] = None, retry_after: Optional[float] = None) -> DsecError:
    """The exception for an API error: the error ``code`` wins, the HTTP ``status`` is the fallback.

    ``detail`` is the rest of the API's error object; a ``node_state`` of ``lost`` or ``unreachable`` (the
    gateway's answer for a sandbox whose node is gone) makes a NodeLostError.
    """
    detail = detail or {}
    if retry_after is None:
        retry_after = _parse_retry_after(detail.get("retry_after"))
    cls = _BY_CODE.get(code or "")
    if cls is None and status is not None:
        cls = _BY_STATUS.get(status)
    if cls is None:
        cls = ServerError if status is None or status >= 500 else DsecError
    node_state = detail.get("node_state")
    if issubclass(cls, UnavailableError) and node_state in NODE_GONE_STATES:
        cls = NodeLostError
    if code is None:
        code = cls.default_code if cls is not DsecError else f"http_{status}"
    if cls is NodeLostError:
        return NodeLostError(message, code, status, retry_after, node=_text(detail.get("node")),
                             node_state=node_state, sandbox_id=_text(detail.get("sandbox")))
    if issubclass(cls, InfraError):
        return cls(message, code, status, retry_after)
    return cls(message, code, status)


def error_from_response(status: int, body: bytes, headers: Optional[Mapping[str, str]] = None) -> DsecError:
    """Build the exception for a non-2xx response: the API's error code wins, the HTTP status is the fallback."""
    code: Optional[str] = None
    message: Optional[str] = None
    detail: Mapping[str, Any] = {}
    try:
        doc = json.loads(body.decode("utf-8")) if body else None
    except (UnicodeDecodeError, ValueError):
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
        detail = doc["error"]
        if isinstance(detail.get("code"), str):
            code = detail["code"]
        if isinstance(detail.get("message"), str):
            message = detail["message"]
    if message is None:
        text = body.decode("utf-8", errors="replace").strip() if body else ""
        message = text[:500] if text else f"HTTP {status} with no error body"
    retry_after = _parse_retry_after(detail.get("retry_after"))
    if retry_after is None and headers is not None:
        retry_after = _parse_retry_after(headers.get("Retry-After"))
    return error_from_code(status, code, message, detail, retry_after)
