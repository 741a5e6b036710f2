"""Cost per request of the kafka listener's codec (broker/kafka), in process.

Each case is one request's codec work, decoding it and encoding its answer, on the
kafka listener, beside kafka-python's own protocol classes on the same bytes (the
alternative to kio that was weighed) and beside the minibroker listener's msgpack
codec on the same request:

- Produce v9 of one partition holding one 16 KiB v2 batch, answered: through a
  connection's codec, whose reader takes the fields of a request like the last without
  reading them again (a producer's steady state), read whole by `read_produce`, and
  with kio both ways (its reader, the translation, its writer: the references the
  hand-written reader and answer are held to);
- Fetch v12 of one partition, answered with its records spliced from a file (the
  frame around them, as sendfile sends them).

Best of `REPEAT` rounds, microseconds per request:

    .venv/bin/python -m bench.bench_kafka_codec [--number N]
"""

from __future__ import annotations

import argparse
import os
import timeit
from collections.abc import Callable

from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record.default_records import DefaultRecordBatchBuilder

from broker.api import SplicedReply
from broker.kafka import KafkaCodec
from broker.kafka.api import Exchange
from broker.kafka.apis.produce import (
    PRODUCE,
    answer_produce,
    produce_response,
    read_produce,
    translate_produce,
)
from broker.kafka.entities import build, read_request, request_class, response_class, write_response
from broker.kafka.records import ONLY_V2
from broker.storage import FileSpan
from harness.kafka_requests import fetch_request, produce_request
from protocol import messages as m
from protocol.framing import frame

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
    produce = produce_request("bench", batch, acks=-1, timeout_ms=30_000)
    produce.with_header(correlation_id=1, client_id="bench")
    produce_body = bytes(produce.encode(header=True))
    ours_produce = m.encode_request(
        m.ProduceRequest(
            acks=-1, topics=[m.ProduceTopic("bench", [m.ProducePartition(0, memoryview(batch))])]
        ),
        1,
    )
    answer = m.ProduceResponse(
        topics=[m.ProduceTopicResponse("bench", [m.ProducePartitionResponse(0, 0, 1234, -1, 0)])]
    )
    kp_answer = ProduceResponse[9](
        responses=[
            ProduceResponse.TopicProduceResponse(
                name="bench",
                partition_responses=[
                    ProduceResponse.TopicProduceResponse.PartitionProduceResponse(
                        index=0, error_code=0, base_offset=1234, log_start_offset=0
                    )
                ],
            )
        ],
        throttle_time_ms=0,
    )
    kp_answer.with_header(correlation_id=1)
    codec = KafkaCodec((), 1)
    codec_exchange = Exchange((), 1)

    def kafka_produce() -> object:
        request = codec.decode(produce_body)
        assert isinstance(request, m.Request)
        return codec.encode(answer, request.cid)

    def whole_produce() -> object:
        read_produce(produce_body, 9)
        return produce_response(answer, 9, 1)

    kio_request = request_class(PRODUCE.key, 9)
    assert kio_request is not None

    def kio_produce() -> object:
        _header, request = read_request(kio_request, produce_body)
        translate_produce(request, 9, codec_exchange)
        values = answer_produce(answer, 9, None)
        return write_response(build(response_class(PRODUCE.key, 9), values), 1)

    def kafka_python_produce() -> object:
        ProduceRequest[9].decode(produce_body, header=True)
        return kp_answer.encode(header=True)

    def minibroker_produce() -> object:
        request = m.decode_request(ours_produce)
        return frame(m.encode_response(answer, request.cid))

    placeholder = os.urandom(12) + (0).to_bytes(4, "big")
    fd = os.open(os.devnull, os.O_RDONLY)
    span = FileSpan(fd, 0, len(batch), 100, 100, ONLY_V2)

    def fetched() -> SplicedReply:
        response = m.FetchResponse(
            topics=[
                m.FetchTopicResponse(
                    "bench", [m.FetchPartitionResponse(0, 0, 100, 100, 0, None, placeholder)]
                )
            ]
        )
        return SplicedReply(response, [span], [placeholder])

    fetch = fetch_request("bench", max_wait_ms=500)
    fetch.with_header(correlation_id=2, client_id="bench")
    fetch_body = bytes(fetch.encode(header=True))
    ours_fetch = m.encode_request(
        m.FetchRequest(topics=[m.FetchTopic("bench", [m.FetchPartition(0, 0)])]), 2
    )
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
    kp_fetch.with_header(correlation_id=2)

    def kafka_fetch() -> object:
        request = codec.decode(fetch_body)
        assert isinstance(request, m.Request)
        return codec.pieces(fetched(), request.cid)

    def kafka_python_fetch() -> object:
        FetchRequest[12].decode(fetch_body, header=True)
        return kp_fetch.encode(header=True)

    def minibroker_fetch() -> object:
        request = m.decode_request(ours_fetch)
        return fetched().pieces(request.cid)

    return {
        "Produce v9, one 16 KiB batch: decode the request, encode the answer": {
            "kafka listener, a producer's steady state": kafka_produce,
            "kafka listener, the request read whole": whole_produce,
            "kio both ways": kio_produce,
            "kafka-python's classes both ways": kafka_python_produce,
            "minibroker listener (msgpack)": minibroker_produce,
        },
        "Fetch v12, one partition spliced from a file: decode, encode the answer": {
            "kafka listener (kio decode, hand-written answer)": kafka_fetch,
            "kafka-python's classes both ways": kafka_python_fetch,
            "minibroker listener (msgpack)": minibroker_fetch,
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
            print(f"  {name:<50} {best * 1e6:8.1f} us")


if __name__ == "__main__":
    main()
