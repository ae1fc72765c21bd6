"""agentrun: a Kubernetes-native, multi-tenant runtime for LLM agent loops.

The shared package: what both the operator (``agentrun.operator``, from ``operator/``) and the
workers (``agentrun.worker``, from ``worker/``) use, and neither owns.

- ``kernel``: the pure loop kernel (no I/O): decisions, validation, budgets, ``advance``.
- ``protocol``: wire types on NATS; ``history``: replaying a run's events into its state.
- ``bus``: the JetStream adapter; ``kube``: Kubernetes client set-up.
- ``metrics`` and ``telemetry``: Prometheus metrics and OpenTelemetry traces.
- ``tools``: the built-in tool catalog; ``testing``: the scripted OpenAI-compatible model
  (for tests, ours and users'; nothing in the runtime imports it).
- ``cli``: the ``agentrun`` command (``cancel``, ``approve``, ``deny``); ``agentrun dev …``, the
  local stack, is the separate ``agentrun_dev`` distribution (``devtools/``), found through
  the ``agentrun.cli`` entry point group.

The worker never imports the operator, nor the operator the worker, and this package imports
neither (import contracts in ``pyproject.toml``, run by ``make lint``).
"""
