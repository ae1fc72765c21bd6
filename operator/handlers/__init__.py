"""kopf's entry points: one module per kind watched, plus kopf's configuration, start-up and
clean-up (``startup``); an AgentRun's admission and reruns (``admission``) apart from its other
handlers (``runs``).

Handlers stay thin: each reads what kopf hands it and tells the part built by ``wiring`` (its
share of kopf's memo) what changed. Importing a module registers its handlers with kopf;
``REGISTERED`` names them all, and a new kind's handlers go in a module of their own, named
here. What does not belong here: any decision or API call (the kinds' folders).
"""

from types import ModuleType

from . import admission, agents, evals, runs, schedules, startup, tenants, toolservers

REGISTERED: tuple[ModuleType, ...] = (
    startup,
    admission,
    runs,
    tenants,
    agents,
    toolservers,
    evals,
    schedules,
)
"""The modules whose import registers their handlers with kopf."""
