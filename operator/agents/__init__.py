"""Agent and AgentModel: reusable run definitions and the models runs call.

Inside: ``spec`` (``Agent.spec``, ``AgentModel.spec`` and an AgentModel's ``ModelConfig``,
pure), ``resolve`` (a run's ``spec.agentRef`` resolved into the spec it executes; an Agent's
``Ready`` condition; pure), ``store`` (reading Agents, recording a run's resolution, writing
``Ready``), ``models`` (the AgentModel cache).

This module is the kind's port: other kinds import what is re-exported here and nothing from
the modules inside (the import contracts check it); the handlers and the wiring may import the
modules directly.
"""

from .models import ModelCache
from .resolve import digest_of
from .spec import AgentModelSpec, model_config
from .store import get_agent

__all__ = ["AgentModelSpec", "ModelCache", "digest_of", "get_agent", "model_config"]
