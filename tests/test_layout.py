"""The `minibroker` command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from broker import __version__

ROOT = Path(__file__).resolve().parent.parent


def test_minibroker_version() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "broker", "--version"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"minibroker {__version__}"
    assert __version__ != "unknown"  # the test environment has minibroker installed
