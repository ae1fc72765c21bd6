"""What tests on a three-server NATS cluster (``agentrun_dev.natscluster``) share."""

from __future__ import annotations

import nats.errors
import nats.js.errors

ELECTION_ERRORS: tuple[type[Exception], ...] = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
)
"""What a request may answer while a stream of the cluster elects a leader: no answer in time,
no responder, an empty reply, or 503 "JetStream system temporarily unavailable" (10008) from a
server that has no leader to forward to. The runtime retries each (the worker's
``is_transient``: a turn naked and redelivered, a settlement settled again); a test on the
cluster retries exactly these and fails on any other error."""
