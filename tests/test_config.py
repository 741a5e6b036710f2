"""The settings table is the single source for TOML keys, CLI flags and the docs."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker import config as cfg
from broker.cli import SERVE_FLAGS, build_parser

ROOT = Path(__file__).resolve().parent.parent


def test_docs_table_matches_the_code() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    assert cfg.markdown_table() in text, "regenerate with: minibroker config-table"


def test_toml_then_flags_override(tmp_path: Path) -> None:
    path = tmp_path / "b.toml"
    path.write_text('port = 1234\nretention_ms = 5000\nbackend = "asyncio"\n')
    c = cfg.load(path, {"port": 99})
    assert (c.port, c.retention_ms, c.backend) == (99, 5000, "asyncio")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("nonsense_key = 1\n", "unknown setting 'nonsense_key'"),
        ('port = "x"\n', "setting port must be an integer"),
        ("port = 70000\n", "setting port=70000 is invalid"),
        ('backend = "gevent"\n', "setting backend='gevent' is invalid"),
        ("message_max_bytes = 999999999\n", "message_max_bytes"),
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
    assert (args.port, args.data_dir, args.backend) == (5, "d", "asyncio")
