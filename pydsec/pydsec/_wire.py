"""What the blocking transport (_http.py) and the asyncio one (_aio_http.py) share: endpoints, request headers,
query strings, and the failover rule (which endpoint a request tries next, and when it may not move on).

Failover: a transport sticks to the endpoint that last worked and moves on to the next, in order, when a
connection to it cannot be made (ConnectFailedError: nothing was sent, so any request may go elsewhere). A
request that went out and then lost its connection moves on only for the idempotent methods; a POST (create,
exec, pause...) may have reached the server and is not sent twice.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple
from urllib.parse import quote, urlsplit

from .errors import DsecConnectionError

USER_AGENT = "pydsec/0.1"
IDEMPOTENT = frozenset(("GET", "HEAD", "PUT", "DELETE", "OPTIONS"))

Query = Sequence[Tuple[str, Any]]


class ConnectFailedError(DsecConnectionError):
    """No connection could be made to any endpoint of a Transport: the request was not sent anywhere."""


def encode_query(query: Optional[Query]) -> str:
    if not query:
        return ""
    return "?" + "&".join(f"{quote(str(k), safe='')}={quote(str(v), safe='/=:,')}" for k, v in query)


class Target:
    """One endpoint, parsed."""

    def __init__(self, endpoint: str):
        parts = urlsplit(endpoint)
        self.https = parts.scheme == "https"
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if self.https else 80)
        self.prefix = parts.path.rstrip("/")
        self.endpoint = endpoint

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == (443 if self.https else 80) else f"{host}:{self.port}"


def base_headers(token: str, extra: Optional[Dict[str, str]], content_length: Optional[int]) -> Dict[str, str]:
    """The headers of every request: the bearer token, our user agent, the body's length when it has one."""
    headers = {"Authorization": f"Bearer {token}", "User-Agent": USER_AGENT, "Accept": "*/*"}
    if content_length is not None:
        headers["Content-Length"] = str(content_length)
    if extra:
        headers.update(extra)
    return headers


def json_body(payload: Any) -> Tuple[Optional[bytes], Optional[Dict[str, str]]]:
    """(body, headers) of a JSON request; (None, None) for no payload."""
    if payload is None:
        return None, None
    return json.dumps(payload).encode("utf-8"), {"Content-Type": "application/json"}


class Failover:
    """One request's walk over a transport's endpoints (see the module doc).

        walk = Failover(method, path, transport_current, len(targets))
        for step, index in walk:
            try: ... send to index ...
            except ConnectFailedError as e: walk.connect_failed(e); continue
            except DsecConnectionError as e: walk.lost(e, step); continue   # re-raises when it may not move on
            return ...
        raise walk.exhausted()
    """

    def __init__(self, method: str, path: str, start: int, count: int):
        self.method = method
        self.path = path
        self.start = start
        self.count = count
        self.failures: List[str] = []

    def __iter__(self) -> Iterator[Tuple[int, int]]:
        for step in range(self.count):
            yield step, (self.start + step) % self.count

    def connect_failed(self, e: Exception) -> None:
        self.failures.append(str(e))

    def lost(self, e: DsecConnectionError, step: int) -> None:
        """Sent, then the connection failed: only an idempotent request may go to the next endpoint."""
        if self.method.upper() not in IDEMPOTENT or step + 1 == self.count:
            raise e
        self.failures.append(str(e))

    def exhausted(self) -> ConnectFailedError:
        if self.count == 1:
            return ConnectFailedError(self.failures[0])
        return ConnectFailedError(f"{self.method} {self.path}: no endpoint of the dsec fleet answers: " +
                                  "; ".join(self.failures))
