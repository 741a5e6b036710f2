"""Write the atheris seed corpus: real request frames and batches, one file each, and
real SASL exchanges and security requests for the security targets.

Run: python -m tests.reliability.make_corpus (the `make fuzz` target does).
Each file starts with the selector byte of `fuzz_targets.one_input`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from broker.kafka import SERVED
from protocol import messages as m
from protocol.batch import build_batch
from protocol.batch_v2 import encode_batch_v2
from protocol.compression import Compression
from protocol.framing import frame
from tests.reliability.fuzz_targets import (
    KAFKA_SELECTOR,
    PASSWORD,
    SECURITY_SELECTORS,
    USER,
    V2_SELECTORS,
    smallest_kafka_request,
)

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
    security = security_requests()
    out: dict[str, bytes] = {"batch": bytes([2]) + batch}
    for codec in Compression:
        v2 = encode_batch_v2(
            [(1_700_000_000_000, b"k", b"v", [("h", b"x"), ("n", None)]), (0, None, None, None)],
            compression=codec,
            producer_id=7,
            producer_epoch=0,
            base_sequence=0,
        )
        out[f"batch_v2_{codec.name.lower()}"] = bytes([V2_SELECTORS]) + v2
    for name, request in {**requests, **security}.items():
        body = m.encode_request(request, cid=1, client_id="corpus")
        out[f"frame_{name}"] = bytes([3]) + frame(body) + frame(body)  # two frames, chunk 2
        out[f"body_{name}"] = bytes([1]) + body
    for name, request in security.items():
        body = m.encode_request(request, cid=1, client_id="corpus")
        out[f"admin_{name}"] = bytes([SECURITY_SELECTORS + 8]) + body
    for api in SERVED:
        body = smallest_kafka_request(api.key, api.max_version, correlation_id=1)
        out[f"kafka_{api.name}"] = bytes([KAFKA_SELECTOR]) + body
    for name, (mechanism, first, second) in sasl_exchanges().items():
        out[f"sasl_{name}"] = (
            bytes([SECURITY_SELECTORS, mechanism]) + len(first).to_bytes(2, "big") + first + second
        )
    return out


def security_requests() -> dict[str, m.Request]:
    """One of each security and administration request, as the SDK sends them."""
    binding = m.AclBinding("topic", "orders", "prefixed", "User:alice", "*", "write", "allow")
    everything = m.AclBindingFilter(None, None, "match", None, None, None, None)
    salt = b"s" * 16
    return {
        "sasl_authenticate": m.SaslAuthenticateRequest(
            mechanism="SCRAM-SHA-256", auth_bytes=f"n,,n={USER},r=fyko+d2lbbFgONRv9qkxdawL".encode()
        ),
        "create_acls": m.CreateAclsRequest(creations=[binding]),
        "describe_acls": m.DescribeAclsRequest(filter=everything),
        "delete_acls": m.DeleteAclsRequest(filters=[everything]),
        "describe_user_scram_credentials": m.DescribeUserScramCredentialsRequest(users=[USER]),
        "alter_user_scram_credentials": m.AlterUserScramCredentialsRequest(
            deletions=[m.ScramCredentialDeletion(user="bob", mechanism="SCRAM-SHA-512")],
            upsertions=[
                m.ScramCredentialUpsertion(
                    user=USER,
                    mechanism="SCRAM-SHA-256",
                    iterations=4096,
                    salt=salt,
                    salted_password=hashlib.pbkdf2_hmac("sha256", PASSWORD.encode(), salt, 4096),
                )
            ],
        ),
        "delete_topics": m.DeleteTopicsRequest(topics=["orders"]),
        "describe_configs": m.DescribeConfigsRequest(
            resources=[
                m.ConfigResource(type="topic", name="orders"),
                m.ConfigResource(type="broker", name="0"),
            ]
        ),
        "incremental_alter_configs": m.IncrementalAlterConfigsRequest(
            resources=[
                m.AlterableConfigResource(
                    type="topic",
                    name="orders",
                    ops=[
                        m.AlterConfigOp(name="retention.ms", op="set", value="60000"),
                        m.AlterConfigOp(name="segment.bytes", op="delete"),
                    ],
                )
            ]
        ),
    }


def sasl_exchanges() -> dict[str, tuple[int, bytes, bytes]]:
    """(mechanism index, first message, second message) of SaslAuthenticate rounds: RFC
    7677's client-first and client-final (whose nonce the broker's fresh one will not
    match), and PLAIN's message with the right password and a wrong one."""
    first = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    final = (
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    )
    return {
        "scram_sha_256": (0, first, final),
        "scram_sha_512": (1, f"n,,n={USER},r=abc".encode(), b"c=biws,r=abc,p=AAAA"),
        "plain": (2, f"\0{USER}\0{PASSWORD}".encode(), b""),
        "plain_wrong": (2, f"\0{USER}\0wrong".encode(), b""),
        "unknown_mechanism": (3, b"x", b""),
    }


def main() -> None:
    CORPUS.mkdir(exist_ok=True)
    for name, data in seeds().items():
        (CORPUS / name).write_bytes(data)


if __name__ == "__main__":
    main()
