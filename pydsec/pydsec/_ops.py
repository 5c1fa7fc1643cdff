"""The pieces of the API's requests and answers that the synchronous client (client.py, session.py) and
pydsec.aio share, without their I/O: how long an exec is waited for, what a file write sends, how an exec
stream's lines read, what a lost node's info looks like.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple, Union

from . import _validate as v
from .errors import NodeLostError, ServerError, error_from_code
from .results import ExecResult

# Extra time the client waits beyond an exec's own timeout: the node must still kill, reap and reply.
EXEC_GRACE = 30.0


def exec_wait(timeout: Optional[float], client_timeout: Optional[float]) -> Optional[float]:
    """How long the client waits for an exec's response: the command's timeout plus grace, or forever."""
    if timeout is None or timeout == 0:
        return None
    return max(float(timeout) + EXEC_GRACE, client_timeout or 0.0)


def exec_result(doc: Any, what: str = "exec") -> ExecResult:
    if not isinstance(doc, dict):
        raise ServerError(f"unexpected {what} response: {doc!r}")
    return ExecResult.from_json(doc)


def created_id(info: Any) -> str:
    if not isinstance(info, dict) or not isinstance(info.get("id"), str):
        raise ServerError(f"create returned no sandbox id: {info!r}")
    return info["id"]


def create_body(snapshot: Any, image: Any, backend: Any, cpus: Any, memory: Any, disk: Any, pids: Any,
                timeout: Any, idle_timeout: Any, env: Any, labels: Any, network: Any, session: Any, qos: Any,
                protect: Any) -> Dict[str, Any]:
    """The body of POST /v1/sandboxes: a sandbox of an image, or (``snapshot`` given) a restore of a snapshot,
    whose image, backend and limits are the snapshot's."""
    if snapshot is None:
        return v.create_body(image, backend, cpus, memory, disk, pids, timeout, idle_timeout, env, labels, network,
                             session, qos, protect)
    given = dict(image=image, backend=backend, cpus=cpus, memory=memory, disk=disk, pids=pids, env=env,
                 network=network, qos=qos, protect=protect)
    return v.restore_body(snapshot_ref(snapshot), given, timeout, idle_timeout, labels, session)


def snapshot_ref(value: Any) -> str:
    """A snapshot's name from a Snapshot object or a name."""
    name = getattr(value, "name", value)
    return v.snapshot_name(name)


def snapshot_doc(doc: Any) -> Dict[str, Any]:
    if not isinstance(doc, dict) or not isinstance(doc.get("name"), str):
        raise ServerError(f"unexpected snapshot object: {doc!r}")
    return doc


def snapshot_docs(doc: Any) -> List[Dict[str, Any]]:
    """The snapshot objects of GET /v1/snapshots."""
    return [snapshot_doc(s) for s in (doc or {}).get("snapshots") or []]


def fork_answer(doc: Any, count: int) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    """(the snapshot object, the copies' infos) from POST /v1/sandboxes/ID/fork."""
    if not isinstance(doc, dict):
        raise ServerError(f"unexpected fork response: {doc!r}")
    infos = doc.get("sandboxes")
    if not isinstance(infos, list) or len(infos) != count:
        raise ServerError(f"fork of {count} returned {len(infos) if isinstance(infos, list) else 'no'} sandboxes")
    for info in infos:
        created_id(info)
    return snapshot_doc(doc.get("snapshot")), infos


def lost_info(sandbox_id: str, last: Optional[Dict[str, Any]], e: NodeLostError) -> Dict[str, Any]:
    """The info of a sandbox whose node the fleet declared lost: the last info seen, marked lost. A node that
    is only unreachable (not declared lost yet) re-raises the error."""
    if e.node_state != "lost":
        raise e
    last = last or {}
    return dict(last, id=sandbox_id, node=e.node or last.get("node"), state="lost", error=e.message)


