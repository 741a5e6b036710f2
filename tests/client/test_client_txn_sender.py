"""The transactional producer's requests over a scripted broker on loopback.

A few dozen lines of fake broker answer each request with what the test's
script says (an error, a dropped connection, silence), so the retry rules of
EndTxn, PrepareTxn, InitProducerId and TxnOffsetCommit are checked without the
real broker and without waiting on its timers: what is resent, with which pid
and epoch, and what the caller sees once max_block_ms is used up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc
import pytest

from client import (
    AsyncProducer,
    CommitFailedError,
    ConsumerGroupMetadata,
    IllegalStateError,
    MinibrokerTimeoutError,
    OffsetAndMetadata,
    ProducerFencedError,
    TopicPartition,
    TransactionAbortableError,
)
from protocol.batch import read_header
from protocol.errors import ErrorCode
from protocol.framing import FrameDecoder, frame
from protocol.messages import (
    APIS,
    ApiVersionsResponse,
    EndTxnResponse,
    InitProducerIdResponse,
    MetadataResponse,
    PartitionError,
    PartitionMetadata,
    PrepareTxnResponse,
    ProducePartitionResponse,
    ProduceResponse,
    ProduceTopicResponse,
    Request,
    Response,
    TopicMetadata,
    TopicPartitionErrors,
    TxnOffsetCommitResponse,
    decode_request,
    encode_response,
)

pytestmark = pytest.mark.anyio
E = ErrorCode
DROP = object()  # the script's answer that closes the connection instead of answering
PID = 42


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return request.param


class ScriptedBroker:
    """Answers ApiVersions, Metadata and Produce itself; every other request is logged in
    `seen` and answered by `script[api]`, a list consumed in order (its last entry repeats)."""

    def __init__(self, script: dict[str, list[Any]]) -> None:
        self.script = script
        self.seen: list[Request] = []
        self.port = 0

    def answer(self, request: Request) -> Any:
        if request.api == "ApiVersions":
            return ApiVersionsResponse(apis={api: [1, 1] for api in APIS})
        if request.api == "Metadata":
            partitions = [PartitionMetadata(p) for p in range(2)]
            return MetadataResponse(topics=[TopicMetadata("t", partitions=partitions)])
        self.seen.append(request)
        if request.api == "Produce":
            return ProduceResponse(
                topics=[
                    ProduceTopicResponse(
                        t.topic, [ProducePartitionResponse(p.partition) for p in t.partitions]
                    )
                    for t in request.topics  # type: ignore[attr-defined]
                ]
            )
        answers = self.script[request.api]
        return answers.pop(0) if len(answers) > 1 else answers[0]

    async def serve(self, stream: anyio.abc.SocketStream) -> None:
        decoder = FrameDecoder()
        async with stream:
            async for data in stream:
                for body in decoder.feed_bodies(data):
                    request = decode_request(body)
                    response = self.answer(request)
                    if response is DROP:
                        return
                    assert isinstance(response, Response)
                    await stream.send(frame(encode_response(response, request.cid)))


async def run_against(
    script: dict[str, list[Any]], work: Callable[[AsyncProducer], Any], **config: Any
) -> ScriptedBroker:
    broker = ScriptedBroker(script)
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    broker.port = listener.extra(anyio.abc.SocketAttribute.local_port)
    settings = {
        "transactional_id": "tx",
        "retry_backoff_ms": 1,
        "retry_backoff_max_ms": 5,
        "reconnect_backoff_ms": 1,
        "reconnect_backoff_max_ms": 5,
        "request_timeout_ms": 2_000,
        "delivery_timeout_ms": 5_000,
    }
    settings.update(config)
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, broker.serve)
        async with AsyncProducer(f"127.0.0.1:{broker.port}", **settings) as producer:
            await work(producer)
        tg.cancel_scope.cancel()
    return broker


def init_ok(epoch: int = 0) -> InitProducerIdResponse:
    return InitProducerIdResponse(producer_id=PID, producer_epoch=epoch)


def sent(broker: ScriptedBroker, api: str) -> list[Any]:
    return [r for r in broker.seen if r.api == api]


async def test_produce_carries_the_transactional_id_and_transactional_batches() -> None:
    async def work(producer: AsyncProducer) -> None:
        await producer.init_transactions()
        await producer.begin_transaction()
        await producer.send("t", b"x", partition=1)
        await producer.commit_transaction()
        await producer.begin_transaction()
        await producer.send("t", b"y", partition=1)
        await producer.commit_transaction()

    broker = await run_against(
        {
            "InitProducerId": [init_ok(3)],
            "EndTxn": [
                EndTxnResponse(producer_id=PID, producer_epoch=4),
                EndTxnResponse(producer_id=PID, producer_epoch=5),
            ],
        },
        work,
    )
    (init,) = sent(broker, "InitProducerId")
    assert (init.transactional_id, init.transaction_timeout_ms) == ("tx", 60_000)
    headers = []
    for produce in sent(broker, "Produce"):
        assert produce.transactional_id == "tx"
        headers += [read_header(p.records) for t in produce.topics for p in t.partitions]
    assert [(h.is_transactional, h.producer_epoch, h.base_sequence) for h in headers] == [
        (True, 3, 0),
        (True, 4, 0),  # the epoch EndTxn handed out, sequences from 0
    ]
    ends = sent(broker, "EndTxn")
    assert [(e.producer_epoch, e.committed) for e in ends] == [(3, True), (4, True)]


async def test_endtxn_is_resent_after_retriable_errors_and_lost_connections() -> None:
    async def work(producer: AsyncProducer) -> None:
        await producer.init_transactions()
        await producer.begin_transaction()
        await producer.commit_transaction()
        assert producer.metrics()["producer_epoch"] == 1

    broker = await run_against(
        {
            "InitProducerId": [init_ok()],
            "EndTxn": [
                EndTxnResponse(error=E.CONCURRENT_TRANSACTIONS),
                DROP,
                EndTxnResponse(error=E.REQUEST_TIMED_OUT),
                EndTxnResponse(producer_id=PID, producer_epoch=1),
            ],
        },
        work,
    )
    ends = sent(broker, "EndTxn")
    assert len(ends) == 4
    assert {(e.producer_id, e.producer_epoch, e.committed) for e in ends} == {(PID, 0, True)}


async def test_a_commit_out_of_time_can_be_called_again() -> None:
    answers = [EndTxnResponse(error=E.CONCURRENT_TRANSACTIONS)] * 1000 + [
        EndTxnResponse(producer_id=PID, producer_epoch=1)
    ]

    async def work(producer: AsyncProducer) -> None:
        await producer.init_transactions()
        await producer.begin_transaction()
        with pytest.raises(MinibrokerTimeoutError, match="CONCURRENT_TRANSACTIONS"):
            await producer.commit_transaction()
        with pytest.raises(IllegalStateError, match=r"commit_transaction\(\) again"):
            await producer.abort_transaction()  # the outcome is unknown: only a commit
        answers[:] = answers[-1:]
        await producer.commit_transaction()
        await producer.begin_transaction()

    await run_against({"InitProducerId": [init_ok()], "EndTxn": answers}, work, max_block_ms=100)


async def test_fenced_answers_are_fatal() -> None:
    async def work(producer: AsyncProducer) -> None:
        await producer.init_transactions()
        await producer.begin_transaction()
        with pytest.raises(ProducerFencedError):
            await producer.prepare_transaction()
        with pytest.raises(ProducerFencedError):
            await producer.send("t", b"x", partition=0)
        with pytest.raises(ProducerFencedError):
            await producer.init_transactions()

    broker = await run_against(
        {
            "InitProducerId": [init_ok()],
            "PrepareTxn": [PrepareTxnResponse(error=E.PRODUCER_FENCED)],
        },
        work,
    )
    (prepare,) = sent(broker, "PrepareTxn")
    assert prepare.prepared_timeout_ms == 3_600_000


async def test_init_transactions_is_resent_until_answered() -> None:
    async def work(producer: AsyncProducer) -> None:
        await producer.init_transactions()
        assert producer.metrics()["producer_epoch"] == 7

    broker = await run_against(
        {
            "InitProducerId": [
                DROP,
                InitProducerIdResponse(error=E.CONCURRENT_TRANSACTIONS),
                init_ok(7),
            ]
        },
        work,
    )
    assert len(sent(broker, "InitProducerId")) == 3


# --------------------------------------------------------------------------- offsets


def offsets_answer(*codes: int) -> TxnOffsetCommitResponse:
    """TxnOffsetCommit's answer for partitions 0.. of topic "in", one code each."""
    return TxnOffsetCommitResponse(
        topics=[TopicPartitionErrors("in", [PartitionError(p, c) for p, c in enumerate(codes)])]
    )


