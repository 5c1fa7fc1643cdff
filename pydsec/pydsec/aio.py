"""The asyncio SDK: the same names, arguments, results and errors as :mod:`pydsec`, with coroutines.

    import pydsec.aio

    async with pydsec.aio.Client() as client:
        async with client.create(image="debian:12") as sb:
            r = await sb.exec("echo hi")
            async for stream, text in sb.exec_stream("for i in 1 2 3; do echo $i; sleep 1; done"):
                print(stream, text)

Requests run on asyncio's own sockets (pydsec._aio_http: keep-alive HTTP/1.1, a connection pool per endpoint,
streamed and chunked responses, per-request timeouts); no request takes a thread, so one process can hold
thousands of execs and exec streams at once. ``max_in_flight`` (default 1024) is a hard cap on the client's
requests in flight: over it, a request waits for one to finish (first come, first served) and nothing is dropped;
an open exec stream counts until it ends or is closed. Gateways, failover and the direct data path to a
sandbox's node work as in the synchronous client (pydsec._wire, pydsec._direct).

Threads only do local file work that would stall the loop: packing a directory for ``upload`` and unpacking a
``download`` (``max_workers`` threads).
"""

from __future__ import annotations

import asyncio
import functools
import os
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Awaitable, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple, TypeVar, Union

from . import _config, _ops, _tar
from . import snapshot as _snapshot
from . import _aio_stream, _websocket
from . import _validate as v
from . import client as _sync
from ._aio_direct import AsyncDataPath, AsyncSandboxRoute
from ._aio_http import AsyncResponse, AsyncTransport, InFlight
from ._wire import json_body
from .errors import (AuthError, CapacityError, ConflictError, DsecConnectionError, DsecError, DsecTimeoutError,
                     InfraError, InvalidRequestError, NodeLostError, NotFoundError, ServerError, TooLargeError,
                     UnavailableError, UnsupportedError)
from .results import ExecResult

T = TypeVar("T")
Cmd = _sync.Cmd
_COPY_BUFSIZE = 256 * 1024
DEFAULT_MAX_IN_FLIGHT = 1024
# How long aclose() waits for the destroys of sandboxes whose create was cancelled.
_CLEANUP_WAIT = 30.0

__all__ = [
    "Client", "Sandbox", "Session", "Snapshot", "ExecStream", "ExecResult", "DsecError", "InvalidRequestError", "TooLargeError",
    "AuthError", "NotFoundError", "ConflictError", "CapacityError", "UnsupportedError", "DsecTimeoutError",
    "ServerError", "DsecConnectionError", "InfraError", "UnavailableError", "NodeLostError",
]


class ExecStream:
    """Async iterator of ``(stream, text)`` chunks; ``result`` is set once the iteration ends. The request starts
    on the first iteration (or ``wait()``); ``aclose()`` (or leaving ``async with``) abandons the stream."""

    def __init__(self, start: Callable[[], Awaitable[AsyncResponse]]):
        self._start: Optional[Callable[[], Awaitable[AsyncResponse]]] = start
        self._response: Optional[AsyncResponse] = None
        self._lines = _ops.StreamLines()
        self.result: Optional[ExecResult] = None

    def __aiter__(self) -> "ExecStream":
        return self

    async def __anext__(self) -> Tuple[str, str]:
        if self._start is not None:
            start, self._start = self._start, None
            self._response = await start()
        while True:
            response = self._response
            if response is None:
                raise StopAsyncIteration
            line = await response.readline()
            if not line:
                self._response = None
                if self.result is None:
                    raise ServerError("exec stream ended without a final result line")
                raise StopAsyncIteration
            try:
                item = self._lines.feed(line)
            except DsecError:
                self.close()
                raise
            if self._lines.result is not None:
                self.result = self._lines.result
                # Read the chunked terminator so that the connection goes back to the pool.
                self._response = None
                await response.read()
                raise StopAsyncIteration
            if item is not None:
                return item

    async def wait(self) -> ExecResult:
        async for _ in self:
            pass
        if self.result is None:
            raise ServerError("exec stream was closed before its result arrived")
        return self.result

    def close(self) -> None:
        self._start = None
        response, self._response = self._response, None
        if response is not None:
            response.close()

    async def aclose(self) -> None:
        self.close()

    async def __aenter__(self) -> "ExecStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()


