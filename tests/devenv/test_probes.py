"""Probes wait for a port to answer and fail fast, with the log tail, when the process dies."""

from __future__ import annotations

import http.server
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from agentrun_dev import components, probes, procs


@pytest.fixture
def http_server() -> Iterator[str]:
    """A real HTTP server on loopback answering every GET with 200 "status: ok"."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"status: ok"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            del format, args

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_free_ports_are_not_handed_out_twice() -> None:
    ports = [probes.free_port() for _ in range(50)]
    assert len(set(ports)) == 50


def test_free_ports_come_from_the_range_given_and_skip_a_taken_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.socket() as taken:
        first = _three_free_ports_from(40000)
        taken.bind(("127.0.0.1", first))
        taken.listen()
        monkeypatch.setenv(probes.PORT_RANGE_ENV, f"{first}-{first + 2}")

        given = {probes.free_port(), probes.free_port()}

        assert given == {first + 1, first + 2}
        with pytest.raises(RuntimeError, match="no free TCP port"):
            probes.free_port()  # the range is used up: one taken, two handed out


def _three_free_ports_from(start: int) -> int:
    for first in range(start, start + 3000, 3):
        try:
            with socket.socket() as a, socket.socket() as b, socket.socket() as c:
                for sock, port in ((a, first), (b, first + 1), (c, first + 2)):
                    sock.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
    raise AssertionError("no three free ports in a row")


@pytest.mark.parametrize("text", ["20000", "20-10", "a-b", "0-10", "10-70000"])
def test_a_malformed_port_range_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    monkeypatch.setenv(probes.PORT_RANGE_ENV, text)
    with pytest.raises(ValueError, match=probes.PORT_RANGE_ENV):
        probes.free_port()


def test_parallel_processes_get_disjoint_port_slices_below_the_ephemeral_ports() -> None:
    slices = [probes.port_slice(i) for i in range(probes.PORT_SLICES)]
    ranges = [range(int(s.split("-")[0]), int(s.split("-")[1]) + 1) for s in slices]
    assert slices[0] == "10000-13999" and slices[4] == "26000-29999"
    assert sum(len(r) for r in ranges) == len(set().union(*ranges)) == 20000
    assert probes.port_slice(probes.PORT_SLICES) == slices[0]


def test_an_http_probe_passes_on_200_with_the_expected_text(http_server: str) -> None:
    assert probes.check(probes.Probe(url=f"{http_server}/healthz", expect="ok")) is None
    reason = probes.check(probes.Probe(url=f"{http_server}/healthz", expect="nope"))
    assert reason is not None and "lacks 'nope'" in reason


def test_a_tcp_probe_reports_a_closed_port() -> None:
    reason = probes.check(probes.Probe(url=f"tcp://127.0.0.1:{probes.free_port()}"))
    assert reason is not None and "refused" in reason.lower()


def test_waiting_ends_at_once_when_the_process_exits_and_shows_its_log(tmp_path: Path) -> None:
    record = procs.start_process(
        procs.ProcessSpec(
            name="doomed",
            argv=("sh", "-c", "echo boom: no config; exit 3"),
            log_path=tmp_path / "doomed.log",
            die_with_parent=True,
        )
    )
    started = time.monotonic()
    probe = probes.Probe(url=f"tcp://127.0.0.1:{probes.free_port()}")

    with pytest.raises(probes.NotReadyError) as caught:
        probes.wait_ready(probe, record=record, timeout=30)

    assert time.monotonic() - started < 10
    assert "doomed exited with status 3 before it was ready" in str(caught.value)
    assert "boom: no config" in str(caught.value)


def test_waiting_times_out_with_the_last_probe_result(tmp_path: Path) -> None:
    launch = components.Launch(log_dir=tmp_path, die_with_parent=True)
    spec = launch.spec("sleeper", (sys.executable, "-c", "import time; time.sleep(60)"))
    probe = probes.Probe(url=f"http://127.0.0.1:{probes.free_port()}/")

    with pytest.raises(probes.NotReadyError, match=r"did not become ready within 0\.5 s"):
        components.start_component(spec, probe=probe, ready_timeout=0.5, log=lambda _: None)
    leftovers = [
        child
        for child in psutil.Process().children()
        if child.status() != psutil.STATUS_ZOMBIE and spec.argv[-1] in child.cmdline()
    ]
    assert leftovers == [], "start_component must stop what it started when the probe fails"
