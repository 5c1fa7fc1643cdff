"""The asyncio SDK: the same names as :mod:`pydsec`, with coroutines.

    import pydsec.aio

    async with pydsec.aio.Client() as client:
        async with client.create(image="debian:12") as sb:
            r = await sb.exec("echo hi")
            async for stream, text in sb.exec_stream("for i in 1 2 3; do echo $i; sleep 1; done"):
                print(stream, text)

Each blocking request runs on the client's own thread pool (``max_workers`` threads, so up to that many
requests are in flight at once without touching the loop's default executor) over the same keep-alive
connection pool as the synchronous client. The event loop itself never blocks.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Awaitable, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union

from . import _aio_stream
from . import _validate as v
from . import client as _sync
from . import session as _sync_session
from .errors import (AuthError, CapacityError, ConflictError, DsecConnectionError, DsecError, DsecTimeoutError,
                     InfraError, InvalidRequestError, NodeLostError, NotFoundError, ServerError, TooLargeError,
                     UnavailableError, UnsupportedError)
from .results import ExecResult

T = TypeVar("T")
_END = object()

__all__ = [
    "Client", "Sandbox", "Session", "ExecStream", "ExecResult", "DsecError", "InvalidRequestError", "TooLargeError",
    "AuthError", "NotFoundError", "ConflictError", "CapacityError", "UnsupportedError", "DsecTimeoutError",
    "ServerError", "DsecConnectionError", "InfraError", "UnavailableError", "NodeLostError",
]


class ExecStream:
    """Async iterator of ``(stream, text)`` chunks; ``result`` is set once the iteration ends."""

    def __init__(self, client: "Client", start: Callable[[], _sync.ExecStream]):
        self._client = client
        self._start = start
        self._stream: Optional[_sync.ExecStream] = None
        self._closed = False

    @property
    def result(self) -> Optional[ExecResult]:
        return self._stream.result if self._stream is not None else None

    def _next(self) -> Any:
        if self._closed:
            return _END
        if self._stream is None:
            self._stream = self._start()
        try:
            return next(self._stream)
        except StopIteration:
            return _END

    def __aiter__(self) -> "ExecStream":
        return self

    async def __anext__(self) -> Tuple[str, str]:
        item = await self._client._run(self._next)
        if item is _END:
            raise StopAsyncIteration
        return item

    async def wait(self) -> ExecResult:
        async for _ in self:
            pass
        if self.result is None:
            raise ServerError("exec stream was closed before its result arrived")
        return self.result

    async def aclose(self) -> None:
        self._closed = True
        if self._stream is not None:
            await self._client._run(self._stream.close)

    async def __aenter__(self) -> "ExecStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


class Sandbox:
    """Async handle to one sandbox; see :class:`pydsec.Sandbox` for the meaning of each method."""

    def __init__(self, client: "Client", sync_sandbox: _sync.Sandbox):
        self._client = client
        self._sync = sync_sandbox
        self.id = sync_sandbox.id

    def __repr__(self) -> str:
        return f"<pydsec.aio.Sandbox {self.id} {self.state or '?'}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sandbox) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    @property
    def cached_info(self) -> Optional[Dict[str, Any]]:
        return self._sync.cached_info

    @property
    def state(self) -> Optional[str]:
        return self._sync.state

    @property
    def labels(self) -> Dict[str, str]:
        return self._sync.labels

    async def info(self) -> Dict[str, Any]:
        return await self._client._run(self._sync.info)

    async def pause(self) -> Dict[str, Any]:
        return await self._client._run(self._sync.pause)

    async def resume(self) -> Dict[str, Any]:
        return await self._client._run(self._sync.resume)

    async def set_network(self, egress: List[str]) -> Dict[str, Any]:
        v.egress_list(egress)
        return await self._client._run(self._sync.set_network, egress)

    async def set_protect(self, paths: List[str]) -> Dict[str, Any]:
        v.protect_list(paths)
        return await self._client._run(self._sync.set_protect, paths)

    async def violations(self) -> List[Dict[str, Any]]:
        return await self._client._run(self._sync.violations)

    async def destroy(self) -> bool:
        return await self._client._run(self._sync.destroy)

    async def __aenter__(self) -> "Sandbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        # Destroy even when the body was cancelled: shield the request from the cancellation.
        await asyncio.shield(self.destroy())

    async def exec(self, cmd: _sync.Cmd, timeout: Optional[float] = None, cwd: Optional[str] = None,
                   env: Optional[Dict[str, str]] = None, stdin: Union[None, str, bytes] = None,
                   output_cap: Optional[int] = None) -> ExecResult:
        return await self._client._run(self._sync.exec, cmd, timeout=timeout, cwd=cwd, env=env, stdin=stdin,
                                       output_cap=output_cap)

    def exec_stream(self, cmd: _sync.Cmd, timeout: Optional[float] = None, cwd: Optional[str] = None,
                    env: Optional[Dict[str, str]] = None, stdin: Union[None, bool, str, bytes] = None,
                    output_cap: Optional[int] = None) -> Any:
        """Use with ``async for``. Arguments are checked now; the request starts on the first iteration.
        ``stdin=True`` streams its stdin: ``async with sb.exec_stream(cmd, stdin=True) as s:`` starts the
        command, then ``await s.stdin.write(data)`` and ``await s.stdin.close()`` (EOF)."""
        if stdin is True:
            body = v.exec_body(cmd, timeout, cwd, env, None, output_cap)
            body["stdin_stream"] = True
            t = self._sync._client._transport
            return _aio_stream.AsyncExecStream(t.endpoint, t._token, self._sync._path, body,
                                               _sync.Sandbox._exec_wait(timeout, t.timeout), t.connect_timeout, True)
        v.exec_body(cmd, timeout, cwd, env, stdin, output_cap)
        start = functools.partial(self._sync.exec_stream, cmd, timeout=timeout, cwd=cwd, env=env, stdin=stdin,
                                  output_cap=output_cap)
        return ExecStream(self._client, start)

    async def terminal(self, cmd: Optional[_sync.Cmd] = None, rows: int = 24, cols: int = 80,
                       timeout: Optional[float] = None, cwd: Optional[str] = None,
                       term: Optional[str] = None) -> "_aio_stream.AsyncTerminal":
        """See :meth:`pydsec.Sandbox.terminal`; the session runs on the loop's own streams."""
        from . import _websocket
        if cwd is not None:
            v.abs_path("cwd", cwd)
        target = _websocket.terminal_target(self._sync._path, cmd, rows, cols, timeout, cwd, term)
        t = self._sync._client._transport
        return await _aio_stream.open_terminal(t.endpoint, t._token, target, t.connect_timeout, t.timeout)

    async def write_file(self, path: str, data: Union[bytes, str], mode: Union[None, int, str] = None) -> Dict:
        return await self._client._run(self._sync.write_file, path, data, mode)

    async def write_file_from(self, path: str, local_path: str, mode: Union[None, int, str] = None) -> Dict:
        return await self._client._run(self._sync.write_file_from, path, local_path, mode)

    async def read_file(self, path: str) -> bytes:
        return await self._client._run(self._sync.read_file, path)

    async def read_file_to(self, path: str, local_path: str) -> int:
        return await self._client._run(self._sync.read_file_to, path, local_path)

    async def list_dir(self, path: str) -> List[Dict[str, Any]]:
        return await self._client._run(self._sync.list_dir, path)

    async def stat(self, path: str) -> Dict[str, Any]:
        return await self._client._run(self._sync.stat, path)

    async def exists(self, path: str) -> bool:
        return await self._client._run(self._sync.exists, path)

    async def remove(self, path: str, recursive: bool = False) -> Dict[str, Any]:
        return await self._client._run(self._sync.remove, path, recursive)

    async def upload(self, local_dir: str, remote_dir: str) -> Dict[str, Any]:
        return await self._client._run(self._sync.upload, local_dir, remote_dir)

    async def download(self, remote_dir: str, local_dir: str) -> int:
        return await self._client._run(self._sync.download, remote_dir, local_dir)