class Snapshot(_snapshot.Snapshot):
    """See :class:`pydsec.Snapshot`; ``await snap.delete()``, ``snap.restore(...)`` is ``client.create(...)``."""

    async def delete(self) -> bool:  # type: ignore[override]
        return await self._client.delete_snapshot(self.name)


class Sandbox:
    """Async handle to one sandbox; see :class:`pydsec.Sandbox` for the meaning of each method."""

    def __init__(self, client: "Client", sandbox_id: str, info: Optional[Dict[str, Any]] = None):
        self._client = client
        self.id = v.sandbox_id(sandbox_id)
        self.cached_info: Optional[Dict[str, Any]] = info

    def __repr__(self) -> str:
        return f"<pydsec.aio.Sandbox {self.id} {self.state or '?'}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sandbox) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    @property
    def _path(self) -> str:
        return f"/v1/sandboxes/{self.id}"

    def _t(self) -> AsyncTransport:
        return self._client._transport

    def _d(self) -> AsyncSandboxRoute:
        """The data path (exec, files, tar): the sandbox's node directly when the client may, else the gateway."""
        return AsyncSandboxRoute(self._client._data_path, self._client._transport, self.id)

    @property
    def state(self) -> Optional[str]:
        return (self.cached_info or {}).get("state")

    @property
    def labels(self) -> Dict[str, str]:
        return dict((self.cached_info or {}).get("labels") or {})

    # -- lifecycle ----------------------------------------------------------------------------------------
    async def info(self) -> Dict[str, Any]:
        try:
            self.cached_info = await self._t().call("GET", self._path)
        except NodeLostError as e:
            self.cached_info = _ops.lost_info(self.id, self.cached_info, e)
        return self.cached_info

    async def pause(self) -> Dict[str, Any]:
        self.cached_info = await self._t().call("POST", self._path + "/pause")
        return self.cached_info

    async def resume(self) -> Dict[str, Any]:
        self.cached_info = await self._t().call("POST", self._path + "/resume")
        return self.cached_info

    async def set_timeout(self, seconds: Union[int, float]) -> Dict[str, Any]:
        payload = {"timeout": v.number("timeout", seconds)}
        self.cached_info = await self._t().call("PUT", self._path + "/timeout", payload=payload)
        return self.cached_info

    async def set_network(self, egress: List[str]) -> Dict[str, Any]:
        payload = {"egress": v.egress_list(egress)}
        self.cached_info = await self._t().call("PUT", self._path + "/network", payload=payload)
        return self.cached_info

    async def set_protect(self, paths: List[str]) -> Dict[str, Any]:
        payload = {"paths": v.protect_list(paths)}
        self.cached_info = await self._t().call("PUT", self._path + "/protect", payload=payload)
        return self.cached_info

    async def violations(self) -> List[Dict[str, Any]]:
        doc = await self._t().call("GET", self._path + "/violations")
        return list((doc or {}).get("violations") or [])

    async def snapshot(self, name: Optional[str] = None, processes: bool = False) -> Snapshot:
        """See :meth:`pydsec.Sandbox.snapshot`."""
        doc = await self._t().call("POST", self._path + "/snapshot", payload=v.snapshot_body(name, processes))
        return Snapshot(self._client, doc)

    async def fork(self, n: int = 1, processes: bool = False) -> List["Sandbox"]:
        """See :meth:`pydsec.Sandbox.fork`: ``n`` new sandboxes from this one's state now (``async with`` each)."""
        body = v.fork_body(n, processes)
        doc = await self._client._made_sandboxes(self._t().call("POST", self._path + "/fork", payload=body),
                                                 lambda d: [i["id"] for i in _ops.fork_answer(d, n)[1]])
        return [Sandbox(self._client, info["id"], info) for info in _ops.fork_answer(doc, n)[1]]

    async def destroy(self) -> bool:
        try:
            await self._t().call("DELETE", self._path)
        except NotFoundError:
            return False
        if self.cached_info is not None:
            self.cached_info = dict(self.cached_info, state="destroyed")
        return True

    async def __aenter__(self) -> "Sandbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        # Destroy even when the body was cancelled: shield the request from the cancellation.
        await asyncio.shield(self.destroy())

    # -- exec ---------------------------------------------------------------------------------------------
    async def exec(self, cmd: Cmd, timeout: Optional[float] = None, cwd: Optional[str] = None,
                   env: Optional[Dict[str, str]] = None, stdin: Union[None, str, bytes] = None,
                   output_cap: Optional[int] = None) -> ExecResult:
        body = v.exec_body(cmd, timeout, cwd, env, stdin, output_cap)
        doc = await self._d().call("POST", self._path + "/exec", payload=body,
                                   timeout=_ops.exec_wait(timeout, self._t().timeout))
        return _ops.exec_result(doc)

    def exec_stream(self, cmd: Cmd, timeout: Optional[float] = None, cwd: Optional[str] = None,
                    env: Optional[Dict[str, str]] = None, stdin: Union[None, bool, str, bytes] = None,
                    output_cap: Optional[int] = None) -> Any:
        """Use with ``async for``. Arguments are checked now; the request starts on the first iteration.
        ``stdin=True`` streams its stdin: ``async with sb.exec_stream(cmd, stdin=True) as s:`` starts the
        command, then ``await s.stdin.write(data)`` and ``await s.stdin.close()`` (EOF)."""
        if stdin is True:
            streamed = v.exec_body(cmd, timeout, cwd, env, None, output_cap)
            streamed["stdin_stream"] = True
            t = self._t()
            return _aio_stream.AsyncExecStream(t.endpoint, t._token, self._path, streamed,
                                               _ops.exec_wait(timeout, t.timeout), t.connect_timeout, True)
        body = v.exec_body(cmd, timeout, cwd, env, stdin, output_cap)
        payload, headers = json_body(body)
        start = functools.partial(self._d().request, "POST", self._path + "/exec/stream", body=payload,
                                  headers=headers, timeout=_ops.exec_wait(timeout, self._t().timeout))
        return ExecStream(start)

    async def terminal(self, cmd: Optional[Cmd] = None, rows: int = 24, cols: int = 80,
                       timeout: Optional[float] = None, cwd: Optional[str] = None,
                       term: Optional[str] = None) -> "_aio_stream.AsyncTerminal":
        """See :meth:`pydsec.Sandbox.terminal`; the session runs on the loop's own streams."""
        if cwd is not None:
            v.abs_path("cwd", cwd)
        target = _websocket.terminal_target(self._path, cmd, rows, cols, timeout, cwd, term)
        t = self._t()
        return await _aio_stream.open_terminal(t.endpoint, t._token, target, t.connect_timeout, t.timeout)

    # -- files --------------------------------------------------------------------------------------------
    async def write_file(self, path: str, data: Union[bytes, str], mode: Union[None, int, str] = None) -> Dict:
        query = _ops.file_query(path, mode)
        data = _ops.file_data(data)
        return await _put_json(self._d(), "PUT", self._path + "/files", query, data, "application/octet-stream")

    async def write_file_from(self, path: str, local_path: str, mode: Union[None, int, str] = None) -> Dict:
        """Stream a local file to path without reading it into memory."""
        query = _ops.file_query(path, mode)
        with open(local_path, "rb") as f:
            return await _put_json(self._d(), "PUT", self._path + "/files", query, f, "application/octet-stream")

    async def read_file(self, path: str) -> bytes:
        v.abs_path("path", path)
        response = await self._d().request("GET", self._path + "/files", [("path", path)])
        try:
            return await response.read()
        finally:
            response.close()

    async def read_file_to(self, path: str, local_path: str) -> int:
        """Stream path into a local file (written next to it, then renamed). Returns the byte count."""
        v.abs_path("path", path)
        response = await self._d().request("GET", self._path + "/files", [("path", path)])
        return await _save(response, local_path)

    async def list_dir(self, path: str) -> List[Dict[str, Any]]:
        v.abs_path("path", path)
        doc = await self._d().call("GET", self._path + "/files/list", [("path", path)])
        return list((doc or {}).get("entries") or [])

    async def stat(self, path: str) -> Dict[str, Any]:
        v.abs_path("path", path)
        return await self._d().call("GET", self._path + "/files/stat", [("path", path)])

    async def exists(self, path: str) -> bool:
        try:
            await self.stat(path)
        except NotFoundError:
            return False
        return True

    async def remove(self, path: str, recursive: bool = False) -> Dict[str, Any]:
        return await self._d().call("DELETE", self._path + "/files", _ops.remove_query(path, recursive))

    async def upload(self, local_dir: str, remote_dir: str) -> Dict[str, Any]:
        """Copy the contents of local_dir into remote_dir (created if missing) as one tar stream."""
        v.abs_path("remote_dir", remote_dir)
        tmp = await self._client._local(_tar.pack_directory, local_dir)
        with tmp:
            return await _put_json(self._d(), "PUT", self._path + "/tar", [("path", remote_dir)], tmp,
                                             "application/x-tar")

    async def download(self, remote_dir: str, local_dir: str) -> int:
        """Copy the contents of remote_dir into local_dir. Returns the number of entries written.

        Members that would escape local_dir (absolute names, '..', outside links) raise UnsafeArchiveError.
        """
        v.abs_path("remote_dir", remote_dir)
        response = await self._d().request("GET", self._path + "/tar", [("path", remote_dir)])
        with tempfile.TemporaryFile(prefix="pydsec-download-") as tmp:
            try:
                while True:
                    chunk = await response.read(_COPY_BUFSIZE)
                    if not chunk:
                        break
                    tmp.write(chunk)
            finally:
                response.close()
            tmp.seek(0)
            return await self._client._local(_tar.extract_stream, tmp, local_dir)


