"""Cost per request of the kafka listener's codec (broker/kafka), in process.

Two cases, each the kafka listener's work on the hot path beside kafka-python's own
protocol classes on the same bytes (the alternative to kio that was weighed) and
beside the minibroker listener's msgpack codec on the same request:

- decode a Produce v9 request of one partition holding one 16 KiB v2 batch, from the
  frame body to the broker's ProduceRequest;
- encode the Fetch v12 response of one partition whose records go with sendfile (the
  frame around the records, spliced), the broker's FetchResponse in.

Best of `REPEAT` rounds, microseconds per request:

    .venv/bin/python -m bench.bench_kafka_codec [--number N]
"""

from __future__ import annotations

import argparse
import os
import timeit
from collections.abc import Callable

from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.protocol.producer import ProduceRequest
from kafka.record.default_records import DefaultRecordBatchBuilder

from broker.handlers import SplicedReply
from broker.kafka import KafkaCodec
from broker.kafka.records import ONLY_V2
from broker.storage import FileSpan
from protocol import messages as m

REPEAT = 5
BATCH_BYTES = 16 * 1024


def _batch() -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, False, 1000, 0, 0, 1 << 20)
    value = os.urandom(90)
    offset = 0
    while builder.size() < BATCH_BYTES - 200:
        builder.append(offset, 1_700_000_000_000, None, value, [])
        offset += 1
    return bytes(builder.build())


def _cases() -> dict[str, dict[str, Callable[[], object]]]:
    batch = _batch()
    topic = ProduceRequest.TopicProduceData
    produce = ProduceRequest[9](
        transactional_id=None,
        acks=-1,
        timeout_ms=30_000,
        topic_data=[
            topic(name="bench", partition_data=[topic.PartitionProduceData(index=0, records=batch)])
        ],
    )
    produce.with_header(correlation_id=1, client_id="bench")
    body = bytes(produce.encode(header=True))
    codec = KafkaCodec((), 1)
    ours = m.encode_request(
        m.ProduceRequest(acks=-1, topics=[m.ProduceTopic("bench", [m.ProducePartition(0, batch)])]),
        1,
    )

    placeholder = os.urandom(12) + (0).to_bytes(4, "big")
    fd = os.open(os.devnull, os.O_RDONLY)
    span = FileSpan(fd, 0, len(batch), 100, 100, ONLY_V2)

    def fetch_response() -> m.FetchResponse:
        return m.FetchResponse(
            topics=[
                m.FetchTopicResponse(
                    "bench", [m.FetchPartitionResponse(0, 0, 100, 100, 0, None, placeholder)]
                )
            ]
        )

    fetch_topic = FetchRequest.FetchTopic
    fetch = FetchRequest[12](
        max_wait_ms=500,
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=0,
        topics=[
            fetch_topic(
                topic="bench",
                partitions=[
                    fetch_topic.FetchPartition(
                        partition=0, fetch_offset=0, partition_max_bytes=1 << 20
                    )
                ],
            )
        ],
    )
    fetch.with_header(correlation_id=2, client_id="bench")
    fetch_body = bytes(fetch.encode(header=True))

    def kafka_fetch() -> object:
        request = codec.decode(fetch_body)
        assert isinstance(request, m.Request)
        return codec.pieces(SplicedReply(fetch_response(), [span], [placeholder]), request.cid)

    kp_fetch = FetchResponse[12](
        throttle_time_ms=0,
        error_code=0,
        session_id=0,
        responses=[
            FetchResponse.FetchableTopicResponse(
                topic="bench",
                partitions=[
                    FetchResponse.FetchableTopicResponse.PartitionData(
                        partition_index=0,
                        error_code=0,
                        high_watermark=100,
                        last_stable_offset=100,
                        log_start_offset=0,
                        aborted_transactions=None,
                        preferred_read_replica=-1,
                        records=placeholder,
                    )
                ],
            )
        ],
    )
    kp_fetch.with_header(correlation_id=1)
    return {
        "decode Produce v9, one 16 KiB batch": {
            "kio (kafka listener)": lambda: codec.decode(body),
            "kafka-python classes": lambda: ProduceRequest[9].decode(body, header=True),
            "msgpack (minibroker listener)": lambda: m.decode_request(ours),
        },
        "Fetch v12 answer, one spliced partition (decode + encode)": {
            "kio (kafka listener)": kafka_fetch,
            "kafka-python classes (encode only)": lambda: kp_fetch.encode(header=True),
            "msgpack (minibroker listener, encode only)": lambda: SplicedReply(
                fetch_response(), [span], [placeholder]
            ).pieces(1),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--number", type=int, default=2000)
    args = parser.parse_args()
    for case, timings in _cases().items():
        print(case)
        for name, call in timings.items():
            best = min(timeit.repeat(call, number=args.number, repeat=REPEAT)) / args.number
            print(f"  {name:<45} {best * 1e6:8.1f} us")


if __name__ == "__main__":
    main()
