"""The direct data path: a sandbox's exec, files and tar streams go straight to the node its id names.

A fleet's sandbox ids are ``<node>-<hex>`` and its gateways publish the node table (``GET /v1/fleet/nodes``: name,
endpoint, state). Every node accepts the fleet's bearer token, the one the client already holds, so the data
of a sandbox need not pass through a gateway. The table is fetched from the gateway when first needed and again
when an id names a node it does not list (at most every few seconds). The gateway stays the path for
everything else (creates, info, pause/resume, destroy, listings, sessions) and is the fallback here: a node the
table calls lost, or whose endpoint cannot be connected to, is asked about through the gateway, which answers
for it (NodeLostError for a lost node). A node whose connection failed is left alone for a while.

A gateway that does not know fleet routes (a single ``dsec serve``) answers 404: the direct path then stays off.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, Optional, Tuple

from ._http import _DEFAULT, Body, ConnectFailedError, Query, Response, Transport, call_json
from .errors import AuthError, DsecError, NotFoundError

_REFRESH_SECONDS = 3.0  # the node table is fetched again at most this often
_SHUNNED_SECONDS = 10.0  # a node that could not be connected to goes through the gateway this long


def node_of(sandbox_id: str) -> str:
    """The node a fleet sandbox id names ("n2-3fa9..." -> "n2"), "" when it names none."""
    node, sep, rest = sandbox_id.rpartition("-")
    return node if sep and node and rest else ""


class NodeTable:
    """The gateway's node table as the client knows it, and which nodes it leaves alone for now: the state both
    data paths (this module's and the asyncio one's) keep, without their I/O."""

    def __init__(self, enabled: bool):
        self._enabled = enabled
        self._lock = threading.Lock()
        self._nodes: Dict[str, Tuple[str, str]] = {}  # name -> (endpoint, state)
        self._fetched_at = -1e9
        self._shunned: Dict[str, float] = {}  # endpoint -> until (monotonic)

    @property
    def enabled(self) -> bool:
        return self._enabled

    def needs_fetch(self, sandbox_id: str) -> bool:
        """True when the table must be fetched for this id (its node is unknown) and may be now: the caller then
        fetches GET /v1/fleet/nodes from the gateway and hands the answer to fetched() or fetch_failed()."""
        node = node_of(sandbox_id)
        if not self._enabled or not node:
            return False
        now = time.monotonic()
        with self._lock:
            if node in self._nodes or now - self._fetched_at < _REFRESH_SECONDS:
                return False
            self._fetched_at = now
            return True

    def fetched(self, doc: Any) -> None:
        nodes = {}
        for n in (doc or {}).get("nodes") or []:
            if isinstance(n, dict) and isinstance(n.get("name"), str) and isinstance(n.get("endpoint"), str):
                nodes[n["name"]] = (n["endpoint"], str(n.get("state", "")))
        with self._lock:
            self._nodes = nodes

    def fetch_failed(self, error: DsecError) -> None:
        if isinstance(error, (NotFoundError, AuthError)):
            self._enabled = False  # not a fleet gateway: everything goes through it
        # else the gateway is busy or failing over: try again later, the gateway path still works

    def endpoint_of(self, sandbox_id: str) -> Optional[str]:
        """The endpoint of the sandbox's node, or None to go through the gateway."""
        if not self._enabled:
            return None
        with self._lock:
            known = self._nodes.get(node_of(sandbox_id))
            if known is None or known[1] == "lost" or self._shunned.get(known[0], 0) > time.monotonic():
                return None
            return known[0]

    def shun(self, endpoint: str) -> None:
        """The endpoint could not be connected to: the gateway carries its sandboxes' data for a while."""
        with self._lock:
            self._shunned[endpoint] = time.monotonic() + _SHUNNED_SECONDS
            self._fetched_at = -1e9  # the table may have changed (a node restarted elsewhere)


class DataPath:
    def __init__(self, gateway: Transport, token: str, enabled: bool, max_idle: int):
        self._gateway = gateway
        self._token = token
        self._max_idle = max_idle
        self._table = NodeTable(enabled)
        self._lock = threading.Lock()
        self._transports: Dict[str, Transport] = {}  # endpoint -> its transport

    @property
    def enabled(self) -> bool:
        return self._table.enabled

    def close(self) -> None:
        with self._lock:
            transports, self._transports = list(self._transports.values()), {}
        for t in transports:
            t.close()

    def node_transport(self, sandbox_id: str) -> Optional[Transport]:
        """The transport to the sandbox's own node, or None to go through the gateway."""
        if self._table.needs_fetch(sandbox_id):
            try:
                self._table.fetched(self._gateway.call("GET", "/v1/fleet/nodes", timeout=10))
            except DsecError as e:
                self._table.fetch_failed(e)
        endpoint = self._table.endpoint_of(sandbox_id)
        if endpoint is None:
            return None
        with self._lock:
            t = self._transports.get(endpoint)
            if t is None:
                t = Transport(endpoint, self._token, timeout=self._gateway.timeout, max_idle=self._max_idle,
                              connect_timeout=self._gateway.connect_timeout)
                self._transports[endpoint] = t
            return t

    def request(self, sandbox_id: str, method: str, path: str, query: Optional[Query] = None, body: Body = None,
                headers: Optional[Dict[str, str]] = None, timeout: Any = _DEFAULT) -> Response:
        node = self.node_transport(sandbox_id)
        if node is not None:
            rewind = body.tell() if body is not None and hasattr(body, "tell") else None
            try:
                return node.request(method, path, query, body, headers, timeout)
            except ConnectFailedError:
                self._table.shun(node.endpoint)  # nothing was sent: the gateway gets the same request
                if rewind is not None:
                    body.seek(rewind)
        return self._gateway.request(method, path, query, body, headers, timeout)


class SandboxRoute:
    """The Transport-like view of DataPath for one sandbox (request/call/timeout), used by Sandbox's data
    methods."""

    def __init__(self, path: DataPath, gateway: Transport, sandbox_id: str):
        self._path = path
        self._gateway = gateway
        self._id = sandbox_id

    @property
    def timeout(self) -> Optional[float]:
        return self._gateway.timeout

    def request(self, method: str, path: str, query: Optional[Query] = None, body: Body = None,
                headers: Optional[Dict[str, str]] = None, timeout: Any = _DEFAULT) -> Response:
        return self._path.request(self._id, method, path, query, body, headers, timeout)

    def call(self, method: str, path: str, query: Optional[Query] = None, payload: Any = None,
             timeout: Any = _DEFAULT) -> Any:
        return call_json(self.request, method, path, query, payload, timeout)
