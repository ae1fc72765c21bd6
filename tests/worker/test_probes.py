"""The worker's probes are answered by its event loop: a stuck loop fails the liveness probe
(a probe served by a thread of its own would keep answering), and a draining worker is not
ready."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import urllib.error
import urllib.request

from agentrun import healthserver


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def probe(port: int, path: str, *, timeout: float) -> tuple[int, str] | None:
    """(status, body) of a GET, or None when nothing answered within ``timeout`` seconds."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as reply:
            return int(reply.status), reply.read().decode()
    except urllib.error.HTTPError as err:
        return int(err.code), err.read().decode()
    except TimeoutError:
        return None


async def test_liveness_is_answered_while_the_loop_runs_and_not_while_it_is_stuck() -> None:
    port = free_port()
    answer = healthserver.probe_answer(alive="ok", ready=lambda: None)
    server = await healthserver.serve(answer, host="127.0.0.1", port=port)
    try:
        assert await asyncio.to_thread(probe, port, "/healthz", timeout=5) == (200, "ok\n")
        stuck = threading.Event()

        def probe_while_stuck() -> tuple[int, str] | None:
            stuck.wait()
            return probe(port, "/healthz", timeout=1.0)

        asked = asyncio.ensure_future(asyncio.to_thread(probe_while_stuck))
        await asyncio.sleep(0.1)  # the thread waits for the loop to get stuck
        stuck.set()
        time.sleep(2.0)  # the loop is stuck (a blocking call) for longer than the probe waits
        assert await asked is None
        assert await asyncio.to_thread(probe, port, "/healthz", timeout=5) == (200, "ok\n")
    finally:
        server.close()
        await server.wait_closed()


async def test_a_draining_worker_is_alive_but_not_ready() -> None:
    port = free_port()
    draining = False
    answer = healthserver.probe_answer(alive="ok", ready=lambda: "draining" if draining else None)
    server = await healthserver.serve(answer, host="127.0.0.1", port=port)
    try:
        assert await asyncio.to_thread(probe, port, "/readyz", timeout=5) == (200, "ready\n")
        draining = True
        assert await asyncio.to_thread(probe, port, "/readyz", timeout=5) == (
            503,
            "not ready: draining\n",
        )
        assert await asyncio.to_thread(probe, port, "/healthz", timeout=5) == (200, "ok\n")
        assert await asyncio.to_thread(probe, port, "/other", timeout=5) == (404, "not found\n")
    finally:
        server.close()
        await server.wait_closed()
