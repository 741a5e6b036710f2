"""The topic APIs: CreateTopics, DeleteTopics, DescribeConfigs and
IncrementalAlterConfigs (docs/protocol.md section 4); a deletion's durable steps are
`broker/admin.py`'s."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio

from broker.admin import Admin
from broker.clock import now_ms
from broker.partitions import TopicError, TopicRegistry
from broker.security import Session
from protocol import messages as m


class TopicApi:
    """The topics' APIs: creation here, the rest through `Admin`."""

    def __init__(self, topics: TopicRegistry, admin: Admin) -> None:
        self.topics = topics
        self.admin = admin

    def apis(self) -> dict[str, Callable[[Any, Session], Any]]:
        admin = self.admin
        return {
            "CreateTopics": lambda req, _session: self.create_topics(req),
            "DeleteTopics": lambda req, _session: admin.delete_topics(req),
            "DescribeConfigs": lambda req, _session: admin.describe_configs(req),
            "IncrementalAlterConfigs": lambda req, _session: admin.incremental_alter_configs(req),
        }

    async def create_topics(self, req: m.CreateTopicsRequest) -> m.CreateTopicsResponse:
        results = []
        for t in req.topics:
            try:
                topic = self.topics.create(t.name, t.partitions, t.config, now_ms())
                results.append(m.CreateTopicResult(t.name, topic_id=topic.topic_id.bytes))
            except TopicError as exc:
                results.append(m.CreateTopicResult(t.name, exc.code, exc.message))
            await anyio.lowlevel.checkpoint()  # as in metadata: creations take turns
        return m.CreateTopicsResponse(topics=results)
