"""Mapping API error responses to exception classes."""

import json

import pytest

import pydsec
from pydsec.errors import error_from_response


def body(code, message="what is wrong", **extra):
    return json.dumps({"error": dict(code=code, message=message, **extra)}).encode()


@pytest.mark.parametrize("status,code,cls", [
    (400, "invalid_request", pydsec.InvalidRequestError),
    (401, "unauthorized", pydsec.AuthError),
    (404, "not_found", pydsec.NotFoundError),
    (409, "conflict", pydsec.ConflictError),
    (413, "too_large", pydsec.TooLargeError),
    (429, "capacity", pydsec.CapacityError),
    (501, "unsupported", pydsec.UnsupportedError),
    (504, "timeout", pydsec.DsecTimeoutError),
    (500, "internal", pydsec.ServerError),
    (503, "unavailable", pydsec.UnavailableError),
    (408, "request_timeout", pydsec.DsecTimeoutError),
    (429, "too_many_connections", pydsec.CapacityError),
])
def test_code_maps_to_class(status, code, cls):
    e = error_from_response(status, body(code, "layer python:3.12 not found"))
    assert type(e) is cls
    assert isinstance(e, pydsec.DsecError)
    assert e.code == code
    assert e.status == status
    assert e.message == "layer python:3.12 not found"
    assert "layer python:3.12 not found" in str(e)


def test_code_wins_over_status():
    e = error_from_response(400, body("not_found"))
    assert isinstance(e, pydsec.NotFoundError)


@pytest.mark.parametrize("status,cls", [(400, pydsec.InvalidRequestError), (403, pydsec.AuthError),
                                        (404, pydsec.NotFoundError), (502, pydsec.ServerError),
                                        (503, pydsec.UnavailableError), (408, pydsec.DsecTimeoutError),
                                        (418, pydsec.DsecError)])
def test_unknown_code_or_body_falls_back_to_status(status, cls):
    e = error_from_response(status, b"<html>proxy error</html>")
    assert type(e) is cls
    assert e.status == status
    assert "proxy error" in e.message


def test_empty_body():
    e = error_from_response(500, b"")
    assert isinstance(e, pydsec.ServerError)
    assert "HTTP 500" in e.message


def test_capacity_retry_after_from_body_and_header():
    e = error_from_response(429, body("capacity", retry_after=3))
    assert isinstance(e, pydsec.CapacityError) and e.retry_after == 3
    e = error_from_response(429, body("capacity"), {"Retry-After": "7"})
    assert e.retry_after == 7
    e = error_from_response(429, body("capacity"), {"Retry-After": "soon"})
    assert e.retry_after is None


def test_builtin_bases_without_shadowing():
    assert issubclass(pydsec.DsecTimeoutError, TimeoutError)
    assert issubclass(pydsec.DsecConnectionError, ConnectionError)
    assert not hasattr(pydsec, "TimeoutError")
    assert not hasattr(pydsec, "ConnectionError")
    # Every class derives from DsecError so one except clause catches everything from the SDK.
    for name in pydsec.__all__:
        obj = getattr(pydsec, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, pydsec.DsecError), name


def test_repr_is_useful():
    e = error_from_response(404, body("not_found", "sandbox n0-x not found"))
    assert "NotFoundError" in repr(e) and "n0-x" in repr(e)
