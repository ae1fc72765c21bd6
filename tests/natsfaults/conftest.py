"""Fixtures shared by the NATS cluster's load tests: the admin client on the module's cluster."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentrun_dev import natscluster

from .faults_support import Admin


@pytest.fixture(scope="module")
def admin(nats_cluster: natscluster.NatsCluster) -> Iterator[Admin]:
    """An `Admin` client on this module's NATS cluster (ledger books, leaders, step-downs)."""
    handle = Admin(nats_cluster)
    yield handle
    handle.close()
