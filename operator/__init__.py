"""The agentrun operator (kopf): admission, dispatch of turns, status projection, deadlines.

Layers, pure first:

- ``runs`` (run identity, control annotations, queue-wait vocabulary), ``specs`` (the CRD
  specs as pydantic models: the one parser of what kopf hands over), ``admission`` (spec +
  AgentModel → ``RunConfig``), ``tenancy`` (AgentTenant policy), ``status`` (events → AgentRun
  status body), ``tenantstatus`` (ledger entry → AgentTenant status body), ``cronplan``
  (CronAgentRun schedules: what is due, started, skipped, cancelled, pruned) and ``cronspec``
  (its spec and the run a schedule time creates) are pure.
- ``tenants`` (AgentTenant registry, AgentModel cache, ``RunConfig`` building), ``statuswriter``
  (coalesced status patches), ``settlement`` (closing an ended run's ledger entry; the shared
  view of the queues), ``pump`` (per-tenant admission queues), ``sweep`` (periodic ledger
  repairs, AgentTenant status), ``dispatch`` (consumes committed run events, publishes the
  next TurnRequest or ends the run) and ``schedules`` (the CronAgentRun controller) do the I/O.
- ``wiring`` builds those parts once and passes each its collaborators; ``handlers`` (and
  ``cronhandlers``, those of CronAgentRuns) are the kopf entry points; ``main`` is the process.

The operator never imports the worker.
"""