async def _put_json(route: AsyncSandboxRoute, method: str, path: str, query: Any, body: Any, ctype: str) -> Any:
    """A request with a raw body (bytes or a local file) whose answer is JSON."""
    response = await route.request(method, path, query, body=body, headers={"Content-Type": ctype})
    try:
        return await response.json()
    finally:
        response.close()


async def _save(response: AsyncResponse, local_path: str) -> int:
    directory = os.path.dirname(os.path.abspath(local_path))
    fd, tmp = tempfile.mkstemp(prefix=".pydsec-", dir=directory)
    total = 0
    try:
        with os.fdopen(fd, "wb") as out:
            while True:
                chunk = await response.read(_COPY_BUFSIZE)
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


class _CreateCall:
    """What ``Client.create`` returns: await it for a Sandbox, or ``async with`` it to destroy on exit."""

    def __init__(self, client: "Client", body: Dict[str, Any]):
        self._client = client
        self._body = body
        self._sandbox: Optional[Sandbox] = None
        # Awaited before the create (a session's create first makes sure its session exists).
        self._before: Optional[Callable[[], Awaitable[Any]]] = None

    async def _make(self) -> Sandbox:
        if self._before is not None:
            await self._before()
        return await self._client._create(self._body)

    def __await__(self):
        return self._make().__await__()

    async def __aenter__(self) -> Sandbox:
        self._sandbox = await self._make()
        return self._sandbox

    async def __aexit__(self, *exc: Any) -> None:
        if self._sandbox is not None:
            await self._sandbox.__aexit__(*exc)


