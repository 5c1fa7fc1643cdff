"""A small thread-safe keep-alive HTTP/1.1 transport over http.client.

Each connection is used by one thread at a time: a request takes an idle connection from the pool (or opens a
new one; the number of connections in use is not capped, so many threads can work at once) and gives it back
once the response has been read to its end. A connection that went stale while idle (the server closed it)
fails on first use; such a request is retried once on a fresh connection.

Failover: a Transport may have several endpoints (a fleet's gateway candidates); the rule of which one a request
tries and when it may move on is _wire.Failover's, shared with the asyncio transport. A connection fails "before
sending" when it cannot be made (refused, unreachable, or no connect within ``connect_timeout``). A request that
times out waiting for its answer is never retried.
"""

from __future__ import annotations

import http.client
import json
import os
import select
import socket
import threading
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from ._wire import USER_AGENT, ConnectFailedError, Failover, Query, Target, base_headers, encode_query, json_body
from .errors import DsecConnectionError, DsecError, DsecTimeoutError, ServerError, error_from_response

__all__ = ["USER_AGENT", "ConnectFailedError", "Query", "Body", "Response", "Transport", "encode_query", "call_json",
           "iter_lines"]

_DEFAULT = object()  # "use the transport's default timeout"; None means "no timeout"
_BLOCKSIZE = 256 * 1024

# Errors that mean "the server closed this keep-alive connection while it sat idle in the pool".
_STALE_ERRORS = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError, ConnectionAbortedError,
                 http.client.BadStatusLine)

Body = Union[None, bytes, Any]  # bytes or a binary file object


