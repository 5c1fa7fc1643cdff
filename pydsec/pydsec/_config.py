"""Finding the fleet: explicit arguments, then DSEC_ENDPOINT/DSEC_TOKEN, then ~/.dsec/fleets/<fleet>.json.

A fleet with several gateways (dsec-launch) lists them all under ``"endpoints"`` in its fleet file, in the order
clients try them (``"endpoint"`` is the first, for readers that know one). An argument or DSEC_ENDPOINT may also
name several, as a list or comma-separated.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple, Union
from urllib.parse import urlsplit

from .errors import DsecError, InvalidRequestError


@dataclass(frozen=True)
class FleetConfig:
    endpoint: str  # the first of endpoints
    token: str
    fleet: str
    source: str  # where the values came from, for error messages
    endpoints: Tuple[str, ...] = ()  # every gateway candidate, in the order to try them
    launch_fleet: bool = False  # the fleet file is a dsec-launch fleet's (it lists "endpoints")


def fleet_file_path(fleet: str) -> str:
    return os.path.join(os.path.expanduser("~"), ".dsec", "fleets", f"{fleet}.json")


def _read_fleet_file(path: str) -> dict:
    try:
        with open(path, "r", encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise DsecError(f"cannot read fleet file {path}: {e}", code="config") from None
    if not isinstance(doc, dict):
        raise DsecError(f"fleet file {path} is not a JSON object", code="config")
    return doc


def validate_endpoint(endpoint: str) -> str:
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidRequestError(f"endpoint must look like http://HOST:PORT, got {endpoint!r}")
    return endpoint.rstrip("/")


def _endpoint_list(value: Union[str, Sequence[str]], where: str) -> Tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else list(value)
    out = []
    for item in items:
        if not isinstance(item, str):
            raise InvalidRequestError(f"{where}: endpoints must be strings, got {item!r}")
        if item.strip():
            out.append(validate_endpoint(item.strip()))
    if not out:
        raise InvalidRequestError(f"{where}: no endpoint in {value!r}")
    return tuple(dict.fromkeys(out))  # in order, each once


def resolve(endpoint: Union[None, str, Sequence[str]] = None, token: Optional[str] = None,
            fleet: Optional[str] = None) -> FleetConfig:
    """Each value is taken from the first place that has it: argument, environment, fleet file."""
    fleet = fleet or os.environ.get("DSEC_FLEET") or "default"
    if "/" in fleet or fleet.startswith("."):
        raise InvalidRequestError(f"invalid fleet name {fleet!r}")
    sources = []
    if endpoint:
        sources.append("argument")
    elif os.environ.get("DSEC_ENDPOINT"):
        endpoint = os.environ["DSEC_ENDPOINT"]
        sources.append("DSEC_ENDPOINT")
    if token:
        pass
    elif os.environ.get("DSEC_TOKEN"):
        token = os.environ["DSEC_TOKEN"]
    path = fleet_file_path(fleet)
    launch_fleet = False
    if not endpoint or not token:
        doc = _read_fleet_file(path)
        listed = doc.get("endpoints")
        if not endpoint and isinstance(listed, list) and listed and all(isinstance(e, str) for e in listed):
            endpoint = listed
            launch_fleet = True
            sources.append(path)
        elif not endpoint and isinstance(doc.get("endpoint"), str) and doc["endpoint"]:
            endpoint = doc["endpoint"]
            sources.append(path)
        if not token and isinstance(doc.get("token"), str) and doc["token"]:
            token = doc["token"]
    if not endpoint:
        raise DsecError(
            f"no dsec fleet found: pass endpoint=..., set DSEC_ENDPOINT, or start `dsec serve --fleet-name {fleet}` "
            f"so that it writes {path}", code="config")
    if not token:
        raise DsecError(
            f"no token for the dsec fleet at {endpoint}: pass token=..., set DSEC_TOKEN, or put \"token\" in {path}",
            code="config")
    source = sources[0] if sources else "argument"
    endpoints = _endpoint_list(endpoint, source)
    return FleetConfig(endpoint=endpoints[0], token=token, fleet=fleet, source=source, endpoints=endpoints,
                       launch_fleet=launch_fleet)
