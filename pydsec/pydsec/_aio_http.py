"""A keep-alive HTTP/1.1 transport on asyncio's own streams (no thread per request), for pydsec.aio.

Requests in flight: every request of a client takes a slot of its InFlight limit before it opens or borrows a
connection and gives it back once its response has been read to the end or abandoned, so an open exec stream
holds its slot until it ends. Over the limit a request waits for a slot (in arrival order); nothing is dropped.

Connections: one pool per endpoint, at most ``max_idle`` idle connections each. A request borrows an idle
connection (or opens one within ``connect_timeout``) and gives it back once the response has been read to its
end; a response that is abandoned, times out or is cancelled closes its connection instead. A borrowed
connection the server had closed while it sat idle fails on first use: such a request is sent again once, on a
new connection. Which endpoint a request goes to, and when it moves on to the next, is _wire.Failover's rule,
the same as the blocking transport's (_http.py).

Timeouts: ``timeout`` bounds each wait on the connection (for the response head, then for each read of the
body), as the blocking transport's socket timeout does; None waits forever.

Responses: status line and headers, then a body framed by Content-Length, chunked transfer coding, or the end
of the connection; ``read(n)`` and ``readline()`` return data as it arrives.
"""

from __future__ import annotations

import asyncio
import collections
import http.client
import io
import json
import os
import ssl
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple, Union

from ._wire import ConnectFailedError, Failover, Query, Target, base_headers, encode_query, json_body
from .errors import DsecConnectionError, DsecError, DsecTimeoutError, ServerError, error_from_response

_DEFAULT = object()  # "use the transport's default timeout"; None means "no timeout"
_BLOCKSIZE = 256 * 1024
_HEAD_LIMIT = 64 * 1024  # status line and headers
_STREAM_LIMIT = 64 * 1024  # asyncio's reader buffer: it stops reading from the socket at twice this
# New connections of one transport that may be opening at once (connected, request head not yet sent). A node
# holds a client's connections that have not shown a valid token to a budget (64 by default; then queued, then
# 429 too_many_connections): a burst of thousands of requests must not open thousands of sockets before the
# first head goes out.
OPENING_AT_ONCE = 32

Body = Union[None, bytes, bytearray, memoryview, Any]  # bytes or a binary file object


class _BadResponse(Exception):
    """The server's answer is not HTTP/1.x."""


class _Stale(Exception):
    """The connection closed before any byte of the response (an idle keep-alive the server had closed)."""


class InFlight:
    """At most ``limit`` requests hold a slot at once; the rest wait for one, first come first served."""

    def __init__(self, limit: int):
        self.limit = limit
        self.count = 0  # slots held
        self._waiters: Deque["asyncio.Future[None]"] = collections.deque()  # each waits for a slot handed over
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self.generation = 0  # one per event loop: a slot of an earlier loop's gives nothing back when released

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def acquire(self) -> "_Slot":
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new event loop: the slots and waiters of the old one are gone with it
            self._loop = loop
            self.generation += 1
            self.count = 0
            self._waiters.clear()
        if self.count < self.limit and not self._waiters:
            self.count += 1
            return _Slot(self)
        waiter = loop.create_future()
        self._waiters.append(waiter)
        try:
            await waiter  # _release() handed its slot over: count already includes it
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._release()  # handed over just as we were cancelled: pass it on
            else:
                try:
                    self._waiters.remove(waiter)
                except ValueError:
                    pass
            raise
        return _Slot(self)

    def _release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes to the first in line
                return
        self.count -= 1


class _Slot:
    def __init__(self, limit: InFlight):
        self._limit: Optional[InFlight] = limit
        self._generation = limit.generation

    def release(self) -> None:
        limit, self._limit = self._limit, None
        if limit is not None and limit.generation == self._generation:
            limit._release()


