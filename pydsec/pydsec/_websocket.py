"""A small RFC 6455 WebSocket client codec (standard library only) and the terminal session on top of it
(``Sandbox.terminal()``; docs/api.md, "Terminals").

Binary messages carry the terminal's bytes; text messages are JSON control messages (to the node: resize,
signal, eof; from it: started, exit, error)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import ssl
import struct
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union
from urllib.parse import quote, urlsplit

from ._http import USER_AGENT
from .errors import DsecConnectionError, DsecTimeoutError, ServerError, error_from_code, error_from_response

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0, 1, 2, 8, 9, 10
MAX_MESSAGE = 16 << 20  # the largest message taken from the node (its output comes in pieces of 64 KiB)


def accept_key(key: str) -> str:
    return base64.b64encode(hashlib.sha1((key + GUID).encode("ascii")).digest()).decode("ascii")


def encode_frame(op: int, payload: bytes, mask: bool = True) -> bytes:
    """One whole frame; a client's frames are masked."""
    n = len(payload)
    head = bytearray([0x80 | op])
    bit = 0x80 if mask else 0
    if n < 126:
        head.append(bit | n)
    elif n <= 0xFFFF:
        head.append(bit | 126)
        head += struct.pack("!H", n)
    else:
        head.append(bit | 127)
        head += struct.pack("!Q", n)
    if not mask:
        return bytes(head) + payload
    key = os.urandom(4)
    masked = bytes(b ^ key[i % 4] for i, b in enumerate(payload)) if n < 4096 else _mask_fast(payload, key)
    return bytes(head) + key + masked