def file_data(data: Any) -> bytes:
    """write_file's data: bytes as they are, str as UTF-8."""
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    if not isinstance(data, bytes):
        v._fail(f"data must be bytes or str, got {type(data).__name__}")
    return data


def file_query(path: str, mode: Union[None, int, str]) -> List[Tuple[str, Any]]:
    v.abs_path("path", path)
    query: List[Tuple[str, Any]] = [("path", path)]
    if mode is not None:
        query.append(("mode", v.file_mode(mode)))
    return query


def remove_query(path: str, recursive: bool) -> List[Tuple[str, Any]]:
    v.abs_path("path", path)
    query: List[Tuple[str, Any]] = [("path", path)]
    if recursive:
        query.append(("recursive", "1"))
    return query


def label_query(labels: Optional[Dict[str, str]]) -> List[Tuple[str, Any]]:
    return [("label", f"{k}={val}") for k, val in v.optional_labels(labels).items()]


# Session renewal never runs more often than this, whatever the lease.
MIN_RENEW_INTERVAL = 0.2


def renew_interval(lease: float) -> float:
    """How often a session's lease is renewed: three times per lease."""
    return max(float(lease) / 3.0, MIN_RENEW_INTERVAL)


def session_body(lease: float, retention: Optional[float]) -> Dict[str, Any]:
    body: Dict[str, Any] = {"lease": lease}
    if retention is not None:
        body["retention"] = retention
    return body


def attach_answer(doc: Any) -> Tuple[Any, List[Dict[str, Any]]]:
    """(the session object, the infos of its sandboxes) from POST /v1/sessions/NAME/attach."""
    infos = list((doc or {}).pop("sandbox_infos", None) or [])
    return doc, [info for info in infos if isinstance(info, dict) and "id" in info]


class StreamLines:
    """Reads an exec stream's NDJSON lines: ``{"stdout"|"stderr": text}`` chunks, then one line with
    ``"done": true`` and the result; or an ``"error"`` line when the node failed the exec after its output had
    started (an error of the platform's, never a result, so that it cannot pass for the command's own exit)."""

    def __init__(self) -> None:
        self.stdout: List[str] = []
        self.stderr: List[str] = []
        self.result: Optional[ExecResult] = None
        self.started = False  # the node said the command runs (its first line)
        self.exec_id: Optional[str] = None  # with streamed stdin: the exec its stdin is written to

    def feed(self, line: bytes) -> Optional[Tuple[str, str]]:
        """The (stream, text) chunk a line carries, or None (a blank or unknown line, or the result line: then
        ``result`` is set). A bad line or an error line raises; the caller then abandons the stream."""
        line = line.strip()
        if not line:
            return None
        try:
            doc = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise ServerError(f"exec stream sent an invalid line: {line[:200]!r}") from None
        if not isinstance(doc, dict):
            raise ServerError(f"exec stream sent a non-object line: {line[:200]!r}")
        if isinstance(doc.get("error"), dict):
            err = doc["error"]
            code = err.get("code") if isinstance(err.get("code"), str) else "internal"
            raise error_from_code(None, code, str(err.get("message", "exec stream failed")), err)
        if doc.get("done"):
            self.result = ExecResult.from_json(doc, stdout="".join(self.stdout), stderr="".join(self.stderr))
            return None
        if doc.get("started") is True:
            self.started = True
            if isinstance(doc.get("exec_id"), str):
                self.exec_id = doc["exec_id"]
            return None
        for name in ("stdout", "stderr"):
            text = doc.get(name)
            if isinstance(text, str) and text:
                (self.stdout if name == "stdout" else self.stderr).append(text)
                return name, text
        return None


__all__ = ["EXEC_GRACE", "exec_wait", "exec_result", "created_id", "create_body", "snapshot_ref", "snapshot_doc",
           "snapshot_docs", "fork_answer", "lost_info", "file_data", "file_query",
           "remove_query", "label_query", "renew_interval", "session_body", "attach_answer", "StreamLines"]
