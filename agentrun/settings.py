"""Process settings read from the environment: one typed object per process kind.

Every ``AGENTRUN_*`` variable the operator and the workers read is a field here, with its unit
and default; nothing else in the runtime reads the environment for its own configuration
(``KUBECONFIG`` and the ``OTEL_*`` variables belong to their libraries). Values are parsed and
checked once at start-up by pydantic-settings: a malformed value (``AGENTRUN_TOOL_TIMEOUT=ten``)
stops the process with an error naming the variable. An empty variable counts as unset.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pydantic
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from agentrun.kernel import bounds
from agentrun.natsclient import NatsAuth

TOOL_RESULT_MAX_BYTES_LIMIT = bounds.results_budget(bounds.MESSAGE_CAP)
"""The most ``AGENTRUN_TOOL_RESULT_MAX_BYTES`` may be (524288): what one turn's tool results
may take together at NATS's default ``max_payload`` of 1 MiB. A write call's result is stored
in its effect-ledger entry and in the turn's event, each one message on the bus."""


RUN_EVENT_MAX_BYTES = 8 * 1_048_576
"""Default bytes one run's events may take (``AGENTRUN_RUN_EVENT_MAX_BYTES``)."""
TURN_MEMORY_BYTES = 512 * 1_048_576
"""Default bytes of memory the turns one worker runs may reserve
(``AGENTRUN_WORKER_TURN_MEMORY_BYTES``)."""
TURN_MEMORY_SHARES = 4
"""Default tenant shares of that memory (``AGENTRUN_WORKER_TURN_MEMORY_SHARES``)."""
TENANT_EVENT_MAX_BYTES = 256 * 1_048_576
"""Default bytes the events of one tenant's runs may take (``AGENTRUN_TENANT_EVENT_MAX_BYTES``)."""


class ProcessSettings(BaseSettings):
    """Settings shared by ``agentrun-operator`` and ``agentrun-worker``.

    Raises:
        pydantic.ValidationError: a variable does not parse as its field's type or range.
    """

    model_config = SettingsConfigDict(
        env_prefix="AGENTRUN_",
        env_ignore_empty=True,
        frozen=True,
        extra="ignore",
        hide_input_in_errors=True,  # a URL with a password must not reach the log
    )

    nats_url: str = "nats://127.0.0.1:4222"
    """``AGENTRUN_NATS_URL``: the NATS server with JetStream, e.g. ``nats://127.0.0.1:4222``
    (``tls://…`` works too; with ``nats_ca_file`` set the connection is TLS either way), or
    the servers of a JetStream cluster separated by commas, so the process reconnects to (and
    starts on) any of them. Never put a password in it: credentials come from
    ``nats_creds_file``."""
    nats_creds_file: Path | None = None
    """``AGENTRUN_NATS_CREDS_FILE``: this process's NATS ``.creds`` file (a user JWT and its
    NKey seed; the chart mounts it from a Secret), read again at every reconnect; unset: no
    credentials (a server that requires them refuses the connection)."""
    nats_ca_file: Path | None = None
    """``AGENTRUN_NATS_CA_FILE``: PEM CA bundle the NATS server's certificate must chain to,
    its name checked against the URL's host; unset: plain-text NATS."""
    run_trust_file: Path | None = None
    """``AGENTRUN_RUN_TRUST_FILE``: the public run-signing keys this process trusts
    (``trust.json``, ``agentrun.trust.keys``; the chart mounts it from ``<fullname>-trust``),
    read again when it changes. Required: a worker acts on no run config, and the operator
    follows no run, whose seal it cannot check."""
    metrics_port: int = Field(default=0, ge=0, le=65535)
    """``AGENTRUN_METRICS_PORT``: Prometheus ``/metrics`` port; 0 serves none."""
    metrics_addr: str = "0.0.0.0"
    """``AGENTRUN_METRICS_ADDR``: the address the metrics port binds."""
    log_level: str = "INFO"
    """``AGENTRUN_LOG_LEVEL``: Python logging level name."""
    turn_ack_wait: float = Field(default=30.0, gt=0)
    """``AGENTRUN_TURN_ACK_WAIT``: seconds before an unacknowledged TurnRequest is redelivered."""
    health_port: int = Field(default=0, ge=0, le=65535)
    """``AGENTRUN_HEALTH_PORT``: HTTP port of ``/healthz`` (alive: answered by the process's
    event loop itself, so a stuck loop fails it) and ``/readyz`` (operator: the installed CRDs
    serve what it writes; worker: it takes turns, not while it drains); 0 serves none."""

    def trust_path(self) -> Path:
        """``run_trust_file``; raises ``ValueError`` saying what to set when it is unset."""
        if self.run_trust_file is None:
            raise ValueError(
                "AGENTRUN_RUN_TRUST_FILE is not set: name the trust.json holding the run-signing "
                "public keys (`agentrun signing bootstrap` makes it; the chart mounts it)"
            )
        return self.run_trust_file

    @property
    def nats_auth(self) -> NatsAuth:
        """The NATS credentials and CA files, as ``natsclient.connect_nats`` takes them."""
        return NatsAuth(creds_file=self.nats_creds_file, ca_file=self.nats_ca_file)

    @pydantic.field_validator("nats_url")
    @classmethod
    def _no_password_in_url(cls, value: str) -> str:
        if any("@" in url.split("//", 1)[-1].split("/", 1)[0] for url in value.split(",")):
            raise ValueError(
                "AGENTRUN_NATS_URL holds credentials (user@host): put them in a creds file "
                "named by AGENTRUN_NATS_CREDS_FILE instead, so they are never logged"
            )
        return value


