"""Cheap client-side checks that turn obvious mistakes into InvalidRequestError before a round trip.

The server validates everything again; these checks only exist to give a clear message early.
"""

from __future__ import annotations

import base64
import numbers
import re
from typing import Any, Dict, List, Mapping, Optional, Union

from .errors import InvalidRequestError

_SIZE_RE = re.compile(r"^\s*\d+(\.\d+)?\s*([kKmMgGtT]i?[bB]?|[bB])?\s*$")
_MODE_RE = re.compile(r"^0?[0-7]{3,4}$")
_SESSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_SNAPSHOT_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
# The most copies one fork makes (the node's own limit).
MAX_FORKS = 256


def _put_stdin(body: Dict[str, Any], stdin: Any) -> None:
    """Text goes as "stdin", bytes as "stdin_b64" (the server takes either, not both)."""
    if isinstance(stdin, str):
        body["stdin"] = stdin
    elif isinstance(stdin, (bytes, bytearray, memoryview)):
        body["stdin_b64"] = base64.b64encode(bytes(stdin)).decode("ascii")
    else:
        _fail(f"stdin must be str or bytes, got {type(stdin).__name__}")


def _fail(message: str) -> None:
    raise InvalidRequestError(message)


def number(name: str, value: Any, allow_zero: bool = True) -> Union[int, float]:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        _fail(f"{name} must be a number, got {type(value).__name__}")
    if value < 0 or (not allow_zero and value == 0):
        _fail(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value}")
    return value


def integer(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        _fail(f"{name} must be an integer, got {type(value).__name__}")
    if value < 0:
        _fail(f"{name} must be >= 0, got {value}")
    return int(value)


def size(name: str, value: Any) -> Union[int, str]:
    """Sizes are integers (bytes) or strings like "512M", "1G", "64k"."""
    if isinstance(value, str):
        if not _SIZE_RE.match(value):
            _fail(f"{name} must be a byte count or a size like '512M' or '1G', got {value!r}")
        return value.strip()
    return integer(name, value)


def string_map(name: str, value: Any) -> Dict[str, str]:
    if not isinstance(value, Mapping):
        _fail(f"{name} must be a dict of str to str, got {type(value).__name__}")
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str):
            _fail(f"{name} must map str to str; {k!r}: {v!r} is not")
        if not k:
            _fail(f"{name} has an empty key")
    return dict(value)


def env_map(name: str, value: Any) -> Dict[str, str]:
    env = string_map(name, value)
    for k in env:
        if "=" in k or "\0" in k:
            _fail(f"{name} key {k!r} must not contain '=' or NUL")
    return env


def abs_path(name: str, value: Any) -> str:
    if not isinstance(value, str):
        _fail(f"{name} must be a str, got {type(value).__name__}")
    if not value.startswith("/"):
        _fail(f"{name} must be an absolute path inside the sandbox, got {value!r}")
    if "\0" in value:
        _fail(f"{name} must not contain NUL")
    return value


def file_mode(value: Any) -> str:
    if isinstance(value, bool):
        _fail("mode must be an int like 0o644 or a str like '0644'")
    if isinstance(value, numbers.Integral):
        if not 0 <= value <= 0o7777:
            _fail(f"mode must be between 0 and 0o7777, got {oct(value)}")
        return f"{int(value):04o}"
    if isinstance(value, str) and _MODE_RE.match(value):
        return value if len(value) == 4 else "0" + value
    _fail(f"mode must be an int like 0o644 or an octal str like '0644', got {value!r}")
    raise AssertionError


def sandbox_id(value: Any) -> str:
    if not isinstance(value, str) or not value or "/" in value or "?" in value or "#" in value:
        _fail(f"invalid sandbox id {value!r}")
    return value


def session_name(value: Any) -> str:
    if not isinstance(value, str) or not _SESSION_RE.match(value):
        _fail(f"invalid session name {value!r}: it must match [A-Za-z0-9][A-Za-z0-9._-]{{0,63}}")
    return value


def snapshot_name(value: Any) -> str:
    if not isinstance(value, str) or not _SNAPSHOT_RE.match(value):
        _fail(f"invalid snapshot name {value!r}: it must match [a-z0-9][a-z0-9._-]{{0,63}}")
    return value


def snapshot_body(name: Any, processes: Any) -> Dict[str, Any]:
    """POST /v1/sandboxes/ID/snapshot: an unnamed snapshot gets a name from the node."""
    body: Dict[str, Any] = {}
    if name is not None:
        body["name"] = snapshot_name(name)
    if not isinstance(processes, bool):
        _fail(f"processes must be a bool, got {type(processes).__name__}")
    if processes:
        body["processes"] = True
    return body


def fork_body(count: Any, processes: Any) -> Dict[str, Any]:
    if isinstance(count, bool) or not isinstance(count, numbers.Integral) or not 1 <= count <= MAX_FORKS:
        _fail(f"count must be an integer in 1..{MAX_FORKS}, got {count!r}")
    body = snapshot_body(None, processes)
    body["count"] = int(count)
    return body