class _Conn:
    def __init__(self, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.index = index
        self.reader = reader
        self.writer = writer

    def usable(self) -> bool:
        # An idle connection with something to read (EOF, or bytes nobody asked for) is closed or out of step.
        return not self.writer.is_closing() and not self.reader.at_eof() and not self.reader._buffer  # type: ignore

    def close(self) -> None:
        try:
            self.writer.close()
        except (OSError, RuntimeError):  # RuntimeError: its event loop is closed
            pass


async def _wait(aw: Any, timeout: Optional[float]) -> Any:
    if timeout is None:
        return await aw
    return await asyncio.wait_for(aw, timeout)


class AsyncResponse:
    """A response whose body is read as it arrives. Reading it to the end gives the connection back to the
    pool and the request's slot back to the client; close() abandons the rest (the connection is closed)."""

    def __init__(self, transport: "AsyncTransport", conn: _Conn, slot: _Slot, status: int,
                 headers: http.client.HTTPMessage, method: str, timeout: Optional[float], keep_alive: bool):
        self._transport = transport
        self._conn: Optional[_Conn] = conn
        self._slot: Optional[_Slot] = slot
        self.status = status
        self.headers = headers
        self._timeout = timeout
        self._keep_alive = keep_alive
        self._buf = bytearray()  # body bytes read from the connection, not yet returned
        self._chunked = "chunked" in (headers.get("Transfer-Encoding") or "").lower()
        self._left: Optional[int] = None  # body bytes (Content-Length) or bytes of the current chunk left
        self._crlf = False  # the CRLF after a chunk's data is still to be read
        self._eof = False
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            self._eof = True
        elif not self._chunked:
            length = headers.get("Content-Length")
            if length is not None:
                try:
                    self._left = int(length)
                except ValueError:
                    raise _BadResponse(f"bad Content-Length {length!r}") from None
                if self._left < 0:
                    raise _BadResponse(f"bad Content-Length {length!r}")
                self._eof = self._left == 0
            else:
                self._keep_alive = False  # the body ends with the connection
        if self._eof:
            self._finish()

    @property
    def finished(self) -> bool:
        return self._conn is None

    def _finish(self) -> None:
        """The body was read to its end: the connection goes back to the pool (or is closed)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            if self._keep_alive:
                self._transport._release(conn)
            else:
                conn.close()
        self._release_slot()

    def _release_slot(self) -> None:
        slot, self._slot = self._slot, None
        if slot is not None:
            slot.release()

    def close(self) -> None:
        """Abandon the rest of the body: the connection is closed rather than pooled."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
        self._eof = True
        self._release_slot()

    async def aclose(self) -> None:
        self.close()

    def __del__(self) -> None:
        # A response dropped unfinished must not hold its request slot (nor its socket) for ever.
        if self._conn is not None or self._slot is not None:
            try:
                self.close()
            except Exception:  # its event loop is gone  # noqa: BLE001
                pass

    async def _fill(self, n: int) -> bytes:
        """Up to n body bytes from the connection, at least one unless the body has ended (then b"")."""
        conn = self._conn
        if self._eof or conn is None:
            return b""
        reader = conn.reader
        try:
            if self._chunked:
                if self._crlf:
                    if await _wait(reader.readexactly(2), self._timeout) != b"\r\n":
                        raise _BadResponse("chunk not followed by CRLF")
                    self._crlf = False
                if not self._left:
                    line = await _wait(reader.readuntil(b"\r\n"), self._timeout)
                    try:
                        size = int(line.split(b";", 1)[0].strip(), 16)
                    except ValueError:
                        raise _BadResponse(f"bad chunk size line {line[:40]!r}") from None
                    if size == 0:
                        while (await _wait(reader.readuntil(b"\r\n"), self._timeout)) != b"\r\n":
                            pass  # trailers
                        self._eof = True
                        self._finish()
                        return b""
                    self._left = size
                data = await _wait(reader.read(min(n, self._left)), self._timeout)
                if not data:
                    raise asyncio.IncompleteReadError(b"", self._left)
                self._left -= len(data)
                self._crlf = self._left == 0
                return data
            if self._left is not None:
                data = await _wait(reader.read(min(n, self._left)), self._timeout)
                if not data:
                    raise asyncio.IncompleteReadError(b"", self._left)
                self._left -= len(data)
                if self._left == 0:
                    self._eof = True
                    self._finish()
                return data
            data = await _wait(reader.read(n), self._timeout)
            if not data:
                self._eof = True
                self._finish()
            return data
        except asyncio.TimeoutError:
            self.close()
            raise DsecTimeoutError("timed out reading the response", status=None) from None
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError) as e:
            self.close()
            raise DsecConnectionError(f"connection lost while reading the response: {e!r}") from None
        except _BadResponse as e:
            self.close()
            raise ServerError(f"bad HTTP response body: {e}") from None
        except BaseException:  # cancelled: the connection is mid-body, unusable
            self.close()
            raise

    async def read(self, n: int = -1) -> bytes:
        """The whole rest of the body (n < 0), or up to n bytes of it (b"" at its end)."""
        if n is None or n < 0:
            out = bytearray(self._buf)
            self._buf.clear()
            while True:
                data = await self._fill(_BLOCKSIZE)
                if not data:
                    return bytes(out)
                out += data
        if n == 0:
            return b""
        if self._buf:
            data = bytes(self._buf[:n])
            del self._buf[:n]
            return data
        return await self._fill(n)

    async def readline(self) -> bytes:
        """The next line with its b"\\n", the rest of the body at its end, b"" after it."""
        while True:
            i = self._buf.find(b"\n")
            if i >= 0:
                line = bytes(self._buf[:i + 1])
                del self._buf[:i + 1]
                return line
            data = await self._fill(_BLOCKSIZE)
            if not data:
                line = bytes(self._buf)
                self._buf.clear()
                return line
            self._buf += data

    async def json(self) -> Any:
        data = await self.read()
        try:
            return json.loads(data.decode("utf-8")) if data else None
        except (UnicodeDecodeError, ValueError):
            raise ServerError(f"server sent invalid JSON: {data[:200]!r}", status=self.status) from None

    async def __aenter__(self) -> "AsyncResponse":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()


