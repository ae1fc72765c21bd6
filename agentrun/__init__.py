"""agentrun: a Kubernetes-native, multi-tenant runtime for LLM agent loops.

The shared package: what both the operator (``agentrun.operator``, from ``operator/``) and the
workers (``agentrun.worker``, from ``worker/``) use, and neither owns.

- ``kernel``: the pure loop kernel (no I/O): decisions, validation, budgets, ``advance``.
- ``ledger``: the tenant budget ledger (pure entry arithmetic, and its JetStream KV store).
- ``protocol``: wire types on NATS; ``history``: replaying a run's events into its state.
- ``bus`` and ``natsclient``: the JetStream adapter; ``kube``: Kubernetes client set-up.
- ``metrics`` and ``telemetry``: Prometheus metrics and OpenTelemetry traces.
- ``settings`` and ``process``: typed settings from the environment, the shared start-up.
- ``tools``: the built-in tool catalog and remote MCP tools.

Beside them, two packages that neither side imports: ``testing``, the scripted
OpenAI-compatible model (for tests, ours and users'), and ``cli``, the user programs (the
``agentrun`` command and the ``kubectl agentrun`` plugin; ``agentrun dev …``, the local stack,
is the separate ``agentrun_dev`` distribution (``devtools/``), found through the
``agentrun.cli`` entry point group). What only one side uses belongs in that side's package
(the effect ledger is the worker's ``effects``).

The worker never imports the operator, nor the operator the worker, and nothing here imports
either (import contracts in ``pyproject.toml``, run by ``make lint``).
"""
