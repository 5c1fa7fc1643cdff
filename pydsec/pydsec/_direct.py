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


class DataPath:
    def __init__(self, gateway: Transport, token: str, enabled: bool, max_idle: int):
        self._gateway = gateway
        self._token = token
        self._enabled = enabled
        self._max_idle = max_idle
        self._lock = threading.Lock()
        self._nodes: Dict[str, Tuple[str, str]] = {}  # name -> (endpoint, state)
        self._fetched_at = -1e9
        self._transports: Dict[str, Transport] = {}  # endpoint -> its transport
        self._shunned: Dict[str, float] = {}  # endpoint -> until (monotonic)

    @property
    def enabled(self) -> bool:
        return self._enabled

    def close(self) -> None:
        with self._lock:
            transports, self._transports = list(self._transports.values()), {}
        for t in transports:
            t.close()

    def _refresh(self) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._fetched_at < _REFRESH_SECONDS:
                return
            self._fetched_at = now
        try:
            doc = self._gateway.call("GET", "/v1/fleet/nodes", timeout=10)
        except (NotFoundError, AuthError):
            self._enabled = False  # not a fleet gateway: everything goes through it
            return
        except DsecError:
            return  # the gateway is busy or failing over: try again later, the gateway path still works
        nodes = {}
        for n in (doc or {}).get("nodes") or []:
            if isinstance(n, dict) and isinstance(n.get("name"), str) and isinstance(n.get("endpoint"), str):
                nodes[n["name"]] = (n["endpoint"], str(n.get("state", "")))
        with self._lock:
            self._nodes = nodes

    def node_transport(self, sandbox_id: str) -> Optional[Transport]:
        """The transport to the sandbox's own node, or None to go through the gateway."""
        if not self._enabled:
            return None
        node = node_of(sandbox_id)
        if not node:
            return None
        with self._lock:
            known = self._nodes.get(node)
        if known is None:
            self._refresh()
            with self._lock:
                known = self._nodes.get(node)
        if known is None or known[1] == "lost":
            return None
        endpoint = known[0]
        with self._lock:
            if self._shunned.get(endpoint, 0) > time.monotonic():
                return None
            t = self._transports.get(endpoint)
            if t is None:
                t = Transport(endpoint, self._token, timeout=self._gateway.timeout, max_idle=self._max_idle,
                              connect_timeout=self._gateway.connect_timeout)
                self._transports[endpoint] = t
            return t

    def _shun(self, endpoint: str) -> None:
        with self._lock:
            self._shunned[endpoint] = time.monotonic() + _SHUNNED_SECONDS
            self._fetched_at = -1e9  # the table may have changed (a node restarted elsewhere)

    def request(self, sandbox_id: str, method: str, path: str, query: Optional[Query] = None, body: Body = None,
                headers: Optional[Dict[str, str]] = None, timeout: Any = _DEFAULT) -> Response:
        node = self.node_transport(sandbox_id)
        if node is not None:
            rewind = body.tell() if body is not None and hasattr(body, "tell") else None
            try:
                return node.request(method, path, query, body, headers, timeout)
            except ConnectFailedError:
                self._shun(node.endpoint)  # nothing was sent: the gateway gets the same request
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
