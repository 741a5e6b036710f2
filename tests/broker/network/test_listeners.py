"""Listeners (docs/protocol.md section 7): the `[[listeners]]` settings, and a broker
serving several of them, each answering Metadata with its own advertised address."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker import config as cfg
from broker.metrics import BrokerMetrics
from harness.broker_process import BrokerProcess
from harness.wire import WireClient
from tests.security_fixtures import listeners, metric

# ------------------------------------------------------------------ the settings


def _load(tmp_path: Path, text: str) -> cfg.BrokerConfig:
    path = tmp_path / "b.toml"
    path.write_text(text)
    return cfg.load(path)


def test_listeners_parse_with_their_defaults(tmp_path: Path) -> None:
    c = _load(
        tmp_path,
        'sasl_mechanisms = ["SCRAM-SHA-512", "PLAIN"]\n'
        "[[listeners]]\n"
        'name = "internal"\nhost = "127.0.0.1"\nport = 9092\n'
        "[[listeners]]\n"
        'name = "external_2"\nhost = "0.0.0.0"\nport = 0\nsecurity = "sasl_plaintext"\n'
        'advertised_host = "broker.example.com"\nprotocol = "minibroker"\n',
    )
    assert c.listeners == (
        cfg.Listener("internal", "127.0.0.1", 9092),
        cfg.Listener("external_2", "0.0.0.0", 0, "sasl_plaintext", "broker.example.com"),
    )
    assert c.effective_listeners() == c.listeners
    assert c.sasl_mechanisms == ("SCRAM-SHA-512", "PLAIN")
    assert [(x.tls, x.sasl) for x in c.listeners] == [(False, False), (False, True)]


@pytest.mark.parametrize("security", cfg.SECURITY)
def test_a_kafka_listener_takes_any_security(tmp_path: Path, security: str) -> None:
    c = _load(
        tmp_path,
        'tls_certfile = "c.pem"\ntls_keyfile = "k.pem"\n[[listeners]]\n'
        f'name = "k"\nhost = "127.0.0.1"\nport = 0\nsecurity = "{security}"\n'
        'protocol = "kafka"\n',
    )
    assert c.listeners == (cfg.Listener("k", "127.0.0.1", 0, security, protocol="kafka"),)


def test_without_listeners_host_and_port_are_the_one_plaintext_listener() -> None:
    c = cfg.load(None, {"host": "127.0.0.2", "port": "0"})
    assert c.effective_listeners() == (cfg.Listener("default", "127.0.0.2", 0, "plaintext"),)


LISTENER = '[[listeners]]\nname = "a"\nhost = "127.0.0.1"\nport = 0\n'


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (LISTENER + "colour = 1\n", "listeners[1] (a): unknown key 'colour'; known: name,"),
        (
            LISTENER + "tls_certfile = 'x'\n",
            "unknown key 'tls_certfile'; known: name, host, port, security, advertised_host, "
            "advertised_port, protocol, max_connections (broker settings go before the first "
            "[[listeners]] table)",
        ),
        (LISTENER + LISTENER, "listeners[2] (a): name 'a' is taken by listeners[1]"),
        (
            LISTENER + "max_connections = -1\n",
            "listeners[1] (a): max_connections=-1 is invalid: expected an integer in 0..",
        ),
        (
            LISTENER.replace('"a"', '"Upper"'),
            "listeners[1]: name='Upper' is invalid: expected [a-z0-9_]{1,32}",
        ),
        (LISTENER.replace('"a"', '"' + "x" * 33 + '"'), "is invalid: expected [a-z0-9_]{1,32}"),
        (LISTENER.replace('"a"', "7"), "listeners[1]: name=7 is invalid"),
        (
            LISTENER + 'security = "ssl"\n',
            "listeners[1] (a): security='ssl' is invalid: expected plaintext, tls, "
            "sasl_plaintext or sasl_tls",
        ),
        (
            LISTENER + 'protocol = "http"\n',
            "listeners[1] (a): protocol='http' is invalid: expected minibroker or kafka",
        ),
        ('[[listeners]]\nname = "a"\nhost = "h"\n', "listeners[1] (a): missing key 'port'"),
        (LISTENER.replace("port = 0", "port = 70000"), "port=70000 is invalid"),
        (LISTENER.replace("port = 0", 'port = "9092"'), "port='9092' is invalid"),
        (LISTENER.replace("port = 0", "port = true"), "port=True is invalid"),
        (LISTENER + "advertised_port = 65536\n", "advertised_port=65536 is invalid"),
        (LISTENER + "advertised_port = -1\n", "advertised_port=-1 is invalid"),
        (LISTENER.replace('"127.0.0.1"', "1"), "host=1 is invalid"),
        (
            LISTENER.replace("port = 0", "port = 9092")
            + LISTENER.replace('"a"', '"b"').replace("port = 0", "port = 9092"),
            "listeners[2] (b): 127.0.0.1:9092 is taken by listeners[1]",
        ),
        ("listeners = 5\n", "setting listeners is invalid: expected an array of at most 16"),
        ("listeners = [1]\n", "listeners[1] is invalid: expected a table"),
        (
            "".join(LISTENER.replace('"a"', f'"l{i}"') for i in range(17)),
            "expected an array of at most 16 tables",
        ),
        ("port = 9093\n" + LISTENER, "set either them or [[listeners]], not both"),
        (
            LISTENER + 'security = "tls"\n',
            "listener 'a' uses TLS: set tls_certfile and tls_keyfile",
        ),
        (
            'tls_client_auth = "required"\n',
            "setting tls_client_auth='required' needs tls_cafile",
        ),
        ('sasl_mechanisms = ["GSSAPI"]\n', "setting sasl_mechanisms=['GSSAPI'] is invalid"),
        ("sasl_mechanisms = []\n", "a list of 1..3 of SCRAM-SHA-256, SCRAM-SHA-512 or PLAIN"),
        ('sasl_mechanisms = ["PLAIN", "PLAIN"]\n', "each once"),
        ('sasl_mechanisms = "PLAIN"\n', "setting sasl_mechanisms='PLAIN' is invalid"),
        ('super_users = ["admin"]\n', "setting super_users=['admin'] is invalid"),
        ("connections_max_reauth_ms = -1\n", "connections_max_reauth_ms=-1 is invalid"),
        ("authentication_failure_delay_ms = 60001\n", "expected an integer in 0..60000"),
    ],
)
def test_bad_listener_settings_say_which_and_why(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(cfg.ConfigError) as info:
        _load(tmp_path, text)
    assert needle in str(info.value)


def test_list_settings_come_back_as_tuples_and_check_again(tmp_path: Path) -> None:
    c = _load(tmp_path, 'super_users = ["User:admin", "User:ops team"]\n')
    assert c.super_users == ("User:admin", "User:ops team")
    # validate() checks every setting again, the parsed listeners too.
    assert c.with_overrides({}) == c
    assert cfg.SETTINGS["listeners"].check(list(_load(tmp_path, LISTENER).listeners))


# ------------------------------------------------------------------ the broker


def test_each_listener_answers_metadata_with_its_own_address(tmp_path: Path, backend: str) -> None:
    config = listeners(("internal", "plaintext")) + (
        '[[listeners]]\nname = "external"\nhost = "127.0.0.1"\nport = 0\n'
        'advertised_host = "broker.example.com"\nadvertised_port = 19093\n'
    )
    proc = BrokerProcess(tmp_path / "data", backend=backend, config=config).start()
    try:
        ports = proc.listener_ports
        assert set(ports) == {"internal", "external"} and ports["internal"] != ports["external"]
        assert proc.port == ports["internal"]  # the first listener's line, as before
        answers = (
            ("internal", "127.0.0.1", ports["internal"]),
            ("external", "broker.example.com", 19093),
        )
        for name, host, port in answers:
            with WireClient(proc.address(name)) as c:
                brokers = c.call("Metadata", topics=None)["brokers"]
                assert brokers == [{"id": 0, "host": host, "port": port}]
        assert proc.log_shows(
            f"event=listening listener=internal security=plaintext host=127.0.0.1 "
            f"port={ports['internal']} protocol=minibroker data_dir="
        )
        assert "event=listener_insecure" not in proc.log_text()
        assert metric(proc, "minibroker_listener_insecure", {"listener": "internal"}) == 0
        assert (
            metric(proc, "minibroker_listener_connections_accepted_total", {"listener": "external"})
            == 1
        )
    finally:
        proc.kill()


def test_a_plaintext_listener_other_hosts_can_reach_is_a_warning_and_a_metric(
    tmp_path: Path,
) -> None:
    config = listeners(("local", "plaintext"), ("everywhere", "plaintext", "0.0.0.0"))
    proc = BrokerProcess(tmp_path / "data", config=config).start()
    try:
        assert proc.log_shows("level=warning")
        assert proc.log_shows("event=listener_insecure listener=everywhere host=0.0.0.0")
        assert "event=listener_insecure listener=local" not in proc.log_text()
        assert metric(proc, "minibroker_listener_insecure", {"listener": "everywhere"}) == 1
        assert metric(proc, "minibroker_listener_insecure", {"listener": "local"}) == 0
    finally:
        proc.kill()


def test_the_default_listener_keeps_its_log_line_and_metadata(broker: BrokerProcess) -> None:
    assert broker.listener_ports == {"default": broker.port}
    with WireClient(broker.bootstrap) as c:
        assert c.call("Metadata", topics=None)["brokers"] == [
            {"id": 0, "host": "127.0.0.1", "port": broker.port}
        ]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            'tls_certfile = "/nonexistent/cert.pem"\ntls_keyfile = "/nonexistent/key.pem"\n'
            + LISTENER
            + 'security = "tls"\n',
            "tls_certfile='/nonexistent/cert.pem' with tls_keyfile='/nonexistent/key.pem' "
            "cannot be loaded: No such file or directory",
        ),
    ],
)
def test_a_listener_that_cannot_serve_stops_the_start_with_exit_2(
    tmp_path: Path, text: str, needle: str
) -> None:
    path = tmp_path / "b.toml"
    path.write_text(text)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "broker",
            "serve",
            "--config",
            str(path),
            "--data-dir",
            str(tmp_path / "data"),
            "--metrics-port",
            "-1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and "Traceback" not in r.stderr


def test_authentication_metrics_keep_client_strings_out_of_labels() -> None:
    m = BrokerMetrics()
    m.set_listener("a", insecure=True)
    m.connection_opened("a")
    m.connection_opened("a")
    m.connection_closed("a")
    m.authentication("a", "GSSAPI", "unsupported_mechanism")
    m.authentication("a", "x" * 1000, "unsupported_mechanism")
    m.authentication("a", "PLAIN", "success")
    with pytest.raises(ValueError, match="unknown authentication result"):
        m.authentication("a", "PLAIN", "maybe")
    families = {f.name: f for f in text_string_to_metric_families(m.render()[0].decode())}
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in families.values()
        for s in f.samples
    }
    a = (("listener", "a"),)
    assert samples[("minibroker_listener_connections_open", a)] == 1
    assert samples[("minibroker_listener_connections_accepted_total", a)] == 2
    assert samples[("minibroker_listener_insecure", a)] == 1
    other = (("listener", "a"), ("mechanism", "other"), ("result", "unsupported_mechanism"))
    assert samples[("minibroker_authentications_total", other)] == 2
