"""AgentToolServer: remote MCP servers whose tools AgentRuns may call as ``SERVER/TOOL``.

Inside: ``spec`` (``AgentToolServer.spec`` and how runs name its tools, pure), ``status`` (what
discovery writes, pure), ``resolve`` (a run's ``SERVER/TOOL`` names → the ``RemoteTool`` values
of its admitted config, pure), ``store`` (the cache admission reads servers through),
``refresher`` (discovery in the background, writing the status).

This module is the kind's port: other kinds import what is re-exported here and nothing from
the modules inside (the import contracts check it); the handlers and the wiring may import the
modules directly.
"""

from .refresher import ReachRules
from .resolve import check_reach, is_pending, resolve_tool
from .spec import split_reference
from .store import ToolServerCache

__all__ = [
    "ReachRules",
    "ToolServerCache",
    "check_reach",
    "is_pending",
    "resolve_tool",
    "split_reference",
]
