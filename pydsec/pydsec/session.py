"""Sessions: sandboxes that survive the preemption of the trainer that made them.

    session = client.session("run-42", lease=60)        # PUT now, then renewed in the background
    sb = session.create(image="debian:12", memory="1G")  # same arguments as client.create
    ...
    # the trainer is preempted: nobody renews, the node pauses the session's sandboxes and keeps them

    sandboxes = client.session("run-42").attach()       # in the requeued trainer: the same sandboxes
    sandboxes[0].exec("cat /work/state")                 # the first request resumes each one

``session.close()`` (or leaving ``with session:``) stops renewing and leaves the sandboxes to the lease;
``session.destroy()`` destroys them and the session.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from . import _ops
from . import _validate as v
from .errors import ConflictError, DsecError, NotFoundError

if TYPE_CHECKING:
    from .client import Client, Sandbox

_MIN_RENEW_INTERVAL = _ops.MIN_RENEW_INTERVAL


class Session:
    """A named lease on the fleet; see :meth:`pydsec.Client.session`.

    ``last_error`` holds the last error of a background renewal (None after a successful one); renewal keeps
    trying after transient errors, so a trainer that loses the fleet for a moment renews once it is back.
    """

    def __init__(self, client: "Client", name: str, lease: float = 60, retention: Optional[float] = None):
        self._client = client
        self.name = v.session_name(name)
        self.lease = v.session_lease(lease)
        self.retention = None if retention is None else v.session_retention(retention)
        self.cached_info: Optional[Dict[str, Any]] = None
        self.last_error: Optional[DsecError] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        state = (self.cached_info or {}).get("state", "?")
        return f"<pydsec.Session {self.name} {state} lease={self.lease}>"

    @property
    def _path(self) -> str:
        return f"/v1/sessions/{self.name}"

    @property
    def renewing(self) -> bool:
        """True while the background renewal runs."""
        return self._thread is not None and self._thread.is_alive()

    # -- requests -----------------------------------------------------------------------------------------
    def _put(self) -> Dict[str, Any]:
        body = _ops.session_body(self.lease, self.retention)
        self.cached_info = self._client._transport.call("PUT", self._path, payload=body)
        return self.cached_info

    def renew(self) -> Dict[str, Any]:
        """Renew the lease now (creating the session if it is gone); returns the session object."""
        return self._put()

    def info(self) -> Dict[str, Any]:
        """The session object: name, lease, retention, state ("active"/"lapsed"), expires_unix, sandboxes."""
        self.cached_info = self._client._transport.call("GET", self._path)
        return self.cached_info

    def sandboxes(self) -> List["Sandbox"]:
        """Handles (with info) to the session's sandboxes. Does not renew the lease or resume anything."""
        ids = list((self.info() or {}).get("sandboxes") or [])
        by_id = {sb.id: sb for sb in self._client.list() if (sb.cached_info or {}).get("session") == self.name}
        return [by_id.get(i) or self._client.sandbox(i) for i in ids]

    def create(self, image: Optional[str] = None, **kwargs: Any) -> "Sandbox":
        """``client.create(...)`` for a sandbox that belongs to this session (``snapshot=`` restores one)."""
        if "session" in kwargs:
            v._fail("session.create() sets 'session' itself")
        return self._client.create(image, session=self.name, **kwargs)

    def _attach(self, lease: Optional[float]) -> List["Sandbox"]:
        from .client import Sandbox

        if lease is not None:
            self.lease = v.session_lease(lease)
        doc = self._client._transport.call("POST", self._path + "/attach", payload={"lease": self.lease})
        self.cached_info, infos = _ops.attach_answer(doc)
        return [Sandbox(self._client, info["id"], info) for info in infos]

    def attach(self, lease: Optional[float] = None) -> List["Sandbox"]:
        """Take the session over (after a preemption): renew the lease, return its sandboxes, keep renewing.

        Sandboxes paused by a lapsed lease stay paused until their first request, which resumes them with their
        files and processes as they were.
        """
        sandboxes = self._attach(lease)
        self._start_renewal()
        return sandboxes

    def close(self) -> None:
        """Stop renewing. The sandboxes stay; when the lease lapses the node pauses them (see ``retention``)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def destroy(self) -> int:
        """Stop renewing and destroy the session with its sandboxes. Returns how many were destroyed."""
        self.close()
        try:
            doc = self._client._transport.call("DELETE", self._path)
        except NotFoundError:
            return 0
        return int((doc or {}).get("destroyed") or 0)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- background renewal ---------------------------------------------------------------------------------
    def _interval(self) -> float:
        return _ops.renew_interval(self.lease)

    def _start_renewal(self) -> None:
        with self._lock:
            if self.renewing:
                return
            self._stop = threading.Event()
            stop = self._stop
            self._thread = threading.Thread(target=self._renew_loop, args=(stop,), daemon=True,
                                            name=f"pydsec-session-{self.name}")
            self._thread.start()

    def _renew_loop(self, stop: threading.Event) -> None:
        while not stop.wait(self._interval()):
            try:
                self._put()
                self.last_error = None
            except ConflictError as e:  # the session is being deleted: nothing left to renew
                self.last_error = e
                return
            except DsecError as e:
                self.last_error = e

