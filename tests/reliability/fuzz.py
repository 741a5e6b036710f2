"""The coverage-guided fuzzer: `make fuzz` runs this under atheris (libFuzzer).

    python -m tests.reliability.fuzz tests/reliability/corpus \
        -artifact_prefix=tests/reliability/crashes/ -max_total_time=60

Crash inputs land in tests/reliability/crashes/; test_fuzz_regressions.py
replays every one of them through the same target, so each becomes a test.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    from tests.reliability.fuzz_targets import one_input


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