GROUP = ConsumerGroupMetadata("g", "member-1", 4)
OFFSETS = {TopicPartition("in", 0): 10, TopicPartition("in", 1): OffsetAndMetadata(20, "m")}


async def test_offsets_join_the_transaction_with_the_producer_and_the_member() -> None:
    async def work(producer: AsyncProducer) -> None:
        await producer.init_transactions()
        with pytest.raises(IllegalStateError, match="send_offsets_to_transaction"):
            await producer.send_offsets_to_transaction(OFFSETS, GROUP)  # no transaction begun
        await producer.begin_transaction()
        await producer.send("t", b"x", partition=0)
        await producer.send_offsets_to_transaction(OFFSETS, GROUP)
        await producer.commit_transaction()

    broker = await run_against(
        {
            "InitProducerId": [init_ok(3)],
            "TxnOffsetCommit": [
                offsets_answer(E.NONE, E.CONCURRENT_TRANSACTIONS),  # retriable: resent
                offsets_answer(E.NONE),
            ],
            "EndTxn": [EndTxnResponse(producer_id=PID, producer_epoch=4)],
        },
        work,
    )
    first, again = sent(broker, "TxnOffsetCommit")
    assert (first.transactional_id, first.producer_id, first.producer_epoch) == ("tx", PID, 3)
    assert (first.group_id, first.member_id, first.member_epoch) == ("g", "member-1", 4)
    assert [(p.partition, p.offset, p.metadata) for p in first.topics[0].partitions] == [
        (0, 10, None),
        (1, 20, "m"),
    ]
    assert [p.partition for p in again.topics[0].partitions] == [1]
    assert [r.api for r in broker.seen][-1] == "EndTxn"


