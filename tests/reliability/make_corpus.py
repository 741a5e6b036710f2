"""Write the atheris seed corpus: real request frames and batches, one file each.

Run: python -m tests.reliability.make_corpus (the `make fuzz` target does).
Each file starts with the selector byte of `fuzz_targets.one_input`.
"""

from __future__ import annotations

from pathlib import Path

from protocol import messages as m
from protocol.batch import build_batch
from protocol.framing import frame

CORPUS = Path(__file__).parent / "corpus"


def seeds() -> dict[str, bytes]:
    batch = build_batch([(1_700_000_000_000, b"k", b"v", [("h", b"x")])], producer_id=7)
    requests: dict[str, m.Request] = {
        "api_versions": m.ApiVersionsRequest(),
        "metadata": m.MetadataRequest(topics=["a", "b"], allow_auto_create=True),
        "create_topics": m.CreateTopicsRequest(
            topics=[m.CreatableTopic(name="t", partitions=3, config={"retention_ms": "1000"})]
        ),
        "init_producer_id": m.InitProducerIdRequest(transactional_id="tx"),
        "produce": m.ProduceRequest(
            acks=-1,
            timeout_ms=1000,
            topics=[
                m.ProduceTopic(
                    topic="t", partitions=[m.ProducePartition(partition=0, records=batch)]
                )
            ],
        ),
        "fetch": m.FetchRequest(
            max_wait_ms=0,
            min_bytes=1,
            max_bytes=1 << 20,
            isolation_level=0,
            topics=[
                m.FetchTopic(
                    topic="t",
                    partitions=[
                        m.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)
                    ],
                )
            ],
        ),
    }
    out: dict[str, bytes] = {"batch": bytes([2]) + batch}
    for name, request in requests.items():
        body = m.encode_request(request, cid=1, client_id="corpus")
        out[f"frame_{name}"] = bytes([3]) + frame(body) + frame(body)  # two frames, chunk 2
        out[f"body_{name}"] = bytes([1]) + body
    return out


def main() -> None:
    CORPUS.mkdir(exist_ok=True)
    for name, data in seeds().items():
        (CORPUS / name).write_bytes(data)


if __name__ == "__main__":
    main()