class AsyncTransport:
    """Requests to one endpoint or, failing over, several (a fleet's gateways); see the module doc."""

    def __init__(self, endpoint: Union[str, Sequence[str]], token: str, in_flight: InFlight,
                 timeout: Optional[float] = 60.0, max_idle: int = 32, connect_timeout: Optional[float] = 5.0):
        endpoints = [endpoint] if isinstance(endpoint, str) else list(endpoint)
        if not endpoints:
            raise ValueError("a Transport needs an endpoint")
        self._targets = [Target(e) for e in endpoints]
        self._current = 0  # the endpoint that last worked
        self._token = token
        self._in_flight = in_flight
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._max_idle = max_idle
        self._idle: Dict[int, List[_Conn]] = {}
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._closed = False
        self._ssl: Optional[ssl.SSLContext] = None
        self._opening = InFlight(OPENING_AT_ONCE)

    @property
    def endpoint(self) -> str:
        return self._targets[self._current].endpoint

    @property
    def endpoints(self) -> List[str]:
        return [t.endpoint for t in self._targets]

    @property
    def idle_connections(self) -> int:
        return sum(len(c) for c in self._idle.values())

    # -- pool ---------------------------------------------------------------------------------------------
    def _on_loop(self) -> None:
        """Connections belong to the event loop that opened them: a client used from a new loop drops them."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._loop is not None:
                self._drop_idle()
            self._loop = loop

    def _drop_idle(self) -> None:
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()

    def _borrow(self, index: int) -> Optional[_Conn]:
        conns = self._idle.get(index)
        while conns:
            conn = conns.pop()
            if conn.usable():
                return conn
            conn.close()
        return None

    def _release(self, conn: _Conn) -> None:
        try:
            same_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            same_loop = False
        conns = self._idle.setdefault(conn.index, [])
        if self._closed or not same_loop or len(conns) >= self._max_idle or not conn.usable():
            conn.close()
            return
        conns.append(conn)

    def close(self) -> None:
        """Close the idle connections; requests still work afterwards (a late cleanup) but keep none."""
        self._closed = True
        self._drop_idle()

    async def _open(self, index: int) -> _Conn:
        t = self._targets[index]
        ctx = None
        if t.https:
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            ctx = self._ssl
        try:
            reader, writer = await _wait(asyncio.open_connection(t.host, t.port, ssl=ctx, limit=_STREAM_LIMIT),
                                         self.connect_timeout)
        except (OSError, asyncio.TimeoutError) as e:  # refused, unreachable, timed out: the request never left
            raise ConnectFailedError(f"cannot reach the dsec fleet at {t.endpoint}: {e or 'timed out'}") from None
        return _Conn(index, reader, writer)

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

    async def request(self, method: str, path: str, query: Optional[Query] = None, body: Body = None,
                      headers: Optional[Dict[str, str]] = None, timeout: Any = _DEFAULT) -> AsyncResponse:
        """Send a request and return the response with its body unread. Raises the mapped DsecError for non-2xx.
        Waits for a slot of the client's in-flight limit first."""
        self._on_loop()
        if timeout is _DEFAULT:
            timeout = self.timeout
        all_headers = self._headers(headers, body)
        rewind = None
        if body is not None and not isinstance(body, (bytes, bytearray, memoryview)):
            rewind = body.tell()
        slot = await self._in_flight.acquire()
        try:
            walk = Failover(method, path, self._current, len(self._targets))
            for step, index in walk:
                try:
                    resp = await self._request_on(index, method, path, query, body, all_headers, timeout, rewind,
                                                  slot)
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
        except BaseException:
            slot.release()  # no response holds it (a response that was made released it already)
            raise

    async def _send(self, conn: _Conn, head: bytes, body: Body, rewind: Optional[int],
                    opening: Optional[_Slot]) -> None:
        writer = conn.writer
        if body is None:
            writer.write(head)
        elif isinstance(body, (bytes, bytearray, memoryview)):
            writer.writelines((head, body))
        else:
            body.seek(rewind)
            writer.write(head)
            if opening is not None:
                opening.release()  # the head (and its token) is out: a long upload does not hold up others
            while True:
                block = body.read(_BLOCKSIZE)  # a local file: a short read from the page cache or the disk
                if not block:
                    break
                writer.write(block)
                await writer.drain()
        await writer.drain()
        if opening is not None:
            opening.release()

    async def _read_head(self, conn: _Conn) -> Tuple[int, http.client.HTTPMessage, bool]:
        """(status, headers, keep_alive) of the next final (non-1xx) response on the connection."""
        reader = conn.reader
        first = True
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as e:
                if first and not e.partial:
                    raise _Stale("the server closed the connection without answering") from None
                raise
            except asyncio.LimitOverrunError:
                raise _BadResponse("response head over 64 KiB") from None
            first = False
            line, _, rest = head.partition(b"\r\n")
            parts = line.decode("latin-1").split(None, 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
                raise _BadResponse(f"bad status line {line[:80]!r}")
            status = int(parts[1])
            headers = http.client.parse_headers(io.BytesIO(rest))
            if 100 <= status < 200 and status != 101:
                continue  # 100 Continue and other interim answers
            connection = (headers.get("Connection") or "").lower()
            keep_alive = "close" not in connection and (parts[0] != "HTTP/1.0" or "keep-alive" in connection)
            return status, headers, keep_alive

    async def _request_on(self, index: int, method: str, path: str, query: Optional[Query], body: Body,
                          all_headers: Dict[str, str], timeout: Any, rewind: Optional[int],
                          slot: _Slot) -> AsyncResponse:
        target = self._targets[index]
        url = target.prefix + path + encode_query(query)
        endpoint = target.endpoint
        lines = [f"{method} {url} HTTP/1.1", f"Host: {target.host_header}"]
        lines += [f"{k}: {val}" for k, val in all_headers.items()]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        for attempt in (0, 1):
            conn = self._borrow(index)
            reused = conn is not None
            opening = None
            if conn is None:
                opening = await self._opening.acquire()
                try:
                    conn = await self._open(index)
                except BaseException:
                    opening.release()
                    raise
            try:
                try:
                    await _wait(self._send(conn, head, body, rewind, opening), timeout)
                except (BrokenPipeError, ConnectionResetError):
                    # The server may have answered early (e.g. 401 or 413) and closed while we were still sending
                    # the body; its response is then already in our receive buffer.
                    if not conn.reader._buffer:  # type: ignore[attr-defined]
                        raise _Stale("the connection was closed while sending") from None
                status, headers, keep_alive = await _wait(self._read_head(conn), timeout)
                response = AsyncResponse(self, conn, slot, status, headers, method, timeout, keep_alive)
            except asyncio.TimeoutError:
                conn.close()
                raise DsecTimeoutError(f"{method} {path}: no response from {endpoint} within {timeout} s") \
                    from None
            except _Stale as e:
                conn.close()
                if reused and attempt == 0:
                    continue
                raise DsecConnectionError(f"{method} {path}: connection to {endpoint} lost: {e}") from None
            except ConnectionError as e:  # reset
                conn.close()
                if reused and attempt == 0:
                    continue
                raise DsecConnectionError(f"{method} {path}: connection to {endpoint} lost: {e!r}") from None
            except asyncio.IncompleteReadError as e:  # closed in the middle of the response head
                conn.close()
                raise DsecConnectionError(f"{method} {path}: connection to {endpoint} lost: {e!r}") from None
            except OSError as e:
                conn.close()
                raise DsecConnectionError(f"{method} {path}: connection to {endpoint} failed: {e}") from None
            except _BadResponse as e:
                conn.close()
                raise ServerError(f"{method} {path}: bad HTTP response from {endpoint}: {e}") from None
            except BaseException:  # cancelled mid-request: the connection's state is unknown
                conn.close()
                raise
            finally:
                if opening is not None:
                    opening.release()  # sent, or failed (released once: a slot's release is idempotent)
            if not 200 <= status < 300:
                try:
                    data = await response.read()
                except DsecError:
                    data = b""
                response.close()
                raise error_from_response(status, data, headers)
            return response
        raise AssertionError("unreachable")

    async def call(self, method: str, path: str, query: Optional[Query] = None, payload: Any = None,
                   timeout: Any = _DEFAULT) -> Any:
        """A JSON request/response round trip."""
        return await call_json(self.request, method, path, query, payload, timeout)


async def call_json(request: Callable[..., Any], method: str, path: str, query: Optional[Query], payload: Any,
                    timeout: Any) -> Any:
    body, headers = json_body(payload)
    response = await request(method, path, query, body, headers, timeout)
    try:
        return await response.json()
    finally:
        response.close()  # a no-op once it was read to the end