def _mask_fast(payload: bytes, key: bytes) -> bytes:
    k = int.from_bytes((key * (len(payload) // 4 + 1))[:len(payload)], "big")
    return (int.from_bytes(payload, "big") ^ k).to_bytes(len(payload), "big")


class Decoder:
    """Bytes in, whole messages out: ``feed(data)``, then ``next()`` until it returns None."""

    def __init__(self, masked: bool = False, max_message: int = MAX_MESSAGE):
        self._buf = bytearray()
        self._masked = masked
        self._max = max_message
        self._op: Optional[int] = None
        self._parts: List[bytes] = []
        self._size = 0

    def feed(self, data: bytes) -> None:
        self._buf += data

    def next(self) -> Optional[Tuple[int, bytes]]:
        while True:
            b = self._buf
            if len(b) < 2:
                return None
            fin, rsv, op = b[0] & 0x80, b[0] & 0x70, b[0] & 0x0F
            masked, n = b[1] & 0x80, b[1] & 0x7F
            if rsv:
                raise ServerError("websocket: reserved bits set")
            if bool(masked) != self._masked:
                raise ServerError("websocket: unexpected masking")
            at = 2
            if n == 126:
                if len(b) < 4:
                    return None
                n, at = struct.unpack("!H", b[2:4])[0], 4
            elif n == 127:
                if len(b) < 10:
                    return None
                n, at = struct.unpack("!Q", b[2:10])[0], 10
            if op >= 8 and (not fin or n > 125):
                raise ServerError("websocket: bad control frame")
            if op < 8 and self._size + n > self._max:
                raise ServerError(f"websocket: message over {self._max} bytes")
            key = b""
            if masked:
                key, at = bytes(b[at:at + 4]), at + 4
            if len(b) < at + n:
                return None
            payload = bytes(b[at:at + n])
            del b[:at + n]
            if key:
                payload = _mask_fast(payload, key) if payload else payload
            if op >= 8:
                return op, payload
            if op != OP_CONT:
                if self._op is not None:
                    raise ServerError("websocket: a new message inside a fragmented one")
                self._op, self._parts, self._size = op, [], 0
            elif self._op is None:
                raise ServerError("websocket: a continuation without a message")
            self._parts.append(payload)
            self._size += n
            if fin:
                op_done, data = self._op, b"".join(self._parts)
                self._op, self._parts, self._size = None, [], 0
                return op_done, data


def terminal_target(sandbox_path: str, cmd: Union[None, str, Sequence[str]], rows: int, cols: int,
                    timeout: Optional[float], cwd: Optional[str], term: Optional[str]) -> str:
    query: List[Tuple[str, Any]] = []
    if cmd is not None:
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        if not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError("cmd must be a str or a non-empty list of str")
        query += [("cmd", a) for a in argv]
    for name, value, top in (("rows", rows, 4096), ("cols", cols, 4096)):
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= top:
            raise ValueError(f"{name} must be an int in 1..{top}")
        query.append((name, value))
    if timeout is not None:
        query.append(("timeout", float(timeout)))
    if cwd is not None:
        query.append(("cwd", cwd))
    if term is not None:
        query.append(("term", term))
    return sandbox_path + "/terminal?" + "&".join(f"{quote(str(k), safe='')}={quote(str(v), safe='')}"
                                                 for k, v in query)


def handshake_request(endpoint: str, target: str, token: str) -> Tuple[bytes, str, str, int, bool, str]:
    parts = urlsplit(endpoint)
    https = parts.scheme == "https"
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if https else 80)
    key = base64.b64encode(os.urandom(16)).decode("ascii")
    head = (f"GET {parts.path.rstrip('/')}{target} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Authorization: Bearer {token}\r\nUser-Agent: {USER_AGENT}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
    return head.encode("latin-1"), key, host, port, https, endpoint


def check_handshake(raw_head: bytes, body: bytes, key: str) -> None:
    lines = raw_head.decode("latin-1").split("\r\n")
    try:
        status = int(lines[0].split(" ", 2)[1])
    except (IndexError, ValueError):
        raise ServerError(f"terminal: bad answer to the handshake: {lines[0]!r}") from None
    headers: Dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
    if status != 101:
        raise error_from_response(status, body, headers)
    if headers.get("sec-websocket-accept") != accept_key(key):
        raise ServerError("terminal: the node's handshake answer does not match our key")


class Terminal:
    """A command on a terminal inside a sandbox (``Sandbox.terminal()``).

    ``send(data)`` types bytes, ``recv(timeout)`` returns the terminal's next output (b"" once it exited),
    ``resize(rows, cols)``, ``signal("INT")``, ``eof()``; ``wait()`` reads to the end and returns the exit
    (a dict like an exec result's, without output: ``exit_code``, ``signal``, ``timed_out``...), also kept
    in ``exit``. ``output`` holds everything received so far. Close it (or use ``with``) to end the session;
    that kills what still runs on it."""

    def __init__(self, sock: socket.socket, early: bytes):
        self._sock = sock
        self._decoder = Decoder(masked=False)
        self._decoder.feed(early)
        self.exit: Optional[Dict[str, Any]] = None
        self.output = bytearray()
        self._closed = False
        self._ended = False
        self.started = False
        # The node says "started" first (or an error): wait for it, so that a failed start raises here.
        while not self.started and not self._ended:
            self._step(None)

    @property
    def exit_code(self) -> Optional[int]:
        return None if self.exit is None else self.exit.get("exit_code")

    def _send_frame(self, op: int, payload: bytes) -> None:
        if self._closed:
            raise ValueError("the terminal is closed")
        try:
            self._sock.sendall(encode_frame(op, payload))
        except OSError as e:
            raise DsecConnectionError(f"terminal: connection lost: {e}") from None

    def send(self, data: Union[bytes, str]) -> None:
        if isinstance(data, str):
            data = data.encode("utf-8")
        for off in range(0, len(data), 32 * 1024):
            self._send_frame(OP_BINARY, bytes(data[off:off + 32 * 1024]))

    def _control(self, doc: Dict[str, Any]) -> None:
        self._send_frame(OP_TEXT, json.dumps(doc).encode("utf-8"))

    def resize(self, rows: int, cols: int) -> None:
        for name, value in (("rows", rows), ("cols", cols)):
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 4096:
                raise ValueError(f"{name} must be an int in 1..4096")
        self._control({"type": "resize", "rows": rows, "cols": cols})

    def signal(self, sig: Union[str, int]) -> None:
        """Sends a signal (INT, QUIT and TSTP go to the terminal's foreground job, as the keys do)."""
        self._control({"type": "signal", "signal": sig})

    def eof(self) -> None:
        """Types the terminal's end-of-file character (^D) and closes the input."""
        self._control({"type": "eof"})

    def _step(self, timeout: Optional[float]) -> Optional[bytes]:
        """Handles one message (reading as needed): its output bytes, or None for a control message."""
        while True:
            msg = self._decoder.next()
            if msg is not None:
                break
            if self._ended:
                return b""
            self._sock.settimeout(timeout)
            try:
                data = self._sock.recv(65536)
            except socket.timeout:
                raise DsecTimeoutError(f"terminal: no output within {timeout} s") from None
            except OSError as e:
                raise DsecConnectionError(f"terminal: connection lost: {e}") from None
            if not data:
                self._ended = True
                if self.exit is None:
                    raise DsecConnectionError("terminal: the connection closed before the exit")
                return b""
            self._decoder.feed(data)
        op, payload = msg
        if op == OP_BINARY:
            self.output += payload
            return payload
        if op == OP_TEXT:
            doc = json.loads(payload.decode("utf-8"))
            kind = doc.get("type")
            if kind == "started":
                self.started = True
            elif kind == "exit":
                self.exit = doc
            elif kind == "error":
                if not self.started:
                    self._ended = True
                    self.close()
                raise error_from_code(None, str(doc.get("code", "internal")), str(doc.get("message", "")), doc)
            return None
        if op == OP_PING:
            self._send_frame(OP_PONG, payload)
            return None
        if op == OP_CLOSE:
            self._ended = True
            if not self._closed:
                try:
                    self._sock.sendall(encode_frame(OP_CLOSE, payload[:2]))
                except OSError:
                    pass
            return b""
        return None

    def recv(self, timeout: Optional[float] = None) -> bytes:
        """The next output from the terminal (waits up to timeout; DsecTimeoutError past it); b"" at the end."""
        while True:
            data = self._step(timeout)
            if data is None:
                continue
            return data

    def read_until(self, marker: Union[bytes, str], timeout: Optional[float] = 30.0) -> bytes:
        """Reads until marker appears in the output received since this call began; returns that output."""
        if isinstance(marker, str):
            marker = marker.encode("utf-8")
        start = len(self.output)
        while marker not in bytes(self.output[start:]):
            if not self.recv(timeout):
                raise ServerError(f"terminal ended before {marker!r} appeared")
        return bytes(self.output[start:])

    def wait(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        while self.recv(timeout):
            pass
        if self.exit is None:
            raise ServerError("terminal ended without an exit message")
        return self.exit

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if not self._ended:
                self._sock.sendall(encode_frame(OP_CLOSE, struct.pack("!H", 1000)))
        except OSError:
            pass
        self._sock.close()

    def __enter__(self) -> "Terminal":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def open_terminal(endpoint: str, token: str, target: str, connect_timeout: Optional[float],
                  timeout: Optional[float]) -> Terminal:
    request, key, host, port, https, _ = handshake_request(endpoint, target, token)
    try:
        sock = socket.create_connection((host, port), timeout=connect_timeout)
    except OSError as e:
        raise DsecConnectionError(f"cannot reach the dsec fleet at {endpoint}: {e or 'timed out'}") from None
    try:
        if https:
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        sock.settimeout(timeout)
        sock.sendall(request)
        buf = b""
        while b"\r\n\r\n" not in buf:
            data = sock.recv(65536)
            if not data:
                raise DsecConnectionError("terminal: the connection closed during the handshake")
            buf += data
            if len(buf) > 65536:
                raise ServerError("terminal: handshake answer too long")
        head, _, rest = buf.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 101"):
            # An HTTP error: its body (JSON) follows; read what Content-Length says.
            length = 0
            for line in head.decode("latin-1").split("\r\n")[1:]:
                if line.lower().startswith("content-length:"):
                    length = int(line.split(":", 1)[1].strip() or 0)
            while len(rest) < length:
                data = sock.recv(65536)
                if not data:
                    break
                rest += data
        check_handshake(head, rest, key)
        return Terminal(sock, rest)
    except socket.timeout:
        sock.close()
        raise DsecTimeoutError(f"terminal: no answer from {endpoint} within {timeout} s") from None
    except BaseException:
        sock.close()
        raise