class OperatorSettings(ProcessSettings):
    """Settings of ``agentrun-operator`` (plus the shared ones)."""

    run_signing_file: Path | None = None
    """``AGENTRUN_RUN_SIGNING_FILE``: the operator's run-signing keys (``signing.json``,
    ``agentrun.trust.keys``; the chart mounts it from ``<fullname>-signing``), with which it
    seals every run config it admits and every approval; read again when it changes.
    Required."""
    status_interval: float = Field(default=5.0, ge=0)
    """``AGENTRUN_STATUS_INTERVAL``: least seconds between two ``.status`` writes of one run
    (the first write, terminal writes and approval requests go at once)."""
    default_tenant: str | None = None
    """``AGENTRUN_DEFAULT_TENANT``: the AgentTenant charged for runs in namespaces no tenant
    binds; unset rejects such runs ``invalid_spec``."""
    turn_backlog: int = Field(default=2, ge=0, le=10_000)
    """``AGENTRUN_TURN_BACKLOG``: most TurnRequests the operator leaves undelivered in the
    work queue beyond the workers' waiting pull requests; the others wait in the operator and
    are published in fair order across tenants (a turn that becomes ready waits behind at
    most this many others). Higher: fewer reads of the queue's backlog under load; lower:
    fairer. With several operator shards each process applies it to its own shards' turns
    (the fair order holds among them), so up to that many per process wait undelivered."""
    default_max_concurrent_turns: int = Field(default=0, ge=0, le=100_000)
    """``AGENTRUN_DEFAULT_MAX_CONCURRENT_TURNS``: the ``maxConcurrentTurns`` of every AgentTenant
    that sets none, its runs' turns in the workers' hands or the work queue at once (0: no cap
    but the fair order). The fair order gives a freed worker slot to the tenant with the fewest
    turns in flight, but never takes a slot back: without a cap, a tenant whose turns run long
    (tool calls up to ``AGENTRUN_TOOL_TIMEOUT_MAX``) keeps every slot it holds that long, and
    another tenant's first turn waits for one to free. The chart sets three quarters of the
    workers' slots (``worker.concurrency`` × replicas: KEDA's most, the CPU-based HPA's least)."""
    admission_per_namespace: int = Field(default=4, ge=1, le=1_000)
    """``AGENTRUN_ADMISSION_PER_NAMESPACE``: most AgentRun admissions of one namespace the
    operator works on at once; the others wait in creation order, so a namespace that applies
    1,000 runs at once does not delay another namespace's admission. Higher: a burst of one
    namespace is admitted faster; lower: fairer."""
    orphan_after: float = Field(default=10.0, gt=0)
    """``AGENTRUN_ORPHAN_AFTER``: seconds after which a running run whose TurnRequest is neither
    queued nor in a worker's hands, and that committed nothing since, is dispatched again."""
    ledger_sweep: float = Field(default=2.0, gt=0)
    """``AGENTRUN_LEDGER_SWEEP``: seconds between ledger sweeps (window resets, expired holds,
    stale slots, queue pumps, AgentTenant status)."""
    max_queued_runs: int = Field(default=0, ge=0)
    """``AGENTRUN_MAX_QUEUED_RUNS``: runs one tenant's admission queue may hold (0: no limit).
    A run created while its tenant's queue holds this many ends ``tenant_budget_exhausted``
    saying so, for that run only; runs already queued keep their places."""
    queue_status_writes: float = Field(default=20.0, gt=0)
    """``AGENTRUN_QUEUE_STATUS_WRITES``: status writes per second, for all tenants together,
    that refresh a queued run's position after it moved (the stalest first), shared by the
    tenants whose queues want them; a run's first ``Queued`` status is written at once,
    whatever the rate."""
    identity: str | None = None
    """``AGENTRUN_IDENTITY``: this process's name in the leader Lease and the shard Leases (the
    chart passes the pod name); unset uses ``<hostname>-<pid>``. It must be unique among the
    live processes: a Lease naming it is taken as this process's, left by an earlier process
    of the same name (a restarted container), and taken back at once."""
    lease_namespace: str = "default"
    """``AGENTRUN_LEASE_NAMESPACE``: the operator's own namespace (the chart passes its
    release namespace): where the ``coordination.k8s.io`` Leases of the operators are, and the
    Events about AgentTenants (each carries one tenant's use and limits, which ``default``,
    read by every tenant, must not show)."""
    lease_name: str = "agentrun-operator"
    """``AGENTRUN_LEASE_NAME``: with one shard, the name of the Lease that elects the one
    active operator; with several, the base of the shard Leases (``<name>-<i>``) and the
    membership Leases (``<name>-member-<k>``)."""
    operator_shards: int = Field(default=1, ge=1, le=64)
    """``AGENTRUN_OPERATOR_SHARDS``: how many shards the tenants are divided into, each owned
    by one operator process at a time through a Lease of its own (``<lease_name>-<i>``); every
    process of one install must be given the same count, and it is changed only with every
    operator stopped (processes with different counts would serve the same tenants). 1 (the
    default) is active/standby on the one Lease ``<lease_name>``. More processes than shards:
    the others hold none and stand by."""
    lease_duration: float = Field(default=15.0, gt=0)
    """``AGENTRUN_LEASE_DURATION``: seconds a standby waits after the Lease last changed before
    it takes over (the failover bound is this plus ``lease_retry``)."""
    lease_renew_deadline: float = Field(default=10.0, gt=0)
    """``AGENTRUN_LEASE_RENEW_DEADLINE``: seconds the leader keeps acting without a successful
    renewal before it exits; must be below ``lease_duration``."""
    lease_retry: float = Field(default=2.0, gt=0)
    """``AGENTRUN_LEASE_RETRY``: seconds between two renewals or acquisition attempts."""
    jetstream_store_bytes: int = Field(default=0, ge=0)
    """``AGENTRUN_JETSTREAM_STORE_BYTES``: size of the JetStream file store the streams share
    (the NATS server's ``max_file_store``), exported as ``agentrun_jetstream_store_limit_bytes``
    for the store-filling alert; 0 (unknown) exports nothing. The chart sets it from
    ``nats.install.maxFileStore``, or ``nats.storeBytes`` for a server you bring."""
    crd_check_interval: float = Field(default=5.0, gt=0)
    """``AGENTRUN_CRD_CHECK_INTERVAL``: seconds between two checks of the installed CRDs while
    they do not serve what this operator writes."""
    tenant_event_max_bytes: int = Field(default=TENANT_EVENT_MAX_BYTES, ge=1_048_576)
    """``AGENTRUN_TENANT_EVENT_MAX_BYTES``: the most bytes the events of one tenant's runs may
    take in the event stream (runs not deleted yet, finished ones included, as their
    ``status.usage.eventBytes`` says); at it, the tenant's next runs wait ``Queued``
    (``EventStorageFull``) until runs are deleted (``ttlSecondsAfterFinished`` or a person).
    Enforced at admission: runs already going finish, each within the workers'
    ``AGENTRUN_RUN_EVENT_MAX_BYTES``."""
    event_stream_max_bytes: int = Field(default=-1, ge=-1)
    """``AGENTRUN_EVENT_STREAM_MAX_BYTES``: ``max_bytes`` of the ``AGENTRUN_EVENTS`` stream
    (-1, the default: no limit but the server's own), with ``discard: new`` so a full stream
    refuses new events instead of dropping committed ones. A backstop for the whole store:
    set it below the JetStream store (so the work queue and the ledger keep room) and above
    the tenants' ``AGENTRUN_TENANT_EVENT_MAX_BYTES`` together; when it is reached anyway,
    workers retry the refused turns as NATS trouble (each retry a model call) until deleted
    runs make room."""
    nats_replicas: int = Field(default=1, ge=1, le=5)
    """``AGENTRUN_NATS_REPLICAS``: servers that keep each stream and KV bucket the operator
    provisions (``AGENTRUN_TURNS``, ``AGENTRUN_EVENTS``, the ledger and effect buckets): 1 on a
    single nats-server, 3 on a three-server JetStream cluster (JetStream allows 1 to 5). At
    start the operator creates what is missing with it and updates what has another count;
    more than the servers can hold stops it with a message saying so. The chart sets it from
    ``nats.jetstream.replicas``."""
    ledger_layout: Literal["single", "split"] = "single"
    """``AGENTRUN_LEDGER_LAYOUT``: how the ledger of a tenant that has none yet is stored
    (``agentrun.ledger.entries.LAYOUTS``). ``single`` (the default): one value per tenant, what
    workers of the previous release read (split when admissions would take it past 500
    active runs);
    ``split``: totals plus one value per run and per queued run, no cap from storage, read by
    this release's workers only — set it once every worker runs this release. With ``split``,
    a tenant found ``single`` is split at its next ledger change (usage kept); with
    ``single``, a tenant found split stays split. The chart sets it from
    ``nats.jetstream.ledgerLayout``."""
    tool_discovery_timeout_max: float = Field(default=30.0, gt=0, le=600)
    """``AGENTRUN_TOOL_DISCOVERY_TIMEOUT_MAX``: the most seconds one AgentToolServer's
    discovery may take, whatever its ``spec.timeouts.discovery`` asks (a longer one is clamped
    to it, and a failed discovery's message says so): discovery slots are shared by every
    namespace, so a user's hanging server must not hold one for long."""

    def signing_path(self) -> Path:
        """``run_signing_file``; raises ``ValueError`` saying what to set when it is unset."""
        if self.run_signing_file is None:
            raise ValueError(
                "AGENTRUN_RUN_SIGNING_FILE is not set: name the signing.json holding the "
                "operator's run-signing keys (`agentrun signing bootstrap` makes it)"
            )
        return self.run_signing_file

    @pydantic.model_validator(mode="after")
    def _lease_timings(self) -> OperatorSettings:
        if not self.lease_retry < self.lease_renew_deadline < self.lease_duration:
            raise ValueError(
                "need AGENTRUN_LEASE_RETRY < AGENTRUN_LEASE_RENEW_DEADLINE < "
                "AGENTRUN_LEASE_DURATION (a leader must give up before a standby takes over)"
            )
        return self