# What a restore takes from its snapshot and so cannot be given with ``snapshot=``.
_FROM_SNAPSHOT = ("image", "backend", "cpus", "memory", "disk", "pids", "env", "network", "qos", "protect")


def restore_body(snapshot: str, given: Mapping[str, Any], timeout: Any, idle_timeout: Any, labels: Any,
                 session: Any) -> Dict[str, Any]:
    """POST /v1/sandboxes from a snapshot: the image, backend and limits are the snapshot's; ``given`` maps the
    create arguments that a restore cannot take to their values (None when not given)."""
    fixed = [name for name in _FROM_SNAPSHOT if given.get(name) is not None]
    if fixed:
        _fail(f"a restore takes its image, backend and limits from the snapshot: {', '.join(fixed)} cannot be "
              "given with snapshot=")
    body: Dict[str, Any] = {"snapshot": snapshot_name(snapshot)}
    if timeout is not None:
        body["timeout"] = number("timeout", timeout)
    if idle_timeout is not None:
        body["idle_timeout"] = number("idle_timeout", idle_timeout)
    if labels is not None:
        body["labels"] = string_map("labels", labels)
    if session is not None:
        body["session"] = session_name(session)
    return body


def session_lease(value: Any) -> Union[int, float]:
    number("lease", value)
    if not 1 <= value <= 86400:
        _fail(f"lease must be between 1 and 86400 seconds, got {value}")
    return value


def session_retention(value: Any) -> Union[int, float]:
    number("retention", value)
    if value > 604800:
        _fail(f"retention must be between 0 and 604800 seconds, got {value}")
    return value


def string_list(name: str, value: Any) -> List[str]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        _fail(f"{name} must be a list of str, got {type(value).__name__}")
    for item in value:
        if not isinstance(item, str) or not item:
            _fail(f"{name} must be a list of non-empty str, found {item!r}")
    return list(value)


def egress_list(value: Any) -> List[str]:
    """Egress destinations: "10.0.0.0/8", "192.0.2.1:443", "pypi.org:443", "*.example.org" (checked by the node)."""
    return string_list("egress", value)


def network_field(network: Any) -> Union[str, Dict[str, List[str]]]:
    if isinstance(network, dict):
        if set(network) != {"egress"}:
            _fail(f"network as a dict takes exactly the key 'egress', got {sorted(network)!r}")
        return {"egress": egress_list(network["egress"])}
    if network not in ("none", "egress"):
        _fail(f"network must be 'none', 'egress' or {{'egress': [...]}}, got {network!r} "
              "(no sandbox shares the node's network)")
    return network


def protect_list(value: Any) -> List[str]:
    paths = string_list("protect", value)
    for p in paths:
        if not p.startswith("/"):
            _fail(f"protect paths must be absolute, got {p!r}")
    return paths


def create_body(image: Any, backend: Any, cpus: Any, memory: Any, disk: Any, pids: Any, timeout: Any,
                idle_timeout: Any, env: Any, labels: Any, network: Any, session: Any = None,
                qos: Any = None, protect: Any = None) -> Dict[str, Any]:
    if not isinstance(image, str) or not image.strip():
        _fail("image must be a non-empty str like 'debian:12+python:3.11' (or give snapshot= to restore one)")
    if backend is None:
        backend = "container"
    if not isinstance(backend, str) or not backend:
        _fail("backend must be a non-empty str such as 'container'")
    body: Dict[str, Any] = {"image": image, "backend": backend}
    if cpus is not None:
        body["cpus"] = number("cpus", cpus, allow_zero=False)
    if memory is not None:
        body["memory"] = size("memory", memory)
    if disk is not None:
        body["disk"] = size("disk", disk)
    if pids is not None:
        body["pids"] = integer("pids", pids)
    if timeout is not None:
        body["timeout"] = number("timeout", timeout)
    if idle_timeout is not None:
        body["idle_timeout"] = number("idle_timeout", idle_timeout)
    if env is not None:
        body["env"] = env_map("env", env)
    if labels is not None:
        body["labels"] = string_map("labels", labels)
    if network is not None:
        body["network"] = network_field(network)
    if protect is not None:
        body["protect"] = protect_list(protect)
    if session is not None:
        body["session"] = session_name(session)
    if qos is not None:
        if qos not in ("latency", "batch"):
            _fail(f"qos must be 'latency' or 'batch', got {qos!r}")
        if qos == "latency" and cpus is not None and cpus <= 0:
            _fail("qos 'latency' needs cpus > 0 (the cores to dedicate)")
        body["qos"] = qos
    return body


