"""The direct data path of pydsec.aio: a sandbox's exec, files and tar streams go straight to its node, the
gateway being the fallback. The rule and its state (the node table, the nodes left alone for a while) are
_direct.NodeTable's, shared with the synchronous client; see _direct.py for what it does.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from ._aio_http import _DEFAULT, AsyncResponse, AsyncTransport, Body, InFlight, call_json
from ._direct import NodeTable
from ._wire import ConnectFailedError, Query
from .errors import DsecError


class AsyncDataPath:
    def __init__(self, gateway: AsyncTransport, token: str, enabled: bool, max_idle: int, in_flight: InFlight):
        self._gateway = gateway
        self._token = token
        self._max_idle = max_idle
        self._in_flight = in_flight
        self._table = NodeTable(enabled)
        self._transports: Dict[str, AsyncTransport] = {}  # endpoint -> its transport

    @property
    def enabled(self) -> bool:
        return self._table.enabled

    def close(self) -> None:
        transports, self._transports = list(self._transports.values()), {}
        for t in transports:
            t.close()

    async def node_transport(self, sandbox_id: str) -> Optional[AsyncTransport]:
        """The transport to the sandbox's own node, or None to go through the gateway."""
        if self._table.needs_fetch(sandbox_id):
            try:
                self._table.fetched(await self._gateway.call("GET", "/v1/fleet/nodes", timeout=10))
            except DsecError as e:
                self._table.fetch_failed(e)
        endpoint = self._table.endpoint_of(sandbox_id)
        if endpoint is None:
            return None
        t = self._transports.get(endpoint)
        if t is None:
            t = AsyncTransport(endpoint, self._token, self._in_flight, timeout=self._gateway.timeout,
                               max_idle=self._max_idle, connect_timeout=self._gateway.connect_timeout)
            self._transports[endpoint] = t
        return t

    async def request(self, sandbox_id: str, method: str, path: str, query: Optional[Query] = None,
                      body: Body = None, headers: Optional[Dict[str, str]] = None,
                      timeout: Any = _DEFAULT) -> AsyncResponse:
        node = await self.node_transport(sandbox_id)
        if node is not None:
            try:
                return await node.request(method, path, query, body, headers, timeout)
            except ConnectFailedError:
                self._table.shun(node.endpoint)  # nothing was sent: the gateway gets the same request
        return await self._gateway.request(method, path, query, body, headers, timeout)


class AsyncSandboxRoute:
    """The transport-like view of AsyncDataPath for one sandbox (request/call/timeout)."""

    def __init__(self, path: AsyncDataPath, gateway: AsyncTransport, sandbox_id: str):
        self._path = path
        self._gateway = gateway
        self._id = sandbox_id

    @property
    def timeout(self) -> Optional[float]:
        return self._gateway.timeout

    async def request(self, method: str, path: str, query: Optional[Query] = None, body: Body = None,
                      headers: Optional[Dict[str, str]] = None, timeout: Any = _DEFAULT) -> AsyncResponse:
        return await self._path.request(self._id, method, path, query, body, headers, timeout)

    async def call(self, method: str, path: str, query: Optional[Query] = None, payload: Any = None,
                   timeout: Any = _DEFAULT) -> Any:
        return await call_json(self.request, method, path, query, payload, timeout)