class WorkerSettings(ProcessSettings):
    """Settings of ``agentrun-worker`` (plus the shared ones)."""

    worker_concurrency: int = Field(default=64, ge=1)
    """``AGENTRUN_WORKER_CONCURRENCY``: turns one worker process runs at once."""
    worker_turn_memory_bytes: int = Field(default=TURN_MEMORY_BYTES, ge=1_048_576)
    """``AGENTRUN_WORKER_TURN_MEMORY_BYTES``: the memory the turns one worker runs may reserve
    at once (an estimate: seven times their runs' stored events, plus 256 KiB each); beyond,
    a turn waits for room, holding its slot. Keep it at about half the worker's memory
    limit."""
    worker_turn_memory_shares: int = Field(default=TURN_MEMORY_SHARES, ge=1)
    """``AGENTRUN_WORKER_TURN_MEMORY_SHARES``: the tenant shares that memory is cut into (one
    tenant's turns reserve at most one share)."""
    tool_concurrency: int = Field(default=4, ge=1)
    """``AGENTRUN_TOOL_CONCURRENCY``: tool calls of one batch running at once."""
    tool_timeout: float = Field(default=60.0, gt=0)
    """``AGENTRUN_TOOL_TIMEOUT``: seconds one tool call may take."""
    tool_timeout_max: float = Field(default=300.0, gt=0)
    """``AGENTRUN_TOOL_TIMEOUT_MAX``: the most seconds any tool call may take, whatever its
    AgentToolServer's ``spec.timeouts.call`` asks (a turn holds its worker slot while its
    tools run)."""
    tool_result_max_bytes: int = Field(default=16_384, ge=256)
    """``AGENTRUN_TOOL_RESULT_MAX_BYTES``: cap of one tool result in UTF-8 bytes, at most
    ``TOOL_RESULT_MAX_BYTES_LIMIT``."""
    prometheus_url: str | None = None
    """``AGENTRUN_PROMETHEUS_URL``: the Prometheus the ``prometheus_query`` tool queries, e.g.
    ``http://prometheus.monitoring.svc:9090``; unset: its calls fail saying so."""
    prometheus_scope_label: str = Field(
        default="namespace", pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$", max_length=128
    )
    """``AGENTRUN_PROMETHEUS_SCOPE_LABEL``: the label every ``prometheus_query`` selector must
    match the run's namespace on (the label naming a series' namespace where the platform's
    Prometheus keeps it, e.g. ``namespace``, or ``exported_namespace`` behind a relabelling)."""
    tool_retries: int = Field(default=2, ge=0, le=10)
    """``AGENTRUN_TOOL_RETRIES``: extra attempts of a read or idempotent tool call that failed
    for infrastructure reasons (timeout, connection, server or transport error), with
    exponential backoff from 0.5 s, within the run's deadline."""
    hold_ttl: float = Field(default=60.0, gt=0)
    """``AGENTRUN_HOLD_TTL``: seconds a ledger hold outlives its last refresh."""
    run_event_max_bytes: int = Field(default=RUN_EVENT_MAX_BYTES, ge=1_048_576)
    """``AGENTRUN_RUN_EVENT_MAX_BYTES``: the most bytes one run's events may take in the event
    stream; a run at it ends ``checkpoint_failed`` before its next model call (so it holds at
    most this plus one turn's event). At least 1 MiB (one event)."""
    termination_grace: float = Field(default=30.0, gt=0)
    """``AGENTRUN_TERMINATION_GRACE``: seconds from SIGTERM until the process is killed (the
    pod's ``terminationGracePeriodSeconds``, which the chart passes; Kubernetes' default is
    30). A stopping worker fetches no new turn and lets the turns it holds finish for this
    less ``drain_margin``."""
    drain_margin: float = Field(default=10.0, ge=0)
    """``AGENTRUN_DRAIN_MARGIN``: seconds of ``termination_grace`` kept for what follows the
    drain: turns still running are cancelled (left for another worker), a write call in
    flight completes and records its outcome (bounded by ``tool_timeout``), connections
    close. Must be below ``termination_grace``."""

    @property
    def drain_seconds(self) -> float:
        """Seconds a stopping worker lets its in-flight turns run: ``termination_grace`` less
        ``drain_margin``."""
        return self.termination_grace - self.drain_margin

    @pydantic.model_validator(mode="after")
    def _drain_fits_the_grace(self) -> WorkerSettings:
        if self.drain_margin >= self.termination_grace:
            raise ValueError(
                f"AGENTRUN_DRAIN_MARGIN={self.drain_margin:g} must be below "
                f"AGENTRUN_TERMINATION_GRACE={self.termination_grace:g} (the drain gets the "
                "grace period less the margin)"
            )
        return self

    @pydantic.field_validator("tool_result_max_bytes")
    @classmethod
    def _result_fits_a_turn(cls, value: int) -> int:
        if value > TOOL_RESULT_MAX_BYTES_LIMIT:
            raise ValueError(
                f"AGENTRUN_TOOL_RESULT_MAX_BYTES={value} is over its limit of "
                f"{TOOL_RESULT_MAX_BYTES_LIMIT} bytes (what one turn's tool results may take "
                "together in its event on the bus: half of NATS's default max_payload of 1 MiB)"
            )
        return value
