"""The agentrun operator (kopf): admission, dispatch of turns, status projection, deadlines.

One folder per kind, a kind-free ``platform`` below them and thin ``handlers`` above them:

- ``platform``: what every kind uses and none owns (the API server port, spec base types,
  conditions, Events, leadership, health). Imports no kind.
- ``runs`` (AgentRun), ``admission`` (a created run until it is admitted, its ledger slot until
  it is settled), ``tenants`` (AgentTenant), ``agents`` (Agent, AgentModel), ``toolservers``
  (AgentToolServer), ``evals`` (AgentEval), ``schedules`` (CronAgentRun): each with the same
  inner shape where it applies — ``spec`` (pydantic, pure), ``plan``/``policy``/``resolve``
  (pure decisions), ``status`` (pure projection), ``store``/``controller`` (I/O through
  ports). A kind imports ``platform`` and other kinds only through their package (its
  re-exports: the kind's port), never their modules.
- ``wiring`` builds every part once and hands each handler module its share; ``handlers``
  holds kopf's entry points, one module per kind (plus ``startup``); ``crdcheck`` checks the
  installed CRDs; ``main`` is the process.

The import contracts in ``pyproject.toml`` (``lint-imports``, run by ``make lint``) keep
these directions. The operator never imports the worker.
"""
