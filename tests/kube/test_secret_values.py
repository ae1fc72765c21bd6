"""``kube.secret_values`` is how every process reads a tenant's Secret out (the operator to
discover an AgentToolServer, a worker to call one): each value it returns is from then on
taken out of the process's log lines (``display.KNOWN``, ``process.RedactingFilter``)."""

from __future__ import annotations

import base64
import io
import logging
from types import SimpleNamespace
from typing import Any

from agentrun import display, kube, process


class Core:
    """A ``CoreV1Api`` answering one Secret."""

    def __init__(self, data: dict[str, str]) -> None:
        self.data = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}

    async def read_namespaced_secret(self, name: str, namespace: str) -> Any:
        return SimpleNamespace(data=self.data)


async def test_a_value_read_out_is_redacted_from_the_process_logs() -> None:
    value, other = "Bearer tok-tenant-a-0123456789", "tok-never-read-0123456789"
    core = Core({"Authorization": f"{value}\n", "Unread": other})
    read = await kube.secret_values(core, namespace="a", name="hdr", keys=["Authorization"])  # type: ignore[arg-type]
    assert read == {"Authorization": value}
    written = io.StringIO()
    handler = logging.StreamHandler(written)
    process.bound_library_logs(handler)
    logger = logging.getLogger("agentrun.test_secret_values")
    logger.addHandler(handler)
    try:
        logger.error("refused %r, then tok-tenant-a-0123456789 alone, and %s", value, other)
    finally:
        logger.removeHandler(handler)
    assert written.getvalue() == f"refused '[redacted]', then [redacted] alone, and {other}\n"
    assert display.KNOWN.redact(value) == display.REDACTED