class _CreateCall:
    """What ``Client.create`` returns: await it for a Sandbox, or ``async with`` it to destroy on exit."""

    def __init__(self, client: "Client", kwargs: Dict[str, Any]):
        self._client = client
        self._kwargs = kwargs
        self._sandbox: Optional[Sandbox] = None
        # Awaited before the create (a session's create first makes sure its session exists).
        self._before: Optional[Callable[[], Awaitable[Any]]] = None

    async def _make(self) -> Sandbox:
        if self._before is not None:
            await self._before()
        return await self._client._create(self._kwargs)

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
        self._sync = _sync_session.Session(client._sync, name, lease, retention)
        self._started = False
        self._task: Optional["asyncio.Task[None]"] = None

    def __repr__(self) -> str:
        state = (self._sync.cached_info or {}).get("state", "?")
        return f"<pydsec.aio.Session {self.name} {state} lease={self.lease}>"

    @property
    def name(self) -> str:
        return self._sync.name

    @property
    def lease(self) -> float:
        return self._sync.lease

    @property
    def retention(self) -> Optional[float]:
        return self._sync.retention

    @property
    def cached_info(self) -> Optional[Dict[str, Any]]:
        return self._sync.cached_info

    @property
    def last_error(self) -> Optional[DsecError]:
        return self._sync.last_error

    @property
    def renewing(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _ensure(self) -> "Session":
        if not self._started:
            await self._client._run(self._sync._put)
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
        return await self._client._run(self._sync.renew)

    async def info(self) -> Dict[str, Any]:
        return await self._client._run(self._sync.info)

    async def sandboxes(self) -> List[Sandbox]:
        return [Sandbox(self._client, sb) for sb in await self._client._run(self._sync.sandboxes)]

    def create(self, image: str, **kwargs: Any) -> _CreateCall:
        """Same as ``client.create(...)`` (await it or ``async with`` it), in this session."""
        if "session" in kwargs:
            v._fail("session.create() sets 'session' itself")
        call = self._client.create(image, session=self.name, **kwargs)
        call._before = self._ensure
        return call

    async def attach(self, lease: Optional[float] = None) -> List[Sandbox]:
        """Renew (creating the session if it is gone), return its sandboxes and keep renewing."""
        if not self._started:
            await self._client._run(self._sync._put)
            self._started = True
        sandboxes = await self._client._run(self._sync._attach, lease)
        self._start_renewal()
        return [Sandbox(self._client, sb) for sb in sandboxes]

    def _start_renewal(self) -> None:
        if not self.renewing:
            self._task = asyncio.get_running_loop().create_task(self._renew_loop(),
                                                                name=f"pydsec-session-{self.name}")

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self._sync._interval())
            try:
                await self._client._run(self._sync._put)
                self._sync.last_error = None
            except ConflictError as e:  # being deleted
                self._sync.last_error = e
                return
            except DsecError as e:
                self._sync.last_error = e

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
        return await self._client._run(self._sync.destroy)