@pytest.mark.parametrize("code", [E.FENCED_MEMBER_EPOCH, E.STALE_MEMBER_EPOCH, E.UNKNOWN_MEMBER_ID])
async def test_a_refused_member_makes_the_transaction_abortable(code: int) -> None:
    async def work(producer: AsyncProducer) -> None:
        await producer.init_transactions()
        await producer.begin_transaction()
        with pytest.raises(CommitFailedError) as info:
            await producer.send_offsets_to_transaction(OFFSETS, GROUP)
        assert isinstance(info.value, TransactionAbortableError)
        assert info.value.code == code
        with pytest.raises(TransactionAbortableError):
            await producer.commit_transaction()
        await producer.abort_transaction()
        await producer.begin_transaction()  # the producer goes on

    broker = await run_against(
        {
            "InitProducerId": [init_ok()],
            "TxnOffsetCommit": [offsets_answer(code, code)],
            "EndTxn": [EndTxnResponse(producer_id=PID, producer_epoch=1)],
        },
        work,
    )
    # The second abort is close() ending the transaction begun last.
    assert [e.committed for e in sent(broker, "EndTxn")] == [False, False]


async def test_a_fenced_producer_sending_offsets_is_fatal() -> None:
    async def work(producer: AsyncProducer) -> None:
        await producer.init_transactions()
        await producer.begin_transaction()
        with pytest.raises(ProducerFencedError):
            await producer.send_offsets_to_transaction(OFFSETS, "g")
        with pytest.raises(ProducerFencedError):
            await producer.begin_transaction()

    broker = await run_against(
        {
            "InitProducerId": [init_ok()],
            "TxnOffsetCommit": [TxnOffsetCommitResponse(error=E.PRODUCER_FENCED)],
        },
        work,
    )
    (request,) = sent(broker, "TxnOffsetCommit")
    assert (request.member_id, request.member_epoch) == ("", -1)  # a group id alone
