"""Interactive execs for :mod:`pydsec.aio` on asyncio's own streams (no thread per request): an exec stream
that starts with the command and takes stdin while it runs.

Each exec stream holds one connection for its output; its stdin writer holds one more (keep-alive, one write at
a time), so a writer waiting on a command that does not read never blocks the loop or another exec."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from typing import Any, Dict, List, Optional, Tuple, Union
from urllib.parse import urlsplit

from . import _validate as v
from . import _websocket as _ws
from ._http import USER_AGENT
from .errors import ConflictError, DsecConnectionError, DsecTimeoutError, ServerError, error_from_code, \
    error_from_response
from .results import ExecResult

_PIECE = 256 * 1024  # stdin bytes per request (the node holds at most 1 MiB of one exec's stdin)


class _Connection:
    """One HTTP/1.1 connection on asyncio streams: a request, then its response's head and body."""

    def __init__(self, endpoint: str, token: str, connect_timeout: Optional[float]):
        parts = urlsplit(endpoint)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")
        self._endpoint = endpoint
        self._token = token
        self._connect_timeout = connect_timeout
        self._reader: Optional[asyncio.StreamReader] = None
        self._writer: Optional[asyncio.StreamWriter] = None
        self._chunked = False
        self._remaining: Optional[int] = None  # Content-Length bytes left; None: chunked or to EOF
        self._chunk_left = 0
        self._body_done = True

    async def _open(self) -> None:
        ctx = ssl.create_default_context() if self._https else None
        try:
            self._reader, self._writer = await asyncio.wait_for(
                asyncio.open_connection(self._host, self._port, ssl=ctx), self._connect_timeout)
        except (OSError, asyncio.TimeoutError) as e:
            raise DsecConnectionError(f"cannot reach the dsec fleet at {self._endpoint}: {e or 'timed out'}") \
                from None

    async def request(self, method: str, path: str, body: bytes, content_type: str,
                      timeout: Optional[float]) -> int:
        """Sends the request and reads the response's head; raises the mapped error for non-2xx."""
        if self._writer is None or not self._body_done:
            await self.close()
            await self._open()
        assert self._writer is not None and self._reader is not None
        head = (f"{method} {self._prefix}{path} HTTP/1.1\r\nHost: {self._host}:{self._port}\r\n"
                f"Authorization: Bearer {self._token}\r\nUser-Agent: {USER_AGENT}\r\nAccept: */*\r\n"
                f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n")
        try:
            self._writer.write(head.encode("latin-1") + body)
            await self._writer.drain()
            status, headers = await asyncio.wait_for(self._read_head(), timeout)
        except asyncio.TimeoutError:
            await self.close()
            raise DsecTimeoutError(f"{method} {path}: no response from {self._endpoint} within {timeout} s") \
                from None
        except (OSError, asyncio.IncompleteReadError, ValueError) as e:
            await self.close()
            raise DsecConnectionError(f"{method} {path}: connection to {self._endpoint} failed: {e}") from None
        self._chunked = headers.get("transfer-encoding", "").lower() == "chunked"
        self._remaining = None if self._chunked else int(headers.get("content-length", "0") or 0)
        self._chunk_left = 0
        self._body_done = False
        if not 200 <= status < 300:
            data = await self.read_all()
            raise error_from_response(status, data, headers)
        return status

    async def _read_head(self) -> Tuple[int, Dict[str, str]]:
        assert self._reader is not None
        raw = await self._reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers: Dict[str, str] = {}
        for line in lines[1:]:
            if ":" in line:
                k, _, val = line.partition(":")
                headers[k.strip().lower()] = val.strip()
        return status, headers

    async def read_some(self) -> bytes:
        """The next piece of the response body; b"" at its end."""
        assert self._reader is not None
        if self._body_done:
            return b""
        if not self._chunked:
            if not self._remaining:
                self._body_done = True
                return b""
            data = await self._reader.read(min(self._remaining, 65536))
            if not data:
                raise DsecConnectionError("the connection closed in the middle of a response")
            self._remaining -= len(data)
            return data
        if self._chunk_left == 0:
            size_line = await self._reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:
                await self._reader.readuntil(b"\r\n")  # the (empty) trailer
                self._body_done = True
                return b""
            self._chunk_left = size
        data = await self._reader.read(min(self._chunk_left, 65536))
        if not data:
            raise DsecConnectionError("the connection closed in the middle of a response")
        self._chunk_left -= len(data)
        if self._chunk_left == 0:
            await self._reader.readexactly(2)
        return data

    async def read_all(self) -> bytes:
        parts: List[bytes] = []
        while True:
            data = await self.read_some()
            if not data:
                return b"".join(parts)
            parts.append(data)

    async def close(self) -> None:
        if self._writer is not None:
            writer, self._writer, self._reader = self._writer, None, None
            writer.close()
            try:
                await writer.wait_closed()
            except (OSError, ssl.SSLError):
                pass


class AsyncStdinWriter:
    """The stdin of a running exec: ``await write(data)`` returns once the command's stdin took it,
    ``await close()`` sends EOF."""

    def __init__(self, endpoint: str, token: str, path: str, timeout: Optional[float],
                 connect_timeout: Optional[float]):
        self._conn = _Connection(endpoint, token, connect_timeout)
        self._path = path
        self._timeout = timeout
        self._lock = asyncio.Lock()
        self.closed = False

    async def _send(self, data: bytes, eof: bool) -> int:
        async with self._lock:
            await self._conn.request("POST", self._path + ("?eof=true" if eof else ""), data,
                                     "application/octet-stream", self._timeout)
            doc = json.loads((await self._conn.read_all()).decode("utf-8") or "{}")
        return int(doc.get("written", 0)) if isinstance(doc, dict) else 0

    async def write(self, data: Union[bytes, str]) -> int:
        if self.closed:
            raise ValueError("write to a closed exec stdin")
        if isinstance(data, str):
            data = data.encode("utf-8")
        elif isinstance(data, (bytearray, memoryview)):
            data = bytes(data)
        elif not isinstance(data, bytes):
            v._fail(f"stdin data must be bytes or str, got {type(data).__name__}")
        written = 0
        for off in range(0, len(data), _PIECE):
            written += await self._send(data[off:off + _PIECE], False)
        return written

    async def close(self) -> None:
        """Sends EOF (once) and lets the connection go."""
        if self.closed:
            return
        self.closed = True
        try:
            await self._send(b"", True)
        finally:
            await self._conn.close()


class AsyncExecStream:
    """``async for stream, text in ...``; ``await start()`` (done by the first iteration) returns once the command
    runs; with streamed stdin, ``stdin`` is its writer once started."""

    def __init__(self, endpoint: str, token: str, path: str, body: Dict[str, Any], timeout: Optional[float],
                 connect_timeout: Optional[float], stdin: bool):
        self._conn = _Connection(endpoint, token, connect_timeout)
        self._endpoint = endpoint
        self._token = token
        self._path = path
        self._body = body
        self._timeout = timeout
        self._connect_timeout = connect_timeout
        self._want_stdin = stdin
        self._buf = b""
        self._stdout: List[str] = []
        self._stderr: List[str] = []
        self._ended = False
        self.started = False
        self.exec_id: Optional[str] = None
        self.stdin: Optional[AsyncStdinWriter] = None
        self.result: Optional[ExecResult] = None
        self._pending: Optional[Dict[str, Any]] = None
        self._opened = False

    async def start(self) -> "AsyncExecStream":
        if self._opened:
            return self
        self._opened = True
        await self._conn.request("POST", self._path + "/exec/stream", json.dumps(self._body).encode("utf-8"),
                                 "application/json", self._timeout)
        doc = await self._next_doc()
        self.started = bool(doc is not None and doc.get("started"))
        if not self.started:
            self._pending = doc
        elif isinstance(doc.get("exec_id"), str):
            self.exec_id = doc["exec_id"]
        if self._want_stdin:
            if self.exec_id is None:
                await self.aclose()
                raise ServerError("exec stream did not name its exec for streamed stdin")
            self.stdin = AsyncStdinWriter(self._endpoint, self._token, f"{self._path}/exec/{self.exec_id}/stdin",
                                          self._timeout, self._connect_timeout)
        return self

    async def _next_doc(self) -> Optional[Dict[str, Any]]:
        while True:
            if b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                line = line.strip()
                if not line:
                    continue
                try:
                    doc = json.loads(line.decode("utf-8"))
                except (UnicodeDecodeError, ValueError):
                    await self.aclose()
                    raise ServerError(f"exec stream sent an invalid line: {line[:200]!r}") from None
                if not isinstance(doc, dict):
                    await self.aclose()
                    raise ServerError(f"exec stream sent a non-object line: {line[:200]!r}")
                return doc
            if self._ended:
                return None
            try:
                data = await asyncio.wait_for(self._conn.read_some(), self._timeout)
            except asyncio.TimeoutError:
                await self.aclose()
                raise DsecTimeoutError(f"exec stream: nothing from {self._endpoint} within {self._timeout} s") \
                    from None
            except (OSError, asyncio.IncompleteReadError, ValueError) as e:
                await self.aclose()
                raise DsecConnectionError(f"exec stream: connection to {self._endpoint} failed: {e}") from None
            if not data:
                self._ended = True
                if self.result is None and not self._buf.strip():
                    raise ServerError("exec stream ended without a final result line")
                self._buf += b"\n"
                continue
            self._buf += data

    def __aiter__(self) -> "AsyncExecStream":
        return self

    async def __anext__(self) -> Tuple[str, str]:
        await self.start()
        while True:
            if self.result is not None:
                raise StopAsyncIteration
            doc, self._pending = (self._pending, None) if self._pending is not None else (await self._next_doc(),
                                                                                           None)
            if doc is None:
                raise StopAsyncIteration
            if isinstance(doc.get("error"), dict):
                await self.aclose()
                err = doc["error"]
                code = err.get("code") if isinstance(err.get("code"), str) else "internal"
                raise error_from_code(None, code, str(err.get("message", "exec stream failed")), err)
            if doc.get("done"):
                self.result = ExecResult.from_json(doc, stdout="".join(self._stdout), stderr="".join(self._stderr))
                await self._conn.close()
                raise StopAsyncIteration
            for name in ("stdout", "stderr"):
                text = doc.get(name)
                if isinstance(text, str) and text:
                    (self._stdout if name == "stdout" else self._stderr).append(text)
                    return name, text

    async def wait(self) -> ExecResult:
        async for _ in self:
            pass
        if self.result is None:
            raise ServerError("exec stream was closed before its result arrived")
        return self.result

    async def aclose(self) -> None:
        self._ended = True
        await self._conn.close()
        if self.stdin is not None and not self.stdin.closed:
            self.stdin.closed = True
            await self.stdin._conn.close()

    async def __aenter__(self) -> "AsyncExecStream":
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()




class AsyncTerminal:
    """:class:`pydsec.Terminal` for asyncio, on the loop's own streams: ``await send(data)``, ``await recv()``
    (b"" once it exited), ``await resize(rows, cols)``, ``await signal("INT")``, ``await eof()``,
    ``await wait()`` (the exit dict, also in ``exit``), ``await aclose()``."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, early: bytes):
        self._reader = reader
        self._writer = writer
        self._decoder = _ws.Decoder(masked=False)
        self._decoder.feed(early)
        self.exit: Optional[Dict[str, Any]] = None
        self.output = bytearray()
        self.started = False
        self._ended = False
        self._closed = False

    @property
    def exit_code(self) -> Optional[int]:
        return None if self.exit is None else self.exit.get("exit_code")

    async def _frame(self, op: int, payload: bytes) -> None:
        if self._closed:
            raise ValueError("the terminal is closed")
        try:
            self._writer.write(_ws.encode_frame(op, payload))
            await self._writer.drain()
        except OSError as e:
            raise DsecConnectionError(f"terminal: connection lost: {e}") from None

    async def send(self, data: Union[bytes, str]) -> None:
        if isinstance(data, str):
            data = data.encode("utf-8")
        for off in range(0, len(data), 32 * 1024):
            await self._frame(2, bytes(data[off:off + 32 * 1024]))

    async def _control(self, doc: Dict[str, Any]) -> None:
        await self._frame(1, json.dumps(doc).encode("utf-8"))

    async def resize(self, rows: int, cols: int) -> None:
        for name, value in (("rows", rows), ("cols", cols)):
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 4096:
                raise ValueError(f"{name} must be an int in 1..4096")
        await self._control({"type": "resize", "rows": rows, "cols": cols})

    async def signal(self, sig: Union[str, int]) -> None:
        await self._control({"type": "signal", "signal": sig})

    async def eof(self) -> None:
        await self._control({"type": "eof"})

    async def _step(self) -> Optional[bytes]:
        while True:
            msg = self._decoder.next()
            if msg is not None:
                break
            if self._ended:
                return b""
            try:
                data = await self._reader.read(65536)
            except OSError as e:
                raise DsecConnectionError(f"terminal: connection lost: {e}") from None
            if not data:
                self._ended = True
                if self.exit is None:
                    raise DsecConnectionError("terminal: the connection closed before the exit")
                return b""
            self._decoder.feed(data)
        op, payload = msg
        if op == 2:
            self.output += payload
            return payload
        if op == 1:
            doc = json.loads(payload.decode("utf-8"))
            if doc.get("type") == "started":
                self.started = True
            elif doc.get("type") == "exit":
                self.exit = doc
            elif doc.get("type") == "error":
                if not self.started:
                    self._ended = True
                    await self.aclose()
                raise error_from_code(None, str(doc.get("code", "internal")), str(doc.get("message", "")), doc)
            return None
        if op == 9:
            await self._frame(10, payload)
            return None
        if op == 8:
            self._ended = True
            if not self._closed:
                with contextlib.suppress(OSError):
                    self._writer.write(_ws.encode_frame(8, payload[:2]))
            return b""
        return None

    async def recv(self, timeout: Optional[float] = None) -> bytes:
        while True:
            try:
                data = await asyncio.wait_for(self._step(), timeout)
            except asyncio.TimeoutError:
                raise DsecTimeoutError(f"terminal: no output within {timeout} s") from None
            if data is not None:
                return data

    async def read_until(self, marker: Union[bytes, str], timeout: Optional[float] = 30.0) -> bytes:
        if isinstance(marker, str):
            marker = marker.encode("utf-8")
        start = len(self.output)
        while marker not in bytes(self.output[start:]):
            if not await self.recv(timeout):
                raise ServerError(f"terminal ended before {marker!r} appeared")
        return bytes(self.output[start:])

    async def wait(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        while await self.recv(timeout):
            pass
        if self.exit is None:
            raise ServerError("terminal ended without an exit message")
        return self.exit

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError, ConnectionError):
            if not self._ended:
                self._writer.write(_ws.encode_frame(8, (1000).to_bytes(2, "big")))
                await self._writer.drain()
        self._writer.close()
        with contextlib.suppress(OSError, ssl.SSLError, ConnectionError):
            await self._writer.wait_closed()

    async def __aenter__(self) -> "AsyncTerminal":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


async def open_terminal(endpoint: str, token: str, target: str, connect_timeout: Optional[float],
                        timeout: Optional[float]) -> AsyncTerminal:
    request, key, host, port, https, _ = _ws.handshake_request(endpoint, target, token)
    ctx = ssl.create_default_context() if https else None
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, ssl=ctx), connect_timeout)
    except (OSError, asyncio.TimeoutError) as e:
        raise DsecConnectionError(f"cannot reach the dsec fleet at {endpoint}: {e or 'timed out'}") from None
    try:
        writer.write(request)
        await writer.drain()
        raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
        head = raw[:-4]
        body = b""
        if not head.startswith(b"HTTP/1.1 101"):
            length = 0
            for line in head.decode("latin-1").split("\r\n")[1:]:
                if line.lower().startswith("content-length:"):
                    length = int(line.split(":", 1)[1].strip() or 0)
            body = await asyncio.wait_for(reader.readexactly(length), timeout) if length else b""
        _ws.check_handshake(head, body, key)
        term = AsyncTerminal(reader, writer, b"")
        while not term.started:
            if not await term.recv(timeout) and term._ended:
                break
        return term
    except asyncio.TimeoutError:
        writer.close()
        raise DsecTimeoutError(f"terminal: no answer from {endpoint} within {timeout} s") from None
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError) as e:
        writer.close()
        raise DsecConnectionError(f"terminal: handshake with {endpoint} failed: {e}") from None
    except BaseException:
        writer.close()
        raise


__all__ = ["AsyncExecStream", "AsyncStdinWriter", "AsyncTerminal", "open_terminal", "ConflictError"]
