"""The synchronous SDK: Client, Sandbox and ExecStream.

A Client is thread-safe: share one between threads; it keeps a small pool of keep-alive connections.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from . import _config, _ops, _tar, _websocket
from . import _validate as v
from ._direct import DataPath, SandboxRoute
from ._http import Response, Transport
from .errors import DsecError, NodeLostError, NotFoundError, ServerError
from ._websocket import Terminal
from .results import ExecResult
from .snapshot import Snapshot

Cmd = Union[str, Sequence[str]]
_COPY_BUFSIZE = 256 * 1024
_EXEC_GRACE = _ops.EXEC_GRACE


class _StartedSignal(Exception):
    """Internal: the started line was read (ExecStream's constructor stops there)."""


class ExecStream:
    """Output of a streaming exec, chunk by chunk.

    Iterate it to get ``(stream, text)`` tuples where stream is ``"stdout"`` or ``"stderr"``; once the
    iteration ends, ``result`` holds the ExecResult (its stdout/stderr are the concatenated chunks).
    ``wait()`` consumes the rest and returns the result. Use it as a context manager (or call ``close()``)
    to abandon a stream early.
    """

    def __init__(self, response: Response, stdin_writer: Optional[Callable[[str], "StdinWriter"]] = None):
        self._response: Optional[Response] = response
        self._lines = _ops.StreamLines()
        self.result: Optional[ExecResult] = None
        #: With ``exec_stream(..., stdin=True)``: the command's stdin (write bytes, close for EOF); else None.
        self.stdin: Optional[StdinWriter] = None
        self._pending: Optional[Tuple[str, str]] = None
        # The node answers as the command starts, first with a line that says so (and names the exec that
        # streamed stdin is written to), whether or not the command ever prints.
        self._until_started = True
        try:
            self._pending = self._step()
        except (StopIteration, _StartedSignal):
            pass
        self._until_started = False
        if stdin_writer is not None:
            if self.exec_id is None:
                self.close()
                raise ServerError("exec stream did not name its exec for streamed stdin")
            self.stdin = stdin_writer(self.exec_id)

    @property
    def started(self) -> bool:
        """True once the node said the command runs (at once, from nodes that stream from the start)."""
        return self._lines.started

    @property
    def exec_id(self) -> Optional[str]:
        return self._lines.exec_id

    def __iter__(self) -> Iterator[Tuple[str, str]]:
        return self

    def __next__(self) -> Tuple[str, str]:
        if self._pending is not None:
            item, self._pending = self._pending, None
            return item
        return self._step()

    def _step(self) -> Tuple[str, str]:
        """The next chunk; StopIteration at the end. Returns early (nothing pending) after the started line."""
        while True:
            if self._response is None:
                raise StopIteration
            line = self._response.readline()
            if not line:
                self._response = None
                if self.result is None:
                    raise ServerError("exec stream ended without a final result line")
                raise StopIteration
            try:
                item = self._lines.feed(line)
            except DsecError:
                self.close()
                raise
            if self._lines.result is not None:
                self.result = self._lines.result
                # Read the chunked terminator so that the connection goes back to the pool.
                response, self._response = self._response, None
                response.read()
                raise StopIteration
            if item is not None:
                return item
            if self._until_started and self._lines.started:
                raise _StartedSignal

    def wait(self) -> ExecResult:
        for _ in self:
            pass
        if self.result is None:
            raise ServerError("exec stream was closed before its result arrived")
        return self.result

    def close(self) -> None:
        if self._response is not None:
            response, self._response = self._response, None
            response.close()

    def __enter__(self) -> "ExecStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class StdinWriter:
    """The stdin of a running exec (``exec_stream(cmd, stdin=True).stdin``): ``write(data)`` returns once the
    command's stdin pipe took it (a command that does not read holds the writer: backpressure), ``close()`` sends
    EOF. Writing after the command exited raises ConflictError."""

    _PIECE = 256 * 1024  # bytes per request (the node holds at most 1 MiB of one exec's stdin)

    def __init__(self, route: Any, path: str, timeout: Optional[float]):
        self._route = route
        self._path = path
        self._timeout = timeout
        self.closed = False

    def _send(self, data: bytes, eof: bool) -> int:
        query = [("eof", "true")] if eof else None
        doc = self._route.request("POST", self._path, query, body=data,
                                  headers={"Content-Type": "application/octet-stream"}, timeout=self._timeout).json()
        return int(doc.get("written", 0)) if isinstance(doc, dict) else 0

    def write(self, data: Union[bytes, str]) -> int:
        if self.closed:
            raise ValueError("write to a closed exec stdin")
        if isinstance(data, str):
            data = data.encode("utf-8")
        elif isinstance(data, (bytearray, memoryview)):
            data = bytes(data)
        elif not isinstance(data, bytes):
            v._fail(f"stdin data must be bytes or str, got {type(data).__name__}")
        written = 0
        for off in range(0, len(data), self._PIECE):
            written += self._send(data[off:off + self._PIECE], False)
        return written

    def close(self) -> None:
        """Sends EOF (once)."""
        if not self.closed:
            self.closed = True
            self._send(b"", True)

    def __enter__(self) -> "StdinWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Sandbox:
    """A handle to one sandbox. Cheap to create; holds the last info it saw in ``cached_info``."""

    def __init__(self, client: "Client", sandbox_id: str, info: Optional[Dict[str, Any]] = None):
        self._client = client
        self.id = v.sandbox_id(sandbox_id)
        self.cached_info: Optional[Dict[str, Any]] = info

    def __repr__(self) -> str:
        state = (self.cached_info or {}).get("state", "?")
        return f"<pydsec.Sandbox {self.id} {state}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sandbox) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    @property
    def _path(self) -> str:
        return f"/v1/sandboxes/{self.id}"

    def _t(self) -> Transport:
        return self._client._transport

    def _d(self) -> SandboxRoute:
        """The data path (exec, files, tar): the sandbox's node directly when the client may, else the gateway."""
        return SandboxRoute(self._client._data_path, self._client._transport, self.id)

    # -- lifecycle ----------------------------------------------------------------------------------------
    def info(self) -> Dict[str, Any]:
        """The sandbox info object (state, limits, usage...), fetched fresh.

        A sandbox whose node the fleet declared lost has ``"state": "lost"``: the last info seen (its usage is
        not current), with the ``node`` and the gateway's ``error`` message. A node that is not answering but not
        yet declared lost raises NodeLostError (``node_state`` ``"unreachable"``).
        """
        try:
            self.cached_info = self._t().call("GET", self._path)
        except NodeLostError as e:
            self.cached_info = _ops.lost_info(self.id, self.cached_info, e)
        return self.cached_info

    @property
    def state(self) -> Optional[str]:
        return (self.cached_info or {}).get("state")

    @property
    def labels(self) -> Dict[str, str]:
        return dict((self.cached_info or {}).get("labels") or {})

    def pause(self) -> Dict[str, Any]:
        self.cached_info = self._t().call("POST", self._path + "/pause")
        return self.cached_info

    def resume(self) -> Dict[str, Any]:
        self.cached_info = self._t().call("POST", self._path + "/resume")
        return self.cached_info

    def set_timeout(self, seconds: Union[int, float]) -> Dict[str, Any]:
        """The sandbox ends ``seconds`` from now (0: never by timeout); its info's ``timeout`` becomes its age
        plus that."""
        payload = {"timeout": v.number("timeout", seconds)}
        self.cached_info = self._t().call("PUT", self._path + "/timeout", payload=payload)
        return self.cached_info

    # -- stages ---------------------------------------------------------------------------------------------
    def set_network(self, egress: List[str]) -> Dict[str, Any]:
        """Replace the egress policy at once (e.g. ``[]`` before the agent's turn). Connections the new policy
        refuses are cut. Only for sandboxes created with a network link (``network={"egress": [...]}``)."""
        self.cached_info = self._t().call("PUT", self._path + "/network", payload={"egress": v.egress_list(egress)})
        return self.cached_info

    def set_protect(self, paths: List[str]) -> Dict[str, Any]:
        """Replace the protected paths: the sandbox's processes cannot modify, rename, delete or replace anything
        under them (write_file still can, as the grader)."""
        self.cached_info = self._t().call("PUT", self._path + "/protect", payload={"paths": v.protect_list(paths)})
        return self.cached_info

    def violations(self) -> List[Dict[str, Any]]:
        """What the sandbox's processes were refused, oldest first: ``{"time", "kind": "connect"|"dns"|"file",
        "target", "detail"}`` each (the newest 1024 are kept)."""
        doc = self._t().call("GET", self._path + "/violations")
        return list((doc or {}).get("violations") or [])

    def snapshot(self, name: Optional[str] = None, processes: bool = False) -> Snapshot:
        """Keep the sandbox's state now in the fleet's snapshot store, as ``name`` (else a name the node picks).
        A container's snapshot holds its files; ``processes=True`` (machine sandboxes only) its processes too.
        The sandbox runs on. ConflictError if the name is taken. See :mod:`pydsec.snapshot`."""
        doc = self._t().call("POST", self._path + "/snapshot", payload=v.snapshot_body(name, processes))
        return Snapshot(self._client, doc)

    def fork(self, n: int = 1, processes: bool = False) -> List["Sandbox"]:
        """``n`` new sandboxes (1..256) that start from this one's state now, on its node (a snapshot is taken
        and restored ``n`` times). Each is an ordinary sandbox: ``with`` destroys it. The snapshot stays in the
        store (each copy's ``cached_info["snapshot"]`` names it): delete it when no more copies are wanted."""
        body = v.fork_body(n, processes)
        _snap, infos = _ops.fork_answer(self._t().call("POST", self._path + "/fork", payload=body), n)
        return [Sandbox(self._client, info["id"], info) for info in infos]

    def destroy(self) -> bool:
        """Destroy the sandbox. Idempotent: returns False if it was already gone."""
        try:
            self._t().call("DELETE", self._path)
        except NotFoundError:
            return False
        if self.cached_info is not None:
            self.cached_info = dict(self.cached_info, state="destroyed")
        return True

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.destroy()

    # -- exec ---------------------------------------------------------------------------------------------
    _exec_wait = staticmethod(_ops.exec_wait)

    def exec(self, cmd: Cmd, timeout: Optional[float] = None, cwd: Optional[str] = None,
             env: Optional[Dict[str, str]] = None, stdin: Union[None, str, bytes] = None,
             output_cap: Optional[int] = None) -> ExecResult:
        """Run a command (a str runs under /bin/sh -c, a list is argv) and wait for it."""
        body = v.exec_body(cmd, timeout, cwd, env, stdin, output_cap)
        doc = self._d().call("POST", self._path + "/exec", payload=body,
                             timeout=self._exec_wait(timeout, self._t().timeout))
        return _ops.exec_result(doc)

    def exec_stream(self, cmd: Cmd, timeout: Optional[float] = None, cwd: Optional[str] = None,
                    env: Optional[Dict[str, str]] = None, stdin: Union[None, bool, str, bytes] = None,
                    output_cap: Optional[int] = None) -> ExecStream:
        """Run a command and get its output as it arrives; see ExecStream. Returns once the command has
        started. ``stdin=True`` streams its stdin: write to the returned stream's ``stdin`` while it runs."""
        streamed = stdin is True
        body = v.exec_body(cmd, timeout, cwd, env, None if streamed or stdin is False else stdin, output_cap)
        if streamed:
            body["stdin_stream"] = True
        route = self._d()
        wait = self._exec_wait(timeout, self._t().timeout)
        response = route.request("POST", self._path + "/exec/stream", body=json.dumps(body).encode("utf-8"),
                                 headers={"Content-Type": "application/json"}, timeout=wait)
        if not streamed:
            return ExecStream(response)
        return ExecStream(response, lambda exec_id: StdinWriter(route, f"{self._path}/exec/{exec_id}/stdin", wait))

    def terminal(self, cmd: Optional[Cmd] = None, rows: int = 24, cols: int = 80, timeout: Optional[float] = None,
                 cwd: Optional[str] = None, term: Optional[str] = None) -> Terminal:
        """A command (default: the sandbox's login shell) on a terminal of the sandbox's own, over WebSocket;
        see pydsec.Terminal. timeout kills it after that many seconds, as an exec's does."""
        if cwd is not None:
            v.abs_path("cwd", cwd)
        target = _websocket.terminal_target(self._path, cmd, rows, cols, timeout, cwd, term)
        t = self._t()
        return _websocket.open_terminal(t.endpoint, t._token, target, t.connect_timeout, t.timeout)

    # -- files --------------------------------------------------------------------------------------------
    def write_file(self, path: str, data: Union[bytes, str], mode: Union[None, int, str] = None) -> Dict[str, Any]:
        """Write data (str is encoded as UTF-8) to path, creating parent directories."""
        query = _ops.file_query(path, mode)
        data = _ops.file_data(data)
        return self._d().request("PUT", self._path + "/files", query, body=data,
                                 headers={"Content-Type": "application/octet-stream"}).json()

    def write_file_from(self, path: str, local_path: str, mode: Union[None, int, str] = None) -> Dict[str, Any]:
        """Stream a local file to path without reading it into memory."""
        query = _ops.file_query(path, mode)
        with open(local_path, "rb") as f:
            return self._d().request("PUT", self._path + "/files", query, body=f,
                                     headers={"Content-Type": "application/octet-stream"}).json()

    def read_file(self, path: str) -> bytes:
        v.abs_path("path", path)
        return self._d().request("GET", self._path + "/files", [("path", path)]).read()

    def read_file_to(self, path: str, local_path: str) -> int:
        """Stream path into a local file (written next to it, then renamed). Returns the byte count."""
        v.abs_path("path", path)
        response = self._d().request("GET", self._path + "/files", [("path", path)])
        directory = os.path.dirname(os.path.abspath(local_path))
        fd, tmp = tempfile.mkstemp(prefix=".pydsec-", dir=directory)
        total = 0
        try:
            with os.fdopen(fd, "wb") as out:
                while True:
                    chunk = response.read(_COPY_BUFSIZE)
                    if not chunk:
                        break
                    out.write(chunk)
                    total += len(chunk)
            os.replace(tmp, local_path)
        except BaseException:
            response.close()
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        return total

    def list_dir(self, path: str) -> List[Dict[str, Any]]:
        v.abs_path("path", path)
        doc = self._d().call("GET", self._path + "/files/list", [("path", path)])
        return list((doc or {}).get("entries") or [])

    def stat(self, path: str) -> Dict[str, Any]:
        v.abs_path("path", path)
        return self._d().call("GET", self._path + "/files/stat", [("path", path)])

    def exists(self, path: str) -> bool:
        try:
            self.stat(path)
        except NotFoundError:
            return False
        return True

    def remove(self, path: str, recursive: bool = False) -> Dict[str, Any]:
        return self._d().call("DELETE", self._path + "/files", _ops.remove_query(path, recursive))

    def upload(self, local_dir: str, remote_dir: str) -> Dict[str, Any]:
        """Copy the contents of local_dir into remote_dir (created if missing) as one tar stream."""
        v.abs_path("remote_dir", remote_dir)
        with _tar.pack_directory(local_dir) as tmp:
            return self._d().request("PUT", self._path + "/tar", [("path", remote_dir)], body=tmp,
                                     headers={"Content-Type": "application/x-tar"}).json()

    def download(self, remote_dir: str, local_dir: str) -> int:
        """Copy the contents of remote_dir into local_dir. Returns the number of entries written.

        Members that would escape local_dir (absolute names, '..', outside links) raise UnsafeArchiveError.
        """
        v.abs_path("remote_dir", remote_dir)
        response = self._d().request("GET", self._path + "/tar", [("path", remote_dir)])
        try:
            count = _tar.extract_stream(response, local_dir)
            response.read()  # drain the end of the stream so that the connection can be reused
            return count
        finally:
            response.close()


class Client:
    """A connection to a dsec fleet.

    ``endpoint``/``token`` come from the arguments, else from DSEC_ENDPOINT/DSEC_TOKEN, else from the fleet file
    ``~/.dsec/fleets/<fleet>.json`` written by ``dsec serve --fleet-name <fleet>`` or ``dsec-launch``. ``timeout``
    (seconds, None for none) bounds every request except execs, which wait for their own timeout plus a grace
    period; ``connect_timeout`` bounds making a connection.

    A fleet with several gateways (its fleet file lists ``endpoints``; ``endpoint`` may also be a list) is used
    from the gateway that last worked, moving on to the next when one cannot be connected to (see
    ``pydsec._http`` for which requests are retried). ``direct`` sends a sandbox's exec, file and tar traffic
    straight to its node with the same token, the gateway being the fallback: ``None`` (the default) turns it on
    for a dsec-launch fleet found through its fleet file.
    """

    def __init__(self, endpoint: Union[None, str, Sequence[str]] = None, token: Optional[str] = None,
                 fleet: Optional[str] = None, timeout: Optional[float] = 120.0, max_idle_connections: int = 32,
                 connect_timeout: Optional[float] = 5.0, direct: Optional[bool] = None):
        cfg = _config.resolve(endpoint, token, fleet)
        self.fleet = cfg.fleet
        self._transport = Transport(cfg.endpoints or [cfg.endpoint], cfg.token, timeout=timeout,
                                    max_idle=max_idle_connections, connect_timeout=connect_timeout)
        self._data_path = DataPath(self._transport, cfg.token, cfg.launch_fleet if direct is None else direct,
                                   max_idle_connections)

    @property
    def endpoint(self) -> str:
        """The gateway requests go to now (the one that last worked)."""
        return self._transport.endpoint

    @property
    def endpoints(self) -> List[str]:
        """Every gateway candidate, in the order they are tried."""
        return self._transport.endpoints

    def __repr__(self) -> str:
        return f"<pydsec.Client {self.endpoint} fleet={self.fleet!r}>"

    def close(self) -> None:
        self._transport.close()
        self._data_path.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def create(self, image: Optional[str] = None, backend: Optional[str] = None, cpus: Optional[float] = None,
               memory: Union[None, int, str] = None, disk: Union[None, int, str] = None, pids: Optional[int] = None,
               timeout: Optional[float] = None, idle_timeout: Optional[float] = None,
               env: Optional[Dict[str, str]] = None, labels: Optional[Dict[str, str]] = None,
               network: Union[None, str, Dict[str, List[str]]] = None, session: Optional[str] = None,
               qos: Optional[str] = None, protect: Optional[List[str]] = None,
               snapshot: Union[None, str, Snapshot] = None) -> Sandbox:
        """Create a sandbox and return once it is running. Arguments left as None take the node's defaults.

        ``session`` names an existing, active session the sandbox belongs to (see :meth:`session`).
        ``qos`` is the CPU class: ``"batch"`` (the default) shares the node's pool at idle priority,
        ``"latency"`` gets ``ceil(cpus)`` dedicated cores (CapacityError when the node has none left).
        ``network`` is ``"none"`` (the default: no interface), ``{"egress": [...]}`` (a link, and the destinations
        it may reach: address blocks and domain names with optional ports; ``[]`` for none yet, opened later with
        :meth:`Sandbox.set_network`) or ``"egress"`` (anywhere but the node and the fleet). ``protect`` lists paths
        the sandbox's processes cannot change (the file API still can). ``backend`` defaults to ``"container"``.

        ``snapshot`` (a Snapshot or its name) restores it instead: the image, backend and limits are the
        snapshot's, so only ``timeout``, ``idle_timeout``, ``labels`` and ``session`` may be given with it.
        """
        body = _ops.create_body(snapshot, image, backend, cpus, memory, disk, pids, timeout, idle_timeout, env,
                                labels, network, session, qos, protect)
        info = self._transport.call("POST", "/v1/sandboxes", payload=body)
        return Sandbox(self, _ops.created_id(info), info)

    def session(self, name: str, lease: float = 60, retention: Optional[float] = None) -> "Session":
        """Create or renew the session ``name`` now (PUT) and keep renewing its lease in the background.

        Sandboxes made with ``session.create(...)`` belong to it. If this process stops renewing (it was
        preempted or died), the node pauses them when the lease lapses and keeps them for ``retention``
        seconds (node default: one hour). ``client.session(name).attach()`` gets them back.
        """
        s = Session(self, name, lease, retention)
        s._put()
        s._start_renewal()
        return s

    def sessions(self) -> List[Dict[str, Any]]:
        """The session objects the fleet knows."""
        doc = self._transport.call("GET", "/v1/sessions")
        return list((doc or {}).get("sessions") or [])

    def sandbox(self, sandbox_id: str) -> Sandbox:
        """A handle to a sandbox by id, without a request."""
        return Sandbox(self, sandbox_id)

    def get(self, sandbox_id: str) -> Sandbox:
        """A handle to an existing sandbox; NotFoundError if there is none with that id."""
        sb = Sandbox(self, sandbox_id)
        sb.info()
        return sb

    def list(self, labels: Optional[Dict[str, str]] = None) -> List[Sandbox]:
        """The sandboxes whose labels include all of ``labels``."""
        doc = self._transport.call("GET", "/v1/sandboxes", _ops.label_query(labels))
        return [Sandbox(self, info["id"], info) for info in (doc or {}).get("sandboxes") or []]

    def call(self, code: str, language: str = "python", stdin: Union[None, str, bytes] = None,
             timeout: float = 10, memory: Union[int, str] = "256M",
             files: Optional[Mapping[str, Union[bytes, str]]] = None, image: Optional[str] = None,
             output_cap: Optional[int] = None, fresh_interpreter: bool = False) -> ExecResult:
        """Run ``code`` once on the fleet's fncall backend and return what it did, like ``Sandbox.exec``.

        Each call runs in a fresh process in a fresh working directory of a warm worker (no network, the
        ``memory`` limit, ``timeout`` seconds); nothing it leaves is seen by the next call. ``files`` maps paths
        relative to that working directory to their bytes (str is encoded as UTF-8). ``image`` defaults to the
        node's fncall image. When no worker frees up in time the call raises CapacityError (``retry_after``).
        Python calls are forks of the worker's warm interpreter and share its hash seed; ``fresh_interpreter``
        runs the call in an interpreter started for it alone (its own hash seed, nothing preloaded), at the
        cost of an interpreter start.
        """
        body = v.call_body(code, language, stdin, timeout, memory, files, image, output_cap, fresh_interpreter)
        wait = Sandbox._exec_wait(timeout, self._transport.timeout)
        doc = self._transport.call("POST", "/v1/call", payload=body, timeout=wait)
        return _ops.exec_result(doc, "call")

    def snapshots(self) -> List[Snapshot]:
        """Every snapshot in the fleet's snapshot store, by name."""
        doc = self._transport.call("GET", "/v1/snapshots")
        return [Snapshot(self, s) for s in _ops.snapshot_docs(doc)]

    def snapshot(self, name: str) -> Snapshot:
        """The snapshot ``name``; NotFoundError if there is none."""
        return Snapshot(self, self._transport.call("GET", f"/v1/snapshots/{v.snapshot_name(name)}"))

    def delete_snapshot(self, name: Union[str, Snapshot]) -> bool:
        """Delete a snapshot (sandboxes restored from it keep running). Idempotent: False if it was already gone."""
        try:
            self._transport.call("DELETE", f"/v1/snapshots/{_ops.snapshot_ref(name)}")
        except NotFoundError:
            return False
        return True

    def layers(self) -> List[Dict[str, Any]]:
        """Manifests of the layers in the node's store."""
        doc = self._transport.call("GET", "/v1/layers")
        return list((doc or {}).get("layers") or [])

    def health(self) -> Dict[str, Any]:
        return self._transport.call("GET", "/healthz")

    def node(self) -> Dict[str, Any]:
        return self._transport.call("GET", "/v1/node")

    def metrics(self) -> str:
        return self._transport.request("GET", "/metrics").read().decode("utf-8", errors="replace")


from .session import Session  # noqa: E402  (session.py imports this module)

__all__ = ["Client", "Sandbox", "Session", "Snapshot", "ExecStream", "ExecResult", "DsecError"]
