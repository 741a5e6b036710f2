"""Option parsing, schema checks and Arrow conversion: no SparkSession, no broker."""

from __future__ import annotations

import logging
import pickle

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from client import BatchMetadata, ConsumerRecord, TxnHandle
from spark_connector import (
    SCHEMA,
    MinibrokerCommitMessage,
    MinibrokerDataSource,
    MinibrokerOptionError,
    OffsetRange,
    PartitionRange,
)
from spark_connector.options import (
    DELIVERY,
    TASK_TRANSACTION_TIMEOUT_MS,
    read_options,
    stream_app_id,
    stream_read_options,
    write_options,
)
from spark_connector.reader import ARROW_SCHEMA, HEADERS_TYPE, split, to_arrow
from spark_connector.stream_reader import from_json, rate_limited, to_json
from spark_connector.writer import MinibrokerWriter

BOOT = {"minibroker.bootstrap.servers": "127.0.0.1:1"}


def schema(**columns: object) -> StructType:
    return StructType([StructField(name, t) for name, t in columns.items()])  # type: ignore[arg-type]


VALUE_ONLY = schema(value=StringType())


def test_arrow_schema_is_what_spark_expects() -> None:
    assert to_arrow_schema(SCHEMA, timezone="UTC").equals(ARROW_SCHEMA)


def test_minibroker_options_pass_through_typed() -> None:
    opts = write_options(
        {
            **BOOT,
            "topic": "t",
            "minibroker.linger.ms": "20",
            "minibroker.enable.idempotence": "TRUE",
            "minibroker.acks": "all",
            "minibroker.compression.type": "zstd",
            "minibroker.max.in.flight.requests.per.connection": "3",
        },
        VALUE_ONLY,
    )
    assert opts.bootstrap == "127.0.0.1:1"
    assert opts.producer["linger_ms"] == 20
    assert opts.producer["enable_idempotence"] is True
    assert opts.producer["acks"] == "all"
    assert opts.producer["compression_type"] == "zstd"
    assert opts.producer["max_in_flight_requests_per_connection"] == 3
    assert opts.delivery_timeout_s == 120  # the client's default


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"topic": "t"}, "'minibroker.bootstrap.servers' is required"),
        ({**BOOT, "topic": "t", "minibroker.linger.ms": "soon"}, "'minibroker.linger.ms' must be"),
        ({**BOOT, "topic": "t", "minibroker.acks": "2"}, "acks must be 'all', -1, 1 or 0"),
        ({**BOOT, "topic": "t", "minibroker.acks": "1"}, "enable_idempotence requires acks"),
        ({**BOOT, "topic": "t", "minibroker.batch.size": "0"}, "batch_size must be positive"),
        ({**BOOT, "topic": "t", "minibroker.transactional.id": "x"}, "not a producer setting"),
        ({"minibroker.bootstrap.servers": "h:port", "topic": "t"}, "must be host:port"),
        ({**BOOT, "topic": "t", "minibroker.enable.idempotence": "yes"}, "idempotence' must be"),
        ({**BOOT, "topic": "t", "minibroker.no.such": "1"}, "'minibroker.no.such' is not a"),
        ({**BOOT, "topic": "t", "minibroker.compression.type": "brotli"}, "compression_type"),
        ({**BOOT, "topic": " "}, "option 'topic' must not be empty"),
        (BOOT, "set option 'topic' or add a string column 'topic'"),
    ],
)
def test_bad_write_options_are_named(options: dict[str, str], message: str) -> None:
    with pytest.raises(MinibrokerOptionError, match=message):
        write_options(options, VALUE_ONLY)


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"key": StringType()}, "column 'value' .* is required"),
        ({"value": IntegerType()}, "column 'value' must be string or binary, got int"),
        ({"value": BinaryType(), "key": LongType()}, "column 'key' must be string or binary"),
        ({"value": BinaryType(), "partition": StringType()}, "'partition' must be an integer"),
        ({"value": BinaryType(), "headers": ArrayType(StringType())}, "column 'headers' must be"),
        ({"value": BinaryType(), "topic": BinaryType()}, "column 'topic' must be string"),
    ],
)
def test_bad_write_columns_are_named(columns: dict[str, object], message: str) -> None:
    with pytest.raises(MinibrokerOptionError, match=message):
        write_options({**BOOT, "topic": "t"}, schema(**columns))


def test_overwrite_is_refused() -> None:
    source = MinibrokerDataSource({**BOOT, "topic": "t"})
    with pytest.raises(MinibrokerOptionError, match=r"overwrite.*append-only"):
        source.writer(VALUE_ONLY, overwrite=True)


