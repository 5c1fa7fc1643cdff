"""Snapshots: a sandbox's state kept in the fleet's shared snapshot store, restored and forked from there.

    snap = sb.snapshot()                                  # its files (a container); processes=True: a machine's all
    with client.create(snapshot=snap, timeout=600) as sb2:  # a new sandbox with those files, on any node
        ...
    copies = sb.fork(3)                                   # three sandboxes that start from sb's state now
    client.snapshots(); client.snapshot(name); snap.delete()

A container's snapshot holds its files (the writable upper over its image), not its processes; a machine
sandbox's may hold its processes too (``processes=True``). A restore takes its image, backend and limits from
the snapshot; only ``timeout``, ``idle_timeout``, ``labels`` and ``session`` can be given.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict

from . import _ops

if TYPE_CHECKING:
    from .client import Client, Sandbox


class Snapshot:
    """A snapshot object: ``name``, ``kind`` (``"filesystem"`` or ``"machine"``), ``backend``, ``image``,
    ``source`` (the sandbox it was taken of), ``node`` (where), ``created`` (RFC 3339), ``bytes`` (of its files);
    ``info`` is the whole object as the fleet sent it."""

    def __init__(self, client: Any, doc: Dict[str, Any]):
        self._client = client
        self.info: Dict[str, Any] = dict(_ops.snapshot_doc(doc))
        self.name: str = self.info["name"]
        self.kind: str = str(self.info.get("kind") or "")
        self.backend: str = str(self.info.get("backend") or "")
        self.image: str = str(self.info.get("image") or "")
        self.source: str = str(self.info.get("source") or "")
        self.node: str = str(self.info.get("node") or "")
        self.created: str = str(self.info.get("created") or "")
        self.bytes: int = int(self.info.get("bytes") or 0)

    def __repr__(self) -> str:
        return f"<pydsec.Snapshot {self.name} {self.kind} of {self.source or '?'} {self.bytes} bytes>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Snapshot) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def restore(self, **kwargs: Any) -> "Sandbox":
        """``client.create(snapshot=self, **kwargs)``."""
        return self._client.create(snapshot=self, **kwargs)

    def delete(self) -> bool:
        """Delete it from the store (sandboxes restored from it keep running). False if it was already gone."""
        client: "Client" = self._client
        return client.delete_snapshot(self.name)


__all__ = ["Snapshot"]
