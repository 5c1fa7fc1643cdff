"""Fleet discovery: arguments, then DSEC_ENDPOINT/DSEC_TOKEN, then ~/.dsec/fleets/<fleet>.json."""

import json
import os

import pytest

import pydsec
import pydsec.aio
from pydsec import _config


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("DSEC_ENDPOINT", "DSEC_TOKEN", "DSEC_FLEET"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def write_fleet(home, name, doc):
    d = home / ".dsec" / "fleets"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{name}.json").write_text(json.dumps(doc))


def test_fleet_file_default(home):
    write_fleet(home, "default", {"endpoint": "http://127.0.0.1:8470", "token": "t-file", "fleet": "default"})
    c = pydsec.Client()
    assert c.endpoint == "http://127.0.0.1:8470"
    assert c._transport._token == "t-file"
    assert c.fleet == "default"


def test_fleet_file_named(home):
    write_fleet(home, "default", {"endpoint": "http://127.0.0.1:1", "token": "t-default"})
    write_fleet(home, "lab", {"endpoint": "http://10.0.0.7:9000/", "token": "t-lab"})
    c = pydsec.Client(fleet="lab")
    assert c.endpoint == "http://10.0.0.7:9000"  # trailing slash dropped
    assert c._transport._token == "t-lab"


def test_env_beats_fleet_file(home, monkeypatch):
    write_fleet(home, "default", {"endpoint": "http://127.0.0.1:1", "token": "t-file"})
    monkeypatch.setenv("DSEC_ENDPOINT", "http://127.0.0.1:2")
    monkeypatch.setenv("DSEC_TOKEN", "t-env")
    c = pydsec.Client()
    assert c.endpoint == "http://127.0.0.1:2"
    assert c._transport._token == "t-env"


def test_arguments_beat_env(home, monkeypatch):
    monkeypatch.setenv("DSEC_ENDPOINT", "http://127.0.0.1:2")
    monkeypatch.setenv("DSEC_TOKEN", "t-env")
    c = pydsec.Client(endpoint="http://127.0.0.1:3", token="t-arg")
    assert c.endpoint == "http://127.0.0.1:3"
    assert c._transport._token == "t-arg"


def test_each_value_from_first_source_that_has_it(home, monkeypatch):
    write_fleet(home, "default", {"endpoint": "http://127.0.0.1:1", "token": "t-file"})
    monkeypatch.setenv("DSEC_ENDPOINT", "http://127.0.0.1:2")
    c = pydsec.Client()
    assert c.endpoint == "http://127.0.0.1:2"
    assert c._transport._token == "t-file"


def test_dsec_fleet_env_selects_file(home, monkeypatch):
    write_fleet(home, "other", {"endpoint": "http://127.0.0.1:4", "token": "t-other"})
    monkeypatch.setenv("DSEC_FLEET", "other")
    assert pydsec.Client().endpoint == "http://127.0.0.1:4"


def test_missing_fleet_file_is_a_clear_error(home):
    with pytest.raises(pydsec.DsecError) as ei:
        pydsec.Client(fleet="nosuch")
    msg = str(ei.value)
    assert "no dsec fleet found" in msg
    assert os.path.join(str(home), ".dsec", "fleets", "nosuch.json") in msg
    assert "DSEC_ENDPOINT" in msg
    assert ei.value.code == "config"


def test_missing_token_is_a_clear_error(home):
    write_fleet(home, "default", {"endpoint": "http://127.0.0.1:1"})
    with pytest.raises(pydsec.DsecError, match="no token"):
        pydsec.Client()


def test_corrupt_fleet_file(home):
    d = home / ".dsec" / "fleets"
    d.mkdir(parents=True)
    (d / "default.json").write_text("{not json")
    with pytest.raises(pydsec.DsecError, match="cannot read fleet file"):
        pydsec.Client()


def test_bad_endpoint_and_fleet_name(home):
    with pytest.raises(pydsec.InvalidRequestError, match="http://HOST:PORT"):
        pydsec.Client(endpoint="127.0.0.1:8470", token="t")
    with pytest.raises(pydsec.InvalidRequestError, match="fleet name"):
        pydsec.Client(fleet="../etc")


def test_aio_uses_same_discovery(home):
    write_fleet(home, "default", {"endpoint": "http://127.0.0.1:8470", "token": "t-file"})
    c = pydsec.aio.Client()
    try:
        assert c.endpoint == "http://127.0.0.1:8470"
    finally:
        c.close()


def test_fleet_file_path(home):
    assert _config.fleet_file_path("x") == os.path.join(str(home), ".dsec", "fleets", "x.json")