def test_writer_pickles_with_one_write_id() -> None:
    writer = MinibrokerDataSource({**BOOT, "topic": "t"}).writer(VALUE_ONLY, overwrite=False)
    copy = pickle.loads(pickle.dumps(writer))
    assert copy.write_id == writer.write_id
    assert copy.options == writer.options


def test_read_options() -> None:
    opts = read_options(
        {
            **BOOT,
            "subscribe": "a, b",
            "startingoffsets": '{"a": {"0": 5, "1": -2}, "b": {"0": -2}}',
            "endingoffsets": "latest",
            "isolation.level": "read_uncommitted",
            "maxrecordsperpartition": "100",
            "minibroker.max.partition.fetch.bytes": "65536",
        }
    )
    assert opts.topics == ("a", "b")
    assert opts.starting.for_partition("a", 0) == 5
    assert opts.starting.for_partition("a", 1) == -2
    assert opts.ending.for_partition("b", 7) == -1
    assert opts.isolation_level == "read_uncommitted"
    assert opts.max_records_per_partition == 100
    assert opts.consumer == {"max_partition_fetch_bytes": 65536}
    assert read_options({**BOOT, "topic": "a"}).isolation_level == "read_committed"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"topic": "t"}, "'minibroker.bootstrap.servers' is required"),
        (BOOT, "exactly one of option 'topic'"),
        ({**BOOT, "topic": "a", "subscribe": "b"}, "exactly one of option 'topic'"),
        ({**BOOT, "topic": "a,b"}, "option 'topic' must name a topic"),
        ({**BOOT, "topic": "a", "startingoffsets": "first"}, "'startingOffsets' must be"),
        ({**BOOT, "topic": "a", "endingoffsets": '{"a": {"0": -3}}'}, "'endingOffsets': topic"),
        ({**BOOT, "topic": "a", "startingoffsets": '{"b": {"0": 1}}'}, "not read: b"),
        ({**BOOT, "subscribe": "a,b", "endingoffsets": '{"a": {"0": 1}}'}, "missing: b"),
        ({**BOOT, "topic": "a", "isolation.level": "dirty"}, "'isolation.level' must be"),
        ({**BOOT, "topic": "a", "maxrecordsperpartition": "0"}, "'maxRecordsPerPartition'"),
        ({**BOOT, "topic": "a", "minibroker.linger.ms": "5"}, "not a consumer setting"),
        ({**BOOT, "topic": "a", "minibroker.fetch.max.wait.ms": "x"}, "must be an integer"),
        ({**BOOT, "topic": "a", "minibroker.request.timeout.ms": "10"}, "request_timeout_ms"),
    ],
)
def test_bad_read_options_are_named(options: dict[str, str], message: str) -> None:
    with pytest.raises(MinibrokerOptionError, match=message):
        read_options(options)


def test_fixed_read_schema() -> None:
    source = MinibrokerDataSource({**BOOT, "topic": "a"})
    assert source.schema() == SCHEMA
    with pytest.raises(MinibrokerOptionError, match="fixed schema"):
        source.reader(VALUE_ONLY)


def test_split_into_offset_ranges() -> None:
    ranges = [OffsetRange("t", 0, 10, 35), OffsetRange("t", 1, 4, 4)]
    assert split(ranges, 10) == [
        OffsetRange("t", 0, 10, 20),
        OffsetRange("t", 0, 20, 30),
        OffsetRange("t", 0, 30, 35),
    ]
    assert split(ranges, None) == [OffsetRange("t", 0, 10, 35)]


def test_records_to_arrow() -> None:
    records = [
        ConsumerRecord("t", 2, 7, 1_700_000_000_123, b"k", b"v", [("h", b"x")]),
        ConsumerRecord("t", 2, 8, 1_700_000_000_124, None, None, []),
    ]
    batch = to_arrow(records, "t", 2)
    assert batch.schema.equals(ARROW_SCHEMA)
    rows = batch.to_pylist()
    assert rows[0]["headers"] == [{"key": "h", "value": b"x"}]
    assert rows[1]["headers"] is None
    assert rows[0]["timestamp"].timestamp() == pytest.approx(1_700_000_000.123)
    assert [r["offset"] for r in rows] == [7, 8]
    assert {r["partition"] for r in rows} == {2}


def writer_for(columns: StructType, **options: str) -> MinibrokerWriter:
    return MinibrokerWriter(write_options({**BOOT, **options}, columns))


