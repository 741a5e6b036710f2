"""The settings table is the single source for TOML keys, CLI flags and the docs."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from broker import config as cfg
from broker.cli import SERVE_FLAGS, build_parser

ROOT = Path(__file__).resolve().parents[2]


def test_docs_table_matches_the_code() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    assert cfg.markdown_table() in text, "regenerate with: minibroker config-table"


def test_operations_guide_names_the_reloadable_settings_of_the_table() -> None:
    """docs/operations.md lists what SIGHUP applies: the settings the table marks
    reloadable, in its order, and how many there are."""
    reloadable = [name for name in cfg.SETTINGS if name in cfg.RELOADABLE]
    ops = (ROOT / "docs" / "operations.md").read_text()
    section = ops.split("### Reloading (SIGHUP)", 1)[1].split("\n\n")[1]
    named = [name for name in re.findall(r"`(\w+)`", section) if name in cfg.SETTINGS]
    assert named == reloadable
    assert f"these {len(reloadable)}: " in " ".join(section.split())


def test_toml_then_flags_override(tmp_path: Path) -> None:
    path = tmp_path / "b.toml"
    path.write_text('port = 1234\nretention_ms = 5000\nbackend = "asyncio"\n')
    c = cfg.load(path, {"port": 99})
    assert (c.port, c.retention_ms, c.backend) == (99, 5000, "asyncio")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("nonsense_key = 1\n", "unknown setting 'nonsense_key'"),
        ("retension_ms = 1\n", "unknown setting 'retension_ms'; did you mean 'retention_ms'?"),
        ('port = "x"\n', "setting port='x' is invalid: expected an integer in 0..65535"),
        ("port = 70000\n", "setting port=70000 is invalid"),
        ('backend = "gevent"\n', "setting backend='gevent' is invalid"),
        ("message_max_bytes = 999999999\n", "message_max_bytes"),
        (
            "group_session_timeout_ms = 1000\ngroup_heartbeat_interval_ms = 1000\n",
            "expected less than group_session_timeout_ms (1000)",
        ),
        ("port = [\n", "not valid TOML"),
    ],
)
def test_bad_settings_name_the_key(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "b.toml"
    path.write_text(text)
    with pytest.raises(cfg.ConfigError, match=None) as info:
        cfg.load(path)
    assert needle in str(info.value)


def test_every_serve_flag_is_a_setting() -> None:
    assert set(SERVE_FLAGS) <= set(cfg.SETTINGS)
    args = build_parser().parse_args(
        ["serve", "--port", "5", "--data-dir", "d", "--backend", "asyncio"]
    )
    overrides = {k: getattr(args, k) for k in SERVE_FLAGS if getattr(args, k) is not None}
    c = cfg.load(None, overrides)
    assert (c.port, c.data_dir, c.backend) == (5, "d", "asyncio")


@pytest.mark.parametrize(
    ("name", "value", "allowed"),
    [
        ("segment_bytes", 100, "1024..2147483647"),
        ("segment_bytes", 2**31, "1024..2147483647"),
        ("segment_ms", 1e300, "1..9223372036854775807"),
        ("segment_ms", 5.0, "1..9223372036854775807"),
        ("retention_ms", float("inf"), "-1..9223372036854775807"),
        ("retention_ms", float("nan"), "-1..9223372036854775807"),
        ("retention_ms", -2, "-1..9223372036854775807"),
        ("retention_bytes", 2**63, "-1..9223372036854775807"),
        ("port", True, "0..65535"),
        ("port", "80.5", "0..65535"),
        ("port", " 80", "0..65535"),
        ("port", "1e3", "0..65535"),
        ("max_connections", 0, "1..2147483647"),
        ("segment_index_bytes", 8, "16..2147483647"),
        ("backend", "gevent", "trio or asyncio"),
        ("log_level", 1, "debug, info, warning or error"),
        ("fetch_zero_copy", 1, "true or false"),
        ("host", 5, "any string"),
    ],
)
def test_one_check_rejects_with_the_setting_and_its_range(
    name: str, value: object, allowed: str
) -> None:
    with pytest.raises(cfg.ConfigError) as info:
        cfg.SETTINGS[name].check(value)
    assert f"setting {name}=" in str(info.value) and allowed in str(info.value)


@pytest.mark.parametrize(
    ("name", "value", "parsed"),
    [
        ("port", "80", 80),
        ("retention_ms", "-1", -1),
        ("retention_bytes", 2**63 - 1, 2**63 - 1),
        ("fetch_zero_copy", "False", False),
        ("segment_bytes", 1024, 1024),
    ],
)
def test_integer_strings_and_bounds_are_accepted(name: str, value: object, parsed: object) -> None:
    assert cfg.SETTINGS[name].check(value) == parsed


def test_every_integer_setting_has_bounds_and_ms_or_bytes_names_their_unit() -> None:
    for s in cfg.SETTINGS.values():
        if s.kind is int:
            assert s.min is not None and s.max is not None and s.min <= s.default <= s.max
        for unit, suffix in (("ms", "_ms"), ("bytes", "_bytes")):
            assert (s.unit == unit) == s.name.endswith(suffix), s.name
        s.check(s.default)


def test_flags_are_checked_by_the_table(tmp_path: Path) -> None:
    """A bad flag gets the same one-line message and exit code 2 as a bad file."""
    from broker.cli import main

    for flag, value in (("--port", "1.5"), ("--metrics-port", "-2"), ("--backend", "x")):
        assert main(["serve", flag, value, "--data-dir", str(tmp_path)]) == 2


def test_a_mistyped_config_key_is_one_line_that_suggests_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from broker.cli import main

    path = tmp_path / "b.toml"
    path.write_text("retension_ms = 60000\n")
    assert main(["serve", "--config", str(path), "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"minibroker: {path}: unknown setting 'retension_ms'; did you mean 'retention_ms'?\n"
    )


@pytest.mark.parametrize(
    ("text", "error"),
    [
        # A typo in a listener's key is suggested its key, as a top-level one is.
        (
            '[[listeners]]\nname = "a"\nhost = "127.0.0.1"\nport = 0\nprotocl = "kafka"\n',
            "listeners[1] (a): unknown key 'protocl'; known: name, host, port, security, "
            "advertised_host, advertised_port, protocol, max_connections; did you mean "
            "'protocol'?",
        ),
        # An error of the settings as a whole names the file too.
        ('tls_client_auth = "required"\n', "tls_cafile"),
    ],
)
def test_every_config_error_names_its_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, error: str
) -> None:
    from broker.cli import main

    path = tmp_path / "b.toml"
    path.write_text(text)
    assert main(["serve", "--config", str(path), "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"minibroker: {path}: ")
    assert error in err
    assert err.count("\n") == 1


def test_flag_error_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from broker.cli import main

    assert main(["serve", "--port", "1.5", "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == "minibroker: setting port='1.5' is invalid: expected an integer in 0..65535\n"


def test_message_max_bytes_is_at_most_max_frame_bytes() -> None:
    with pytest.raises(cfg.ConfigError, match="at most max_frame_bytes"):
        cfg.load(None, {"max_frame_bytes": 4096, "message_max_bytes": 8192})


def test_topic_overrides_take_dotted_or_our_names_and_the_same_bounds() -> None:
    assert cfg.topic_overrides({"retention.ms": "1000", "segment_bytes": 4096}) == {
        "retention_ms": 1000,
        "segment_bytes": 4096,
    }
    with pytest.raises(cfg.ConfigError, match=r"'segment\.bytes'.*1024\.\.2147483647"):
        cfg.topic_overrides({"segment.bytes": 100})
    with pytest.raises(cfg.ConfigError, match=r"unknown topic config 'cleanup\.policy' \("):
        cfg.topic_overrides({"cleanup.policy": "compact"})
    # A misspelt key is suggested the way it was spelt: Kafka's dotted name or ours.
    with pytest.raises(cfg.ConfigError, match=r"'segment\.byte'; did you mean 'segment\.bytes'\?"):
        cfg.topic_overrides({"segment.byte": 4096})
    with pytest.raises(cfg.ConfigError, match=r"'retension_ms'; did you mean 'retention_ms'\?"):
        cfg.topic_overrides({"retension_ms": 1})
    # Broker-only settings are no topic config, whatever they are called.
    with pytest.raises(cfg.ConfigError, match="unknown topic config"):
        cfg.topic_overrides({"max_connections": 5})


def test_an_alteration_is_checked_as_create_topics_config_and_all_or_nothing() -> None:
    current = {"retention_ms": 1000, "segment_ms": 5000}
    ops = [("retention.bytes", "set", "4096"), ("segment_ms", "delete", None)]
    assert cfg.altered_overrides(current, ops) == {"retention_ms": 1000, "retention_bytes": 4096}
    # Deleting what is not overridden changes nothing.
    assert cfg.altered_overrides(current, [("index.interval.bytes", "delete", None)]) == current
    for ops, needle in [
        ([("segment.bytes", "set", "100")], r"'segment\.bytes'.*1024\.\.2147483647"),
        ([("retention.ms", "set", None)], r"'retention\.ms'.*retention_ms=None"),
        ([("retention.ms", "set", "1e3")], r"'retention\.ms'"),
        ([("cleanup.policy", "delete", None)], r"unknown topic config 'cleanup\.policy'"),
        ([("max_connections", "set", "5")], "unknown topic config 'max_connections'"),
    ]:
        with pytest.raises(cfg.ConfigError, match=needle):
            cfg.altered_overrides(current, [("retention.bytes", "set", "1"), *ops])
    with pytest.raises(cfg.SettingNamedTwice, match=r"'retention\.ms' and 'retention_ms'"):
        cfg.altered_overrides(
            current, [("retention.ms", "set", "1"), ("retention_ms", "delete", None)]
        )
    assert current == {"retention_ms": 1000, "segment_ms": 5000}  # never changed in place


def test_describe_says_where_each_value_comes_from() -> None:
    config = cfg.BrokerConfig(
        retention_ms=1000, segment_bytes=cfg.SETTINGS["segment_bytes"].default
    )
    topic = {d.name: d for d in cfg.describe_topic(config, {"segment_bytes": 4096})}
    assert list(topic) == list(cfg.TOPIC_SETTINGS)
    assert topic["segment.bytes"] == cfg.Described("segment.bytes", "4096", "topic", False, False)
    assert topic["retention.ms"] == cfg.Described("retention.ms", "1000", "broker", False, False)
    assert topic["segment.ms"].source == "default"
    broker = {d.name: d for d in cfg.describe_broker(config)}
    assert list(broker) == list(cfg.SETTINGS)
    # A value equal to the declared default is the default, wherever it was written.
    assert broker["segment_bytes"].source == "default"
    assert broker["retention_ms"] == cfg.Described("retention_ms", "1000", "broker", False, False)
    assert broker["port"].read_only and not broker["log_level"].read_only
    assert {d.name for d in broker.values() if not d.read_only} == cfg.RELOADABLE
    assert broker["auto_create_topics"].value == "true"


def test_a_sensitive_setting_is_described_without_its_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    secret = replace(cfg.SETTINGS["pid_file"], sensitive=True)
    monkeypatch.setitem(cfg.SETTINGS, "pid_file", secret)
    config = cfg.BrokerConfig(pid_file="/run/secret")
    [described] = [d for d in cfg.describe_broker(config) if d.name == "pid_file"]
    assert described == cfg.Described("pid_file", None, "broker", True, True)


def test_log_config_takes_its_defaults_and_bounds_from_the_table() -> None:
    from dataclasses import fields

    from broker.storage.log import LogConfig

    defaults = LogConfig()
    for f in fields(LogConfig):
        assert getattr(defaults, f.name) == cfg.SETTINGS[f.name].default
    assert {f.name for f in fields(LogConfig)} == {s.name for s in cfg.TOPIC_SETTINGS.values()}
    with pytest.raises(cfg.ConfigError, match="segment_bytes=100"):
        LogConfig(segment_bytes=100)


def test_sighup_reload_uses_the_same_check(tmp_path: Path) -> None:
    """The reload path is `load` again: a bad value there is the same ConfigError."""
    path = tmp_path / "b.toml"
    path.write_text("retention_ms = 1.5\n")
    with pytest.raises(cfg.ConfigError, match=r"setting retention_ms=1\.5 is invalid"):
        cfg.load(path)