def exec_body(cmd: Any, timeout: Any, cwd: Any, env: Any, stdin: Any, output_cap: Any) -> Dict[str, Any]:
    body: Dict[str, Any] = {}
    if isinstance(cmd, str):
        if not cmd.strip():
            _fail("cmd must not be empty")
        body["cmd"] = cmd
    elif isinstance(cmd, (list, tuple)):
        if not cmd:
            _fail("cmd must not be an empty list")
        argv: List[str] = []
        for arg in cmd:
            if not isinstance(arg, str):
                _fail(f"every argv element must be a str; {arg!r} is {type(arg).__name__}")
            argv.append(arg)
        body["cmd"] = argv
    else:
        _fail(f"cmd must be a str (run by /bin/sh -c) or a list of str (argv), got {type(cmd).__name__}")
    if timeout is not None:
        body["timeout"] = number("timeout", timeout)
    if cwd is not None:
        body["cwd"] = abs_path("cwd", cwd)
    if env is not None:
        body["env"] = env_map("env", env)
    if stdin is not None:
        _put_stdin(body, stdin)
    if output_cap is not None:
        body["output_cap"] = integer("output_cap", output_cap)
    return body


def optional_labels(labels: Optional[Any]) -> Dict[str, str]:
    if labels is None:
        return {}
    lab = string_map("labels", labels)
    for k in lab:
        if "=" in k:
            _fail(f"label key {k!r} must not contain '='")
    return lab


_CALL_LANGUAGES = ("python", "bash")
_MAX_CALL_TIMEOUT = 600
_MAX_CALL_OUTPUT_CAP = 16 << 20
_MAX_CALL_FILES = 1000
_MAX_CALL_PATH = 1024


def call_file_path(path: Any) -> str:
    """A path relative to the call's working directory (the server applies the same rules)."""
    if not isinstance(path, str):
        _fail(f"files keys must be str paths, got {type(path).__name__}")
    if not path:
        _fail("files has an empty path")
    if len(path.encode("utf-8")) > _MAX_CALL_PATH:
        _fail(f"files path {path[:64]!r}... is longer than {_MAX_CALL_PATH} bytes")
    if "\0" in path:
        _fail(f"files path {path!r} contains NUL")
    if path.startswith("/"):
        _fail(f"files path {path!r} must be relative to the call's working directory, not absolute")
    for part in path.split("/"):
        if part in ("", ".", ".."):
            _fail(f"files path {path!r}: empty, '.' and '..' components are not allowed")
    return path


def call_body(code: Any, language: Any, stdin: Any, timeout: Any, memory: Any, files: Any, image: Any,
              output_cap: Any, fresh_interpreter: Any = False) -> Dict[str, Any]:
    """The body of POST /v1/call (docs/api.md, "Function calls")."""
    if not isinstance(code, str):
        _fail(f"code must be a str, got {type(code).__name__}")
    if not code:
        _fail("code must not be empty")
    if "\0" in code:
        _fail("code must not contain NUL")
    if language not in _CALL_LANGUAGES:
        _fail(f"language must be 'python' or 'bash', got {language!r}")
    body: Dict[str, Any] = {"code": code, "language": language}
    if stdin is not None:
        _put_stdin(body, stdin)
    if timeout is not None:
        number("timeout", timeout, allow_zero=False)
        if timeout > _MAX_CALL_TIMEOUT:
            _fail(f"timeout must be at most {_MAX_CALL_TIMEOUT} seconds for a call, got {timeout}")
        body["timeout"] = timeout
    if memory is not None:
        body["memory"] = size("memory", memory)
    if files is not None:
        if not isinstance(files, Mapping):
            _fail(f"files must be a dict of relative path -> bytes or str, got {type(files).__name__}")
        if len(files) > _MAX_CALL_FILES:
            _fail(f"files has more than {_MAX_CALL_FILES} entries")
        encoded: Dict[str, str] = {}
        for path, data in files.items():
            call_file_path(path)
            if isinstance(data, str):
                data = data.encode("utf-8")
            elif isinstance(data, (bytearray, memoryview)):
                data = bytes(data)
            elif not isinstance(data, bytes):
                _fail(f"files[{path!r}] must be bytes or str, got {type(data).__name__}")
            encoded[path] = base64.b64encode(data).decode("ascii")
        dirs = {p[:i] for p in encoded for i in range(len(p)) if p[i] == "/"}
        for path in encoded:
            if path in dirs:
                _fail(f"files path {path!r} is both a file and a directory of another file")
        body["files"] = encoded
    if image is not None:
        if not isinstance(image, str) or not image.strip():
            _fail("image must be a non-empty str like 'debian:12+python:3.11'")
        body["image"] = image
    if output_cap is not None:
        integer("output_cap", output_cap)
        if output_cap > _MAX_CALL_OUTPUT_CAP:
            _fail(f"output_cap must be at most {_MAX_CALL_OUTPUT_CAP} bytes (16 MiB) for a call")
        body["output_cap"] = output_cap
    if not isinstance(fresh_interpreter, bool):
        _fail(f"fresh_interpreter must be True or False, got {type(fresh_interpreter).__name__}")
    if fresh_interpreter:
        body["fresh_interpreter"] = True
    return body