def test_groups_without_topic_or_partition_column_send_whole_batch() -> None:
    writer = writer_for(schema(value=StringType(), key=BinaryType()), topic="t")
    batch = pa.table({"value": ["a", "b"], "key": [b"1", None]})
    [(topic, partition, values, keys, headers)] = list(writer._groups(batch))
    assert (topic, partition, headers) == ("t", None, None)
    assert values.to_pylist() == [b"a", b"b"]
    assert keys.to_pylist() == [b"1", None]


def test_groups_split_by_topic_and_partition_columns_in_row_order() -> None:
    writer = writer_for(
        schema(
            value=BinaryType(), topic=StringType(), partition=IntegerType(), headers=HEADERS_TYPE
        )
    )
    batch = pa.table(
        {
            "value": [b"0", b"1", b"2", b"3", b"4"],
            "topic": ["x", "y", "x", "x", "y"],
            "partition": pa.array([0, 1, 0, None, 1], pa.int32()),
            "headers": pa.array(
                [[{"key": "a", "value": b"1"}], None, [], None, None],
                pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
            ),
        }
    )
    groups = {(t, p): (v.to_pylist(), h) for t, p, v, _k, h in writer._groups(batch)}
    assert groups == {
        ("x", 0): ([b"0", b"2"], [[("a", b"1")], []]),
        ("y", 1): ([b"1", b"4"], [None, None]),
        ("x", None): ([b"3"], [None]),
    }


def test_null_header_value_fails_the_task() -> None:
    writer = writer_for(schema(value=BinaryType(), headers=HEADERS_TYPE), topic="t")
    headers = pa.array(
        [[{"key": "a", "value": None}]],
        pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
    )
    with pytest.raises(ValueError, match="null header key or value"):
        list(writer._groups(pa.table({"value": [b"0"], "headers": headers})))


def test_topic_option_overrides_topic_column() -> None:
    writer = writer_for(schema(value=BinaryType(), topic=StringType()), topic="forced")
    batch = pa.table({"value": [b"0"], "topic": ["ignored"]})
    assert [g[0] for g in writer._groups(batch)] == ["forced"]


def test_null_topic_fails_the_task() -> None:
    writer = writer_for(schema(value=BinaryType(), topic=StringType()))
    batch = pa.table({"value": [b"0"], "topic": pa.array([None], pa.string())})
    with pytest.raises(ValueError, match="column 'topic' holds a null"):
        list(writer._groups(batch))


def test_commit_logs_one_line_summary(caplog: pytest.LogCaptureFixture) -> None:
    writer = writer_for(VALUE_ONLY, topic="t", **{DELIVERY: "at_least_once"})
    messages = [
        MinibrokerCommitMessage(writer.write_id, 0, 0, 3, (PartitionRange("t", 0, 3, 0, 4),)),
        MinibrokerCommitMessage(writer.write_id, 1, 1, 2, (PartitionRange("t", 0, 2, 2, 6),)),
    ]
    assert pickle.loads(pickle.dumps(messages[0])) == messages[0]
    with caplog.at_level(logging.INFO, logger="minibroker.spark_connector"):
        writer.commit(messages)
        writer.abort([messages[0], None])
    committed, aborted = caplog.records
    assert committed.getMessage() == (
        f"minibroker write {writer.write_id} committed: 5 rows from 2 tasks (1 retried) "
        "to t[0] 5 rows in offsets 0..6"
    )
    assert aborted.levelno == logging.WARNING
    assert "aborted: 1 of 2 tasks had finished" in aborted.getMessage()


def test_delivery_is_exactly_once_unless_told() -> None:
    opts = write_options({**BOOT, "topic": "t"}, VALUE_ONLY)
    assert opts.exactly_once
    assert opts.producer["transaction_timeout_ms"] == TASK_TRANSACTION_TIMEOUT_MS
    assert DELIVERY.replace(".", "_") not in opts.producer
    told = write_options(
        {**BOOT, "topic": "t", DELIVERY: "AT_LEAST_ONCE", "minibroker.transaction.timeout.ms": "5"},
        VALUE_ONLY,
    )
    assert not told.exactly_once
    with pytest.raises(MinibrokerOptionError, match="must be exactly_once or at_least_once"):
        write_options({**BOOT, "topic": "t", DELIVERY: "twice"}, VALUE_ONLY)
    with pytest.raises(MinibrokerOptionError, match="transaction_timeout_ms must be positive"):
        write_options({**BOOT, "topic": "t", "minibroker.transaction.timeout.ms": "0"}, VALUE_ONLY)


def test_commit_message_pickles_with_its_handle() -> None:
    message = MinibrokerCommitMessage("w", 3, 1, 10, (), TxnHandle("w.p3.a1", 7, 2))
    assert pickle.loads(pickle.dumps(message)) == message


