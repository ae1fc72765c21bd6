"""The agentrun worker: executes one turn at a time per run, pulled from JetStream.

Layers: ``model`` (the OpenAI-compatible adapter), ``effects`` (the effect ledger: write and
idempotent tool calls recorded in JetStream KV, so a turn run again never repeats one blindly),
``toolrunner`` (concurrent, correlated tool calls), ``turn`` (one turn: kernel gates, model,
validation, tools, record), ``history`` (rebuilding a run's state from its events),
``consumer`` (the pull loop, heartbeats, commit and ack), ``main`` (process wiring). The worker
never imports the operator.
"""
