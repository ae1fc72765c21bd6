"""kopf handler of AgentToolServers: it tells the refresher what exists.

The refresher discovers their tools in the background (never in this handler) and writes
their status. What does not belong here: resolving a run's ``SERVER/TOOL`` names (admission).
"""

from __future__ import annotations

from typing import Any

import kopf

from agentrun import kube

from ..toolservers.spec import TOOL_SERVERS
from ..wiring import OperatorMemo

TOOL_SERVER = (kube.GROUP, kube.VERSION, TOOL_SERVERS)


@kopf.on.event(*TOOL_SERVER)
async def tool_server_changed(
    *,
    type: str | None,
    body: kopf.Body,
    namespace: str | None,
    name: str,
    memo: OperatorMemo,
    **_: Any,
) -> None:
    """Tell the refresher about AgentToolServers; it discovers their tools in the background
    (never in this handler) and writes their status."""
    refresher = memo.running().toolservers
    if type == "DELETED":
        refresher.forget(str(namespace), name)
        return
    refresher.observe(body)
