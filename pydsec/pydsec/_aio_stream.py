"""Interactive execs for :mod:`pydsec.aio` on asyncio's own streams (no thread per request): an exec stream
that starts with the command and takes stdin while it runs.

Each exec stream holds one connection for its output; its stdin writer holds one more (keep-alive, one write at
a time), so a writer waiting on a command that does not read never blocks the loop or another exec."""

from __future__ import annotations

import asyncio
import json
import ssl
from typing import Any, Dict, List, Optional, Tuple, Union
from urllib.parse import urlsplit

from . import _validate as v
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


__all__ = ["AsyncExecStream", "AsyncStdinWriter", "ConflictError"]
