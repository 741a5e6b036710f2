"""kcat (librdkafka's command-line client) against the kafka listener, on both backends:
it lists the metadata, consumes what minibroker's SDK wrote, and produces what it then
reads back. Skipped where kcat is not installed."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from client import Producer
from tests.conftest import BACKENDS
from tests.kafka.kafka_support import KafkaStack, stack_per_backend

KCAT = shutil.which("kcat")
pytestmark = pytest.mark.skipif(KCAT is None, reason="kcat is not installed")


@pytest.fixture(scope="module", params=BACKENDS)
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KafkaStack]:
    yield from stack_per_backend(request, tmp_path_factory, "kcat", proxied=False)


def kcat(stack: KafkaStack, *args: str, stdin: str | None = None) -> str:
    assert KCAT is not None
    done = subprocess.run(
        [KCAT, "-b", stack.kafka, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def consume(stack: KafkaStack, topic: str, fmt: str) -> list[str]:
    return kcat(stack, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e", "-f", fmt).split(
        "\n"
    )[:-1]


def test_kcat_lists_the_metadata(stack: KafkaStack) -> None:
    topic = stack.new_topic("kcat-meta", partitions=3)
    listing = kcat(stack, "-L", "-t", topic)
    assert f"at {stack.kafka}" in listing, listing
    assert f'topic "{topic}" with 3 partitions:' in listing, listing
    assert sorted(re.findall(r"partition (\d+), leader", listing)) == ["0", "1", "2"]


def test_kcat_consumes_what_the_sdk_wrote(stack: KafkaStack) -> None:
    """minibroker's batches (zstd, as the SDK compresses them) read by librdkafka: the
    keys, values and offsets in order, a null key printed empty."""
    topic = stack.new_topic("kcat-read")
    with Producer(stack.mb, compression_type="zstd", linger_ms=5) as producer:
        for i in range(50):
            producer.send(topic, f"v{i}", key=None if i % 10 == 0 else f"k{i}", partition=0)
        producer.flush(30)
    expected = [f"{'' if i % 10 == 0 else f'k{i}'} v{i} {i}" for i in range(50)]
    assert consume(stack, topic, "%k %s %o\n") == expected


def test_kcat_reads_back_what_it_produced(stack: KafkaStack) -> None:
    """kcat's producer (librdkafka's defaults, not idempotent) with keys and a header."""
    topic = stack.new_topic("kcat-write")
    lines = [f"k{i}:value {i}" for i in range(40)]
    kcat(stack, "-P", "-t", topic, "-p", "0", "-K:", "-H", "h=1", stdin="\n".join(lines) + "\n")
    expected = [f"k{i} value {i} {i} h=1" for i in range(40)]
    assert consume(stack, topic, "%k %s %o %h\n") == expected