def _peer_closed(sock: socket.socket) -> bool:
    """An idle keep-alive socket that is readable has been closed by the server (or is out of sync): drop it
    before sending, rather than relying on the retry after a failed request."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


class Response:
    """A response whose body is read incrementally. Give the connection back by reading to the end or close()."""

    def __init__(self, transport: "Transport", conn: http.client.HTTPConnection, resp: http.client.HTTPResponse):
        self._transport = transport
        self._conn: Optional[http.client.HTTPConnection] = conn
        self._resp = resp
        self.status = resp.status
        self.headers = resp.headers

    def _finish_if_done(self, got_data: bool) -> None:
        if not got_data and self._conn is not None:
            conn, self._conn = self._conn, None
            try:
                # read1() does not mark a Content-Length response as finished when it hits the end; read()
                # does (and returns b"" here). Only a finished response leaves the connection reusable.
                self._resp.read()
            except (OSError, http.client.HTTPException):
                pass
            if self._resp.isclosed():
                self._transport._release(conn)
            else:
                self._resp.close()
                conn.close()

    def read(self, n: int = -1) -> bytes:
        if self._conn is None:
            return b""
        try:
            if n is None or n < 0:
                data = self._resp.read()
                self._finish_if_done(False)
                return data
            data = self._resp.read1(n) if n > 0 else b""
        except socket.timeout:
            self.close()
            raise DsecTimeoutError("timed out reading the response", status=None) from None
        except (OSError, http.client.HTTPException) as e:
            self.close()
            raise DsecConnectionError(f"connection lost while reading the response: {e}") from None
        self._finish_if_done(bool(data) or n == 0)
        return data

    def readline(self) -> bytes:
        if self._conn is None:
            return b""
        try:
            line = self._resp.readline()
        except socket.timeout:
            self.close()
            raise DsecTimeoutError("timed out reading the response stream") from None
        except (OSError, http.client.HTTPException) as e:
            self.close()
            raise DsecConnectionError(f"connection lost while reading the response stream: {e}") from None
        self._finish_if_done(bool(line))
        return line

    def json(self) -> Any:
        data = self.read()
        try:
            return json.loads(data.decode("utf-8")) if data else None
        except (UnicodeDecodeError, ValueError):
            raise ServerError(f"server sent invalid JSON: {data[:200]!r}", status=self.status) from None

    def close(self) -> None:
        """Abandon the rest of the body: the connection is closed rather than pooled."""
        if self._conn is not None:
            conn, self._conn = self._conn, None
            try:
                self._resp.close()
            finally:
                conn.close()

    def __enter__(self) -> "Response":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Transport:
    def __init__(self, endpoint: Union[str, Sequence[str]], token: str, timeout: Optional[float] = 60.0,
                 max_idle: int = 32, connect_timeout: Optional[float] = 5.0):
        endpoints = [endpoint] if isinstance(endpoint, str) else list(endpoint)
        if not endpoints:
            raise ValueError("a Transport needs an endpoint")
        self._targets = [Target(e) for e in endpoints]
        self._current = 0  # the endpoint that last worked
        self._token = token
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._max_idle = max_idle
        self._idle: List[Tuple[int, http.client.HTTPConnection]] = []
        self._lock = threading.Lock()
        self._closed = False

    @property
    def endpoint(self) -> str:
        """The endpoint requests go to now (the one that last worked)."""
        return self._targets[self._current].endpoint

    @property
    def endpoints(self) -> List[str]:
        return [t.endpoint for t in self._targets]

    # -- pool ---------------------------------------------------------------------------------------------
    def _new_connection(self, index: int) -> http.client.HTTPConnection:
        t = self._targets[index]
        if t.https:
            return http.client.HTTPSConnection(t.host, t.port, timeout=self.timeout, blocksize=_BLOCKSIZE)
        return http.client.HTTPConnection(t.host, t.port, timeout=self.timeout, blocksize=_BLOCKSIZE)

    def _acquire(self, index: int) -> Tuple[http.client.HTTPConnection, bool]:
        # A closed transport still serves requests (e.g. a late cleanup) but no longer keeps connections.
        stale: List[http.client.HTTPConnection] = []
        found = None
        with self._lock:
            while self._idle and found is None:
                owner, conn = self._idle.pop()
                if owner == index and conn.sock is not None and not _peer_closed(conn.sock):
                    found = conn
                else:
                    stale.append(conn)  # another endpoint's (we moved on) or closed by the server
        for conn in stale:
            conn.close()
        if found is not None:
            return found, True
        return self._new_connection(index), False

    def _release(self, conn: http.client.HTTPConnection) -> None:
        index = getattr(conn, "_pydsec_target", 0)
        with self._lock:
            if not self._closed and conn.sock is not None and len(self._idle) < self._max_idle:
                self._idle.append((index, conn))
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for _, conn in idle:
            conn.close()

    # -- requests -----------------------------------------------------------------------------------------
    def _headers(self, extra: Optional[Dict[str, str]], body: Body) -> Dict[str, str]:
        if body is None:
            length = None
        elif isinstance(body, (bytes, bytearray, memoryview)):
            length = len(body)
        else:
            # A file object: send it with a Content-Length so that the server can stream it to disk.
            length = max(0, os.fstat(body.fileno()).st_size - body.tell())
        return base_headers(self._token, extra, length)

    @staticmethod
    def _set_timeout(conn: http.client.HTTPConnection, timeout: Optional[float]) -> None:
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)

    def _send_once(self, conn: http.client.HTTPConnection, method: str, url: str, body: Body,
                   headers: Dict[str, str]) -> http.client.HTTPResponse:
        try:
            conn.request(method, url, body=body, headers=headers)
        except (BrokenPipeError, ConnectionResetError):
            # The server may have answered early (e.g. 401 or 413) and closed while we were still sending the
            # body; its response is then already in our receive buffer.
            if conn.sock is None:
                raise
            return conn.getresponse()
        return conn.getresponse()

    def _connect(self, conn: http.client.HTTPConnection, index: int) -> None:
        """Opens a new connection within connect_timeout; OSError when it cannot be made (nothing was sent)."""
        conn._pydsec_target = index  # type: ignore[attr-defined]
        conn.timeout = self.connect_timeout
        conn.connect()

    def request(self, method: str, path: str, query: Optional[Query] = None, body: Body = None,
                headers: Optional[Dict[str, str]] = None, timeout: Any = _DEFAULT) -> Response:
        """Send a request and return the response with its body unread. Raises the mapped DsecError for non-2xx.

        Tries the endpoints from the one that last worked on, as the module doc says."""
        if timeout is _DEFAULT:
            timeout = self.timeout
        all_headers = self._headers(headers, body)
        rewind = None
        if body is not None and not isinstance(body, (bytes, bytearray, memoryview)):
            rewind = body.tell()
        walk = Failover(method, path, self._current, len(self._targets))
        for step, index in walk:
            try:
                resp = self._request_on(index, method, path, query, body, all_headers, timeout, rewind)
            except ConnectFailedError as e:
                walk.connect_failed(e)
                continue
            except DsecConnectionError as e:
                walk.lost(e, step)
                continue
            if index != self._current:
                self._current = index  # stick to the endpoint that works
            return resp
        raise walk.exhausted()

    def _request_on(self, index: int, method: str, path: str, query: Optional[Query], body: Body,
                    all_headers: Dict[str, str], timeout: Any, rewind: Optional[int]) -> Response:
        target = self._targets[index]
        url = target.prefix + path + encode_query(query)
        endpoint = target.endpoint
        for attempt in (0, 1):
            conn, reused = self._acquire(index)
            if not reused:
                try:
                    self._connect(conn, index)
                except OSError as e:  # refused, unreachable, or socket.timeout: the request never left
                    conn.close()
                    raise ConnectFailedError(f"cannot reach the dsec fleet at {endpoint}: {e or 'timed out'}") \
                        from None
            self._set_timeout(conn, timeout)
            if rewind is not None:
                body.seek(rewind)
            try:
                resp = self._send_once(conn, method, url, body, all_headers)
            except socket.timeout:
                conn.close()
                raise DsecTimeoutError(f"{method} {path}: no response from {endpoint} within {timeout} s") \
                    from None
            except _STALE_ERRORS as e:
                conn.close()
                if reused and attempt == 0:
                    continue
                raise DsecConnectionError(f"{method} {path}: connection to {endpoint} lost: {e}") from None
            except OSError as e:
                conn.close()
                raise DsecConnectionError(f"{method} {path}: connection to {endpoint} failed: {e}") from None
            except http.client.HTTPException as e:
                conn.close()
                raise ServerError(f"{method} {path}: bad HTTP response from {endpoint}: {e!r}") from None
            response = Response(self, conn, resp)
            if not 200 <= resp.status < 300:
                try:
                    data = response.read()
                except DsecError:
                    data = b""
                raise error_from_response(resp.status, data, resp.headers)
            return response
        raise AssertionError("unreachable")

    def call(self, method: str, path: str, query: Optional[Query] = None, payload: Any = None,
             timeout: Any = _DEFAULT) -> Any:
        """A JSON request/response round trip."""
        return call_json(self.request, method, path, query, payload, timeout)


def iter_lines(response: Response) -> Iterable[bytes]:
    while True:
        line = response.readline()
        if not line:
            return
        yield line


def call_json(request: Callable[..., "Response"], method: str, path: str, query: Optional[Query], payload: Any,
              timeout: Any) -> Any:
    """A JSON request/response round trip through `request` (a transport's request method)."""
    body, headers = json_body(payload)
    return request(method, path, query, body, headers, timeout).json()
