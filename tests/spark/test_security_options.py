"""The connector's security options: Kafka's dotted names for the SDK's settings, the same
for the writer, the reader and the streaming source and sink, and passwords nowhere to
be seen (reprs, pickled objects' reprs, option errors, Spark's plan). No broker."""

from __future__ import annotations

import pickle

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.types import StringType, StructField, StructType

from spark_connector import MinibrokerDataSource, MinibrokerOptionError
from spark_connector.options import read_options, stream_read_options, write_options

SECRET = "spark-sasl-pa55word"
KEY_SECRET = "spark-key-pa55word"
SECURE = {
    "minibroker.bootstrap.servers": "127.0.0.1:1",
    "minibroker.security.protocol": "SASL_PLAINTEXT",
    "minibroker.sasl.mechanism": "SCRAM-SHA-512",
    "minibroker.sasl.plain.username": "spark",
    "minibroker.sasl.plain.password": SECRET,
}
VALUE_ONLY = StructType([StructField("value", StringType())])
EXPECTED = {
    "security_protocol": "SASL_PLAINTEXT",
    "sasl_mechanism": "SCRAM-SHA-512",
    "sasl_plain_username": "spark",
    "sasl_plain_password": SECRET,
}


def subset(settings: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in settings.items() if k.startswith(("security", "sasl", "ssl"))}


def test_the_same_options_secure_writer_reader_and_stream() -> None:
    wrote = write_options({**SECURE, "topic": "t"}, VALUE_ONLY)
    read = read_options({**SECURE, "topic": "t"})
    streamed = stream_read_options({**SECURE, "subscribe": "t"})
    assert subset(wrote.producer) == subset(read.consumer) == subset(streamed.consumer) == EXPECTED
    admin = wrote.admin()
    assert admin.bootstrap_servers == "127.0.0.1:1"
    assert admin.security.sasl is not None and admin.security.sasl.username == "spark"


def test_tls_options(tmp_path: object) -> None:
    import trustme

    ca = trustme.CA()
    ca_file = f"{tmp_path}/ca.pem"
    ca.cert_pem.write_to_path(ca_file)
    wrote = write_options(
        {
            "minibroker.bootstrap.servers": "127.0.0.1:1",
            "topic": "t",
            "minibroker.security.protocol": "SSL",
            "minibroker.ssl.cafile": ca_file,
            "minibroker.ssl.check.hostname": "false",
        },
        VALUE_ONLY,
    )
    assert wrote.producer["ssl_check_hostname"] is False
    context = wrote.admin().security.tls
    assert context is not None and not context.check_hostname


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"minibroker.security.protocol": "SASL_SSL"}, "needs sasl_mechanism"),
        ({"minibroker.ssl.context": "x"}, "'minibroker.ssl.context' is not a"),
        ({"minibroker.sasl.plain.password": SECRET}, "need security_protocol SASL_"),
        (
            {"minibroker.security.protocol": "SSL", "minibroker.ssl.cafile": "/no/ca.pem"},
            "ssl_cafile '/no/ca.pem' cannot be used",
        ),
    ],
)
def test_bad_security_options_are_named_without_their_secrets(
    options: dict[str, str], message: str
) -> None:
    base = {"minibroker.bootstrap.servers": "127.0.0.1:1", "topic": "t"}
    with pytest.raises(MinibrokerOptionError, match=message) as caught:
        write_options({**base, **options}, VALUE_ONLY)
    assert SECRET not in str(caught.value)
    with pytest.raises(MinibrokerOptionError, match=message):
        read_options({**base, **options})


def test_passwords_are_hidden_from_every_repr_but_travel_to_the_tasks() -> None:
    options = {
        **SECURE,
        "topic": "t",
        "minibroker.security.protocol": "SASL_SSL",
        "minibroker.ssl.password": KEY_SECRET,
    }
    source = MinibrokerDataSource(options)
    # ssl.password needs a certificate file to mean something; the reprs are the point.
    with pytest.raises(MinibrokerOptionError, match="ssl_keyfile and ssl_password need"):
        source.writer(VALUE_ONLY, overwrite=False)
    del options["minibroker.ssl.password"]
    writer = MinibrokerDataSource(options).writer(VALUE_ONLY, overwrite=False)
    reader = MinibrokerDataSource(options).reader(MinibrokerDataSource(options).schema())
    for shown in (writer.options, writer.options.producer, reader.options, reader.options.consumer):
        assert SECRET not in repr(shown) and SECRET not in str(shown)
        assert "sasl_plain_password" in repr(shown) or "producer=" in repr(shown)
    assert "'sasl_plain_password': '<hidden>'" in repr(writer.options)
    copy = pickle.loads(pickle.dumps(writer))
    assert copy.options.producer["sasl_plain_password"] == SECRET
    assert SECRET not in repr(copy.options)


@pytest.mark.spark
def test_the_plan_and_a_failed_read_do_not_show_the_password(spark: SparkSession) -> None:
    """Spark's plans name the source, not its options; a failed read (no broker) says why
    without the password."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    df = spark.read.format("minibroker").options(**SECURE, topic="t").load()
    execution = df._jdf.queryExecution()
    plans = execution.logical().toString() + execution.analyzed().toString()
    assert "minibroker" in plans and SECRET not in plans
    with pytest.raises((PySparkException, Py4JJavaError)) as read_failed:
        df.collect()
    assert "cannot connect to 127.0.0.1:1" in str(read_failed.value)
    assert SECRET not in str(read_failed.value)
