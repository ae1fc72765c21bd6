"""The agentrun operator (kopf): admission, dispatch of turns, status projection, deadlines.

Layers, pure first:

- ``runs`` (run identity, control annotations, queue-wait vocabulary), ``specs`` and
  ``tenantspecs`` (the CRD specs as pydantic models: the one parser of what kopf hands over),
  ``admission`` (spec + AgentModel → ``RunConfig``), ``tenancy`` (AgentTenant policy),
  ``status`` (events → AgentRun status body), ``tenantstatus`` (ledger entry → AgentTenant
  status body), ``evalspec`` and ``evalstatus`` (an AgentEval's spec, rounds, run manifests and
  status body), ``cronplan`` (CronAgentRun schedules: what is due, started, skipped,
  cancelled, pruned) and ``cronspec`` (its spec and the run a schedule time creates) are pure.
- ``tenants`` (AgentTenant registry, AgentModel cache, ``RunConfig`` building), ``statuswriter``
  (coalesced status patches), ``settlement`` (closing an ended run's ledger entry; the shared
  view of the queues), ``pump`` (per-tenant admission queues), ``queuestatus`` (the status of
  runs that wait or end unadmitted), ``sweep`` (periodic ledger repairs, AgentTenant status),
  ``dispatch`` (consumes committed run events, publishes the next TurnRequest or ends the run),
  ``schedules`` (the CronAgentRun controller) and ``evals`` (the AgentEval controller: creates
  case runs, grades them) do the I/O.
- ``wiring`` builds those parts once and passes each its collaborators; ``handlers`` configures
  kopf and names the handler modules (``runhandlers`` for AgentRuns, ``watches`` for the
  objects runs refer to, ``cronhandlers`` for CronAgentRuns, ``evalhandlers`` for AgentEvals);
  ``main`` is the process.

The operator never imports the worker.
"""