class Client:
    """Async connection to a dsec fleet; same discovery rules and arguments as :class:`pydsec.Client`."""

    def __init__(self, endpoint: Union[None, str, Sequence[str]] = None, token: Optional[str] = None,
                 fleet: Optional[str] = None, timeout: Optional[float] = 120.0, max_workers: int = 64,
                 max_idle_connections: int = 32, connect_timeout: Optional[float] = 5.0,
                 direct: Optional[bool] = None):
        self._sync = _sync.Client(endpoint, token, fleet, timeout=timeout, max_idle_connections=max_idle_connections,
                                  connect_timeout=connect_timeout, direct=direct)
        self.fleet = self._sync.fleet
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="pydsec-aio")

    @property
    def endpoint(self) -> str:
        """The gateway requests go to now (the one that last worked)."""
        return self._sync.endpoint

    @property
    def endpoints(self) -> List[str]:
        return self._sync.endpoints

    def __repr__(self) -> str:
        return f"<pydsec.aio.Client {self.endpoint} fleet={self.fleet!r}>"

    @property
    def sync(self) -> _sync.Client:
        """The synchronous client underneath (shares the connection pool)."""
        return self._sync

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    async def _create(self, kwargs: Dict[str, Any]) -> Sandbox:
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._executor, functools.partial(self._sync.create, **kwargs))
        try:
            sync_sb = await asyncio.shield(future)
        except asyncio.CancelledError:
            # The request is already on its way; if it succeeds nobody would own the sandbox, so destroy it.
            future.add_done_callback(self._destroy_orphan)
            raise
        return Sandbox(self, sync_sb)

    def _destroy_orphan(self, future: "asyncio.Future[_sync.Sandbox]") -> None:
        if future.cancelled() or future.exception() is not None:
            return
        sb = future.result()

        def destroy() -> None:
            try:
                sb.destroy()
            except DsecError:
                pass

        # A plain (non-daemon) thread, not the executor: closing the client must not cancel this cleanup, and
        # the interpreter waits for it at exit.
        threading.Thread(target=destroy, name=f"pydsec-destroy-{sb.id}").start()

    def create(self, image: str, backend: str = "container", cpus: Optional[float] = None,
               memory: Union[None, int, str] = None, disk: Union[None, int, str] = None, pids: Optional[int] = None,
               timeout: Optional[float] = None, idle_timeout: Optional[float] = None,
               env: Optional[Dict[str, str]] = None, labels: Optional[Dict[str, str]] = None,
               network: Union[None, str, Dict[str, List[str]]] = None, session: Optional[str] = None,
               qos: Optional[str] = None, protect: Optional[List[str]] = None) -> _CreateCall:
        """``sb = await client.create(...)`` or ``async with client.create(...) as sb:``."""
        kwargs = dict(image=image, backend=backend, cpus=cpus, memory=memory, disk=disk, pids=pids, timeout=timeout,
                      idle_timeout=idle_timeout, env=env, labels=labels, network=network, session=session, qos=qos,
                      protect=protect)
        v.create_body(**kwargs)  # argument errors surface at the call, not at the await
        return _CreateCall(self, kwargs)

    def session(self, name: str, lease: float = 60, retention: Optional[float] = None) -> Session:
        """A session handle (arguments checked now); ``await`` it to create/renew it and start renewing."""
        return Session(self, name, lease, retention)

    async def sessions(self) -> List[Dict[str, Any]]:
        return await self._run(self._sync.sessions)

    def sandbox(self, sandbox_id: str) -> Sandbox:
        return Sandbox(self, self._sync.sandbox(sandbox_id))

    async def get(self, sandbox_id: str) -> Sandbox:
        return Sandbox(self, await self._run(self._sync.get, sandbox_id))

    async def list(self, labels: Optional[Dict[str, str]] = None) -> List[Sandbox]:
        return [Sandbox(self, sb) for sb in await self._run(self._sync.list, labels)]

    async def call(self, code: str, language: str = "python", stdin: Union[None, str, bytes] = None,
                   timeout: float = 10, memory: Union[int, str] = "256M",
                   files: Optional[Mapping[str, Union[bytes, str]]] = None, image: Optional[str] = None,
                   output_cap: Optional[int] = None, fresh_interpreter: bool = False) -> ExecResult:
        """See :meth:`pydsec.Client.call`. Up to ``max_workers`` calls run at once per client."""
        # errors at the call
        v.call_body(code, language, stdin, timeout, memory, files, image, output_cap, fresh_interpreter)
        return await self._run(self._sync.call, code, language=language, stdin=stdin, timeout=timeout,
                               memory=memory, files=files, image=image, output_cap=output_cap,
                               fresh_interpreter=fresh_interpreter)

    async def layers(self) -> List[Dict[str, Any]]:
        return await self._run(self._sync.layers)

    async def health(self) -> Dict[str, Any]:
        return await self._run(self._sync.health)

    async def node(self) -> Dict[str, Any]:
        return await self._run(self._sync.node)

    async def metrics(self) -> str:
        return await self._run(self._sync.metrics)

    async def aclose(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._sync.close()

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._sync.close()

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()
