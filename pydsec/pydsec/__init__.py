"""pydsec: the Python SDK of dsec (standard library only).

    import pydsec

    client = pydsec.Client()                      # DSEC_ENDPOINT/DSEC_TOKEN, else ~/.dsec/fleets/default.json
    with client.create(image="debian:12+python:3.11", memory="512M") as sb:
        r = sb.exec("python3 -c 'print(6*7)'", timeout=10)
        print(r.exit_code, r.stdout)

Sandboxes that must survive the trainer's preemption belong to a session (a lease renewed in the background):
``session = client.session("run-42", lease=60)``, ``session.create(...)``, and after a requeue
``client.session("run-42").attach()`` (see :mod:`pydsec.session`).

A sandbox's state can be kept and started again, on any node of the fleet: ``snap = sb.snapshot()``, then
``client.create(snapshot=snap)``; ``sb.fork(3)`` makes three copies at once (see :mod:`pydsec.snapshot`).

The asyncio flavour with the same names is :mod:`pydsec.aio`.

Errors derive from :class:`DsecError` (``.code``, ``.status``, ``.message``). Those that are the platform's fault
(capacity, timeouts, connection failures, server errors, an unavailable fleet, a lost node) derive from
:class:`InfraError`: a trainer masks such rollouts out of its reward statistics (see :mod:`pydsec.errors`).
The timeout and connection errors are called :class:`DsecTimeoutError` and :class:`DsecConnectionError` so that
they do not shadow the builtins; they also derive from the builtin ``TimeoutError`` and ``ConnectionError``.
"""

from .client import Client, ExecStream, Sandbox, StdinWriter
from ._websocket import Terminal
from .session import Session
from .snapshot import Snapshot
from .errors import (AuthError, CapacityError, ConflictError, DsecConnectionError, DsecError, DsecTimeoutError,
                     InfraError, InvalidRequestError, NodeLostError, NotFoundError, ServerError, TooLargeError,
                     UnavailableError, UnsupportedError)
from ._tar import UnsafeArchiveError
from .results import ExecResult

__version__ = "0.1.0"

__all__ = [
    "Client", "Sandbox", "Session", "Snapshot", "ExecStream", "StdinWriter", "Terminal", "ExecResult", "DsecError",
    "InvalidRequestError", "TooLargeError", "AuthError", "NotFoundError", "ConflictError", "CapacityError",
    "UnsupportedError", "DsecTimeoutError",
    "ServerError", "DsecConnectionError", "InfraError", "UnavailableError", "NodeLostError", "UnsafeArchiveError",
    "__version__",
]