def test_stream_identity_is_the_checkpoint_or_else_the_query_name() -> None:
    by_checkpoint = stream_app_id({"checkpointlocation": "/ck/q1", "queryname": "a"})
    assert by_checkpoint == stream_app_id({"checkpointlocation": " /ck/q1 ", "queryname": "b"})
    assert by_checkpoint != stream_app_id({"checkpointlocation": "/ck/q2"})
    assert by_checkpoint.startswith("spark-stream-") and len(by_checkpoint) == 33
    assert stream_app_id({"queryname": "q"}) != stream_app_id({"queryname": "r"})
    with pytest.raises(MinibrokerOptionError, match="needs the query's identity"):
        stream_app_id({})
    source = MinibrokerDataSource({**BOOT, "topic": "t", "checkpointlocation": "/ck"})
    assert source.streamWriter(VALUE_ONLY, overwrite=False).app_id == stream_app_id(
        {"checkpointlocation": "/ck"}
    )
    loose = MinibrokerDataSource({**BOOT, "topic": "t", DELIVERY: "at_least_once"})
    assert loose.streamWriter(VALUE_ONLY, overwrite=False).app_id is None


def test_stream_read_options() -> None:
    opts = stream_read_options(
        {
            **BOOT,
            "subscribepattern": "orders-.*",
            "startingoffsets": '{"orders-1": {"0": 4}}',
            "maxoffsetspertrigger": "500",
            "failondataloss": "false",
        }
    )
    assert opts.pattern is not None and opts.pattern.fullmatch("orders-2")
    assert opts.topics == ()
    assert opts.max_offsets_per_trigger == 500
    assert not opts.fail_on_data_loss
    plain = stream_read_options({**BOOT, "subscribe": "a"})
    assert (plain.starting.default, plain.fail_on_data_loss, plain.pattern) == (-1, True, None)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({**BOOT, "topic": "a", "subscribepattern": "b"}, "exactly one of option 'topic'"),
        ({**BOOT, "subscribepattern": "("}, "not a regular expression"),
        ({**BOOT, "subscribepattern": "a.*", "startingoffsets": '{"b": {"0": 1}}'}, "match: b"),
        ({**BOOT, "topic": "a", "endingoffsets": "latest"}, "'endingOffsets' is for batch"),
        ({**BOOT, "topic": "a", "maxoffsetspertrigger": "0"}, "'maxOffsetsPerTrigger' must be"),
        ({**BOOT, "topic": "a", "failondataloss": "no"}, "'failOnDataLoss' must be true"),
    ],
)
def test_bad_stream_read_options_are_named(options: dict[str, str], message: str) -> None:
    with pytest.raises(MinibrokerOptionError, match=message):
        stream_read_options(options)


def test_schema_accepts_a_stream_by_pattern() -> None:
    assert MinibrokerDataSource({**BOOT, "subscribepattern": "a.*"}).schema() == SCHEMA


def test_stream_offsets_are_json_per_topic_partition() -> None:
    offsets = {("a", 0): 5, ("a", 1): 7, ("b", 0): 0}
    assert to_json(offsets) == {"a": {"0": 5, "1": 7}, "b": {"0": 0}}
    assert from_json(to_json(offsets)) == offsets


def test_rate_limit_shares_offsets_by_lag_and_moves_every_partition() -> None:
    start = {("a", 0): 0, ("a", 1): 100}
    end = {("a", 0): 900, ("a", 1): 200, ("b", 0): 1}  # b[0] is new: it starts at 0
    assert rate_limited(start, end, 10_000) == end
    cut = rate_limited(start, end, 100)
    assert cut == {("a", 0): 89, ("a", 1): 109, ("b", 0): 1}  # 900, 100, 1 of 1001 behind


def test_partition_range_of_batch_metadata() -> None:
    assert PartitionRange.of(BatchMetadata("t", 1, 10, 5)) == PartitionRange("t", 1, 5, 10, 14)


def test_small_arrow_batches_are_joined_into_larger_sends() -> None:
    writer = writer_for(VALUE_ONLY, topic="t")
    writer.send_bytes = 2_500
    batches = [pa.record_batch({"value": [f"{i:04d}" * 25] * 10}) for i in range(7)]
    tables = list(writer._coalesced(iter(batches)))
    assert [t.num_rows for t in tables] == [30, 30, 10]  # ~1 KB per batch of 10 rows
    assert pa.concat_tables(tables).column("value").to_pylist() == [
        v for b in batches for v in b.column("value").to_pylist()
    ]
