"""Helpers that the tests and the benchmarks share: a real broker process
(`harness.broker_process`), a raw-protocol client (`harness.wire`) and Kafka's
Produce and Fetch requests as kafka-python builds them (`harness.kafka_requests`).

Not part of the distribution (pyproject lists its packages) and imported from the
repository root, which pytest and ``python -m bench`` both put on ``sys.path``;
so `bench` needs no test module and `tests` no benchmark.
"""
