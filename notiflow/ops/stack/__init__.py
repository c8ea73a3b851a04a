"""The local stack without Docker: Kafka (KRaft) and Cassandra 5.0 as plain ``java`` processes
from Maven Central jars, Redis from Debian's ``redis-server``, and SeaweedFS's S3 gateway
(``weed``, built from the Go module proxy), all on loopback: one Kafka broker and one
Cassandra node, or ``up(nodes=3)`` three of each on 127.0.0.1-3 (``ops/cluster.py``).

``up`` is idempotent and waits for health (Kafka metadata lists the broker, CQL answers,
Redis PONGs, S3 answers a signed request), then creates every topic, applies the CQL
migrations and creates the object store's bucket. Jars and ``weed`` are fetched or built once
into ``cache_dir`` (shared between clones); data, logs and pid files live in ``stack_dir``.

One module per component (``redis``, ``kafka``, ``cassandra``, ``s3``), ``maven`` and
``jvm`` for the Java processes, ``process`` for starting, probing and stopping processes,
``base`` for what they share, and ``orchestration`` for :class:`Stack` (``up``, ``down``,
``status``, ``env``).
"""

from __future__ import annotations

from notiflow.ops.stack.base import StackError
from notiflow.ops.stack.orchestration import Stack

__all__ = ["Stack", "StackError"]