class Session:
    """Async session; see :class:`pydsec.Session`. ``client.session(...)`` makes no request by itself:

        session = await client.session("run-42", lease=60)      # PUT, then renewed by an asyncio task
        async with client.session("run-42", lease=60) as session: ...   # stops renewing on exit
        sandboxes = await client.session("run-42").attach()     # after a requeue

    The renewal task lives on the running event loop; ``await session.aclose()`` (or ``close()``) stops it.
    """

    def __init__(self, client: "Client", name: str, lease: float = 60, retention: Optional[float] = None):
        self._client = client
        self.name = v.session_name(name)
        self.lease = v.session_lease(lease)
        self.retention = None if retention is None else v.session_retention(retention)
        self.cached_info: Optional[Dict[str, Any]] = None
        self.last_error: Optional[DsecError] = None
        self._started = False
        self._task: Optional["asyncio.Task[None]"] = None

    def __repr__(self) -> str:
        state = (self.cached_info or {}).get("state", "?")
        return f"<pydsec.aio.Session {self.name} {state} lease={self.lease}>"

    @property
    def _path(self) -> str:
        return f"/v1/sessions/{self.name}"

    @property
    def renewing(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _put(self) -> Dict[str, Any]:
        body = _ops.session_body(self.lease, self.retention)
        self.cached_info = await self._client._transport.call("PUT", self._path, payload=body)
        return self.cached_info

    async def _ensure(self) -> "Session":
        if not self._started:
            await self._put()
            self._started = True
            self._start_renewal()
        return self

    def __await__(self):
        return self._ensure().__await__()

    async def __aenter__(self) -> "Session":
        return await self._ensure()

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def renew(self) -> Dict[str, Any]:
        return await self._put()

    async def info(self) -> Dict[str, Any]:
        self.cached_info = await self._client._transport.call("GET", self._path)
        return self.cached_info

    async def sandboxes(self) -> List[Sandbox]:
        ids = list((await self.info() or {}).get("sandboxes") or [])
        by_id = {sb.id: sb for sb in await self._client.list() if (sb.cached_info or {}).get("session") == self.name}
        return [by_id.get(i) or self._client.sandbox(i) for i in ids]

    def create(self, image: Optional[str] = None, **kwargs: Any) -> _CreateCall:
        """Same as ``client.create(...)`` (await it or ``async with`` it), in this session."""
        if "session" in kwargs:
            v._fail("session.create() sets 'session' itself")
        call = self._client.create(image, session=self.name, **kwargs)
        call._before = self._ensure
        return call

    async def attach(self, lease: Optional[float] = None) -> List[Sandbox]:
        """Renew (creating the session if it is gone), return its sandboxes and keep renewing."""
        if not self._started:
            await self._put()
            self._started = True
        if lease is not None:
            self.lease = v.session_lease(lease)
        doc = await self._client._transport.call("POST", self._path + "/attach", payload={"lease": self.lease})
        self.cached_info, infos = _ops.attach_answer(doc)
        self._start_renewal()
        return [Sandbox(self._client, info["id"], info) for info in infos]

    def _start_renewal(self) -> None:
        if not self.renewing:
            self._task = asyncio.get_running_loop().create_task(self._renew_loop(),
                                                                name=f"pydsec-session-{self.name}")

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(_ops.renew_interval(self.lease))
            try:
                await self._put()
                self.last_error = None
            except ConflictError as e:  # being deleted
                self.last_error = e
                return
            except DsecError as e:
                self.last_error = e

    def close(self) -> None:
        """Stop renewing (the sandboxes stay, and are paused when the lease lapses)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    async def destroy(self) -> int:
        """Stop renewing; destroy the session and its sandboxes."""
        await self.aclose()
        try:
            doc = await self._client._transport.call("DELETE", self._path)
        except NotFoundError:
            return 0
        return int((doc or {}).get("destroyed") or 0)


def _in_flight_limit(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        v._fail(f"max_in_flight must be a positive integer, got {value!r}")
    return value


class Client:
    """Async connection to a dsec fleet; same discovery rules and arguments as :class:`pydsec.Client`, plus:

    ``max_in_flight`` (default 1024): at most this many requests of this client are in flight at once (an open
    exec stream counts until it ends); more wait for a slot, in order, and none is dropped. It protects the
    fleet from a trainer that starts more work than it can take, and bounds the client's sockets.
    ``max_workers`` (default 4): threads for local file work only (packing an upload, unpacking a download).
    """

    def __init__(self, endpoint: Union[None, str, Sequence[str]] = None, token: Optional[str] = None,
                 fleet: Optional[str] = None, timeout: Optional[float] = 120.0, max_workers: int = 4,
                 max_idle_connections: int = 32, connect_timeout: Optional[float] = 5.0,
                 direct: Optional[bool] = None, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT):
        self.max_in_flight = _in_flight_limit(max_in_flight)
        cfg = _config.resolve(endpoint, token, fleet)
        self.fleet = cfg.fleet
        self._direct = cfg.launch_fleet if direct is None else direct
        self._options = dict(timeout=timeout, max_idle_connections=max_idle_connections,
                             connect_timeout=connect_timeout)
        self._cfg = cfg
        self._in_flight = InFlight(self.max_in_flight)
        self._transport = AsyncTransport(cfg.endpoints or [cfg.endpoint], cfg.token, self._in_flight,
                                         timeout=timeout, max_idle=max_idle_connections,
                                         connect_timeout=connect_timeout)
        self._data_path = AsyncDataPath(self._transport, cfg.token, self._direct, max_idle_connections,
                                        self._in_flight)
        self._max_workers = max_workers
        self._executor: Optional[ThreadPoolExecutor] = None
        self._sync: Optional[_sync.Client] = None
        self._cleanups: Set["asyncio.Future[Any]"] = set()

    @property
    def endpoint(self) -> str:
        """The gateway requests go to now (the one that last worked)."""
        return self._transport.endpoint

    @property
    def endpoints(self) -> List[str]:
        return self._transport.endpoints

    @property
    def in_flight(self) -> int:
        """Requests holding a slot of ``max_in_flight`` now (open exec streams included)."""
        return self._in_flight.count

    def __repr__(self) -> str:
        return f"<pydsec.aio.Client {self.endpoint} fleet={self.fleet!r}>"

    @property
    def sync(self) -> _sync.Client:
        """A synchronous client for the same fleet, token and options (made on first use; its own connections)."""
        if self._sync is None:
            self._sync = _sync.Client(list(self._cfg.endpoints or [self._cfg.endpoint]), self._cfg.token,
                                      self._cfg.fleet, direct=self._direct, **self._options)
        return self._sync

    async def _local(self, fn: Callable[..., T], *args: Any) -> T:
        """Local file work (tar packing and unpacking) on the client's threads, off the event loop."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=self._max_workers, thread_name_prefix="pydsec-aio")
        return await asyncio.get_running_loop().run_in_executor(self._executor, functools.partial(fn, *args))

    async def _create(self, body: Dict[str, Any]) -> Sandbox:
        info = await self._made_sandboxes(self._transport.call("POST", "/v1/sandboxes", payload=body),
                                          lambda d: [_ops.created_id(d)])
        return Sandbox(self, _ops.created_id(info), info)

    async def _made_sandboxes(self, request: Awaitable[Any], ids_of: Callable[[Any], List[str]]) -> Any:
        """The answer of a request that makes sandboxes (a create, a fork). If the caller is cancelled while it
        is on its way and it succeeds, nobody would own them: they are destroyed (``ids_of`` names them)."""
        task = asyncio.ensure_future(request)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            self._track(task)
            task.add_done_callback(functools.partial(self._destroy_orphans, ids_of))
            raise

    def _track(self, task: "asyncio.Future[Any]") -> None:
        """aclose() waits for this work (a cancelled create, the destroy of what it made)."""
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    def _destroy_orphans(self, ids_of: Callable[[Any], List[str]], task: "asyncio.Future[Any]") -> None:
        if task.cancelled() or task.exception() is not None:
            return
        try:
            ids = ids_of(task.result())
        except DsecError:
            return
        for sandbox_id in ids:
            self._track(asyncio.ensure_future(self._destroy_quietly(sandbox_id)))

    async def _destroy_quietly(self, sandbox_id: str) -> None:
        try:
            await self.sandbox(sandbox_id).destroy()
        except DsecError:
            pass
        except asyncio.CancelledError:
            # The loop is ending: finish on a plain (non-daemon) thread, which the interpreter waits for at exit.
            sync = self.sync

            def destroy() -> None:
                try:
                    sync.sandbox(sandbox_id).destroy()
                except DsecError:
                    pass

            threading.Thread(target=destroy, name=f"pydsec-destroy-{sandbox_id}").start()
            raise

    def create(self, image: Optional[str] = None, backend: Optional[str] = None, cpus: Optional[float] = None,
               memory: Union[None, int, str] = None, disk: Union[None, int, str] = None, pids: Optional[int] = None,
               timeout: Optional[float] = None, idle_timeout: Optional[float] = None,
               env: Optional[Dict[str, str]] = None, labels: Optional[Dict[str, str]] = None,
               network: Union[None, str, Dict[str, List[str]]] = None, session: Optional[str] = None,
               qos: Optional[str] = None, protect: Optional[List[str]] = None,
               snapshot: Union[None, str, _snapshot.Snapshot] = None) -> _CreateCall:
        """``sb = await client.create(...)`` or ``async with client.create(...) as sb:``; ``snapshot=`` restores
        one (see :meth:`pydsec.Client.create`)."""
        # argument errors surface at the call, not at the await
        body = _ops.create_body(snapshot, image, backend, cpus, memory, disk, pids, timeout, idle_timeout, env,
                                labels, network, session, qos, protect)
        return _CreateCall(self, body)

    def session(self, name: str, lease: float = 60, retention: Optional[float] = None) -> Session:
        """A session handle (arguments checked now); ``await`` it to create/renew it and start renewing."""
        return Session(self, name, lease, retention)

    async def sessions(self) -> List[Dict[str, Any]]:
        doc = await self._transport.call("GET", "/v1/sessions")
        return list((doc or {}).get("sessions") or [])

    def sandbox(self, sandbox_id: str) -> Sandbox:
        return Sandbox(self, sandbox_id)

    async def get(self, sandbox_id: str) -> Sandbox:
        sb = Sandbox(self, sandbox_id)
        await sb.info()
        return sb

    async def list(self, labels: Optional[Dict[str, str]] = None) -> List[Sandbox]:
        doc = await self._transport.call("GET", "/v1/sandboxes", _ops.label_query(labels))
        return [Sandbox(self, info["id"], info) for info in (doc or {}).get("sandboxes") or []]

    async def call(self, code: str, language: str = "python", stdin: Union[None, str, bytes] = None,
                   timeout: float = 10, memory: Union[int, str] = "256M",
                   files: Optional[Mapping[str, Union[bytes, str]]] = None, image: Optional[str] = None,
                   output_cap: Optional[int] = None, fresh_interpreter: bool = False) -> ExecResult:
        """See :meth:`pydsec.Client.call`."""
        body = v.call_body(code, language, stdin, timeout, memory, files, image, output_cap, fresh_interpreter)
        doc = await self._transport.call("POST", "/v1/call", payload=body,
                                         timeout=_ops.exec_wait(timeout, self._transport.timeout))
        return _ops.exec_result(doc, "call")

    async def snapshots(self) -> List[Snapshot]:
        doc = await self._transport.call("GET", "/v1/snapshots")
        return [Snapshot(self, s) for s in _ops.snapshot_docs(doc)]

    async def snapshot(self, name: str) -> Snapshot:
        return Snapshot(self, await self._transport.call("GET", f"/v1/snapshots/{v.snapshot_name(name)}"))

    async def delete_snapshot(self, name: Union[str, _snapshot.Snapshot]) -> bool:
        """See :meth:`pydsec.Client.delete_snapshot`."""
        try:
            await self._transport.call("DELETE", f"/v1/snapshots/{_ops.snapshot_ref(name)}")
        except NotFoundError:
            return False
        return True

    async def layers(self) -> List[Dict[str, Any]]:
        doc = await self._transport.call("GET", "/v1/layers")
        return list((doc or {}).get("layers") or [])

    async def health(self) -> Dict[str, Any]:
        return await self._transport.call("GET", "/healthz")

    async def node(self) -> Dict[str, Any]:
        return await self._transport.call("GET", "/v1/node")

    async def metrics(self) -> str:
        response = await self._transport.request("GET", "/metrics")
        try:
            return (await response.read()).decode("utf-8", errors="replace")
        finally:
            response.close()

    async def aclose(self) -> None:
        """Wait (up to 30 s) for cancelled creates to end and what they made to be destroyed, then close."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _CLEANUP_WAIT
        while True:
            pending = [t for t in self._cleanups if not t.done()]
            if not pending or loop.time() >= deadline:
                break
            await asyncio.wait(pending, timeout=deadline - loop.time())
        self.close()

    def close(self) -> None:
        self._transport.close()
        self._data_path.close()
        if self._executor is not None:
            self._executor.shutdown(wait=False)
        if self._sync is not None:
            self._sync.close()

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()
