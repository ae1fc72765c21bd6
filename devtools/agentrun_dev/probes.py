"""Readiness of local services: free loopback ports and probes that wait until a port answers.

A `Probe` is plain data (an http, https or tcp URL plus optional TLS files), so the stack can
store it and probe a component again after restarting it. `wait_ready` fails fast, with the
process's log tail, when the process exits before it is ready.

What belongs here: network checks only; starting processes is `procs`' job.
"""

from __future__ import annotations

import dataclasses
import os
import random
import socket
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentrun_dev import procs

_HANDED_OUT: set[int] = set()
"""Ports already returned by `free_port` in this process, never returned twice."""

PORT_RANGE_ENV = "AGENTRUN_DEV_PORTS"
"""``FIRST-LAST``: the inclusive range `free_port` draws from when set (see `port_range`)."""
PORT_SLICE_BASE = 10000
PORT_SLICE_SIZE = 4000
PORT_SLICES = 5
"""`port_slice` cuts 10000-29999 (below Linux's default ephemeral ports, 32768-60999, which
outgoing connections and ``bind(("", 0))`` use) into 5 slices of 4000 ports."""


class NotReadyError(RuntimeError):
    """A service did not answer its probe in time, or its process exited first."""


@dataclasses.dataclass(frozen=True, slots=True)
class Probe:
    """A check that a service is ready: an HTTP(S) GET answering 200, or a TCP or unix-socket
    connect."""

    url: str
    """``http://…``, ``https://…``, ``tcp://host:port`` or ``unix:///path/to/socket``."""
    expect: str | None = None
    """Text the HTTP response body must contain (e.g. ``"ok"``); None accepts any 200."""
    ca_file: Path | None = None
    """PEM CA bundle that verifies an https server; None uses the system trust store."""
    cert_file: Path | None = None
    """PEM client certificate for https (with `key_file`)."""
    key_file: Path | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form, read back by `from_dict`."""
        return {
            "url": self.url,
            "expect": self.expect,
            "ca_file": _str_or_none(self.ca_file),
            "cert_file": _str_or_none(self.cert_file),
            "key_file": _str_or_none(self.key_file),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Probe:
        """Inverse of `as_dict`. Raises KeyError if `url` is missing."""
        return cls(
            url=str(data["url"]),
            expect=data.get("expect"),
            ca_file=_path_or_none(data.get("ca_file")),
            cert_file=_path_or_none(data.get("cert_file")),
            key_file=_path_or_none(data.get("key_file")),
        )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that is free now and not handed out before by this process.

    Drawn at random from `port_range` when it is set (so that processes given disjoint ranges,
    e.g. parallel test workers, never pick the same port), else from the kernel's ephemeral
    ports. Another process may still take it before the service binds it; the caller's
    readiness probe then fails with the service's own "address in use" log line.

    Raises RuntimeError when no free port is found in 100 tries, ValueError when
    `PORT_RANGE_ENV` is malformed.
    """
    ports = port_range()
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, 0 if ports is None else random.choice(ports)))
            except OSError:
                continue  # taken now: draw again
            port = int(sock.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError(f"no free TCP port found on {host}")


def port_range() -> range | None:
    """The ports `free_port` draws from, read from `PORT_RANGE_ENV` (``FIRST-LAST``,
    inclusive); None when it is unset or empty. Child processes inherit it.

    Raises ValueError (naming the variable) when it is not two ports in order.
    """
    text = os.environ.get(PORT_RANGE_ENV, "").strip()
    if not text:
        return None
    first, _, last = text.partition("-")
    try:
        low, high = int(first), int(last)
    except ValueError:
        low, high = 0, -1
    if not 0 < low <= high < 65536:
        raise ValueError(f"{PORT_RANGE_ENV}={text!r}: expected FIRST-LAST, e.g. 10000-13999")
    return range(low, high + 1)


def port_slice(index: int) -> str:
    """The `PORT_RANGE_ENV` value for parallel process number ``index`` (0-based): one of
    `PORT_SLICES` disjoint slices, e.g. ``10000-13999`` for 0 (indexes past the last wrap)."""
    low = PORT_SLICE_BASE + (index % PORT_SLICES) * PORT_SLICE_SIZE
    return f"{low}-{low + PORT_SLICE_SIZE - 1}"


def check(probe: Probe, *, timeout: float = 2.0) -> str | None:
    """Probe once. Returns None when ready, else a short reason (e.g. "connection refused")."""
    parsed = urllib.parse.urlsplit(probe.url)
    if parsed.scheme == "unix":
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(timeout)
                sock.connect(parsed.path)
                return None
        except OSError as exc:
            return str(exc)
    if parsed.scheme == "tcp":
        try:
            with socket.create_connection((parsed.hostname or "", parsed.port or 0), timeout):
                return None
        except OSError as exc:
            return str(exc)
    try:
        with _opener(probe).open(probe.url, timeout=timeout) as response:
            body = response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}: {exc.read().decode(errors='replace')[:200]}"
    except (OSError, ssl.SSLError) as exc:
        return str(getattr(exc, "reason", exc))
    if probe.expect is not None and probe.expect not in body:
        return f"response lacks {probe.expect!r}: {body[:200]}"
    return None


def wait_ready(
    probe: Probe, *, record: procs.ProcessRecord | None = None, timeout: float = 30.0
) -> None:
    """Poll `probe` every 0.1 s until it passes.

    Args:
        probe: what to check.
        record: the process serving it; if given, its exit ends the wait at once.
        timeout: seconds to wait in total.

    Raises:
        NotReadyError: on timeout or process exit; the message names the URL, the last probe
            result and the last 40 lines of the process's log.
    """
    deadline = time.monotonic() + timeout
    name = "service" if record is None else record.name
    while True:
        reason = check(probe)
        if reason is None:
            return
        if record is not None and not procs.is_alive(record):
            code = procs.exit_code(record)
            status = "" if code is None else f" with status {code}"
            raise NotReadyError(
                f"{name} exited{status} before it was ready at {probe.url}" + _log_tail_note(record)
            )
        if time.monotonic() >= deadline:
            raise NotReadyError(
                f"{name} did not become ready within {timeout:g} s at {probe.url}: {reason}"
                + _log_tail_note(record)
            )
        time.sleep(0.1)


def _log_tail_note(record: procs.ProcessRecord | None) -> str:
    if record is None:
        return ""
    tail = procs.read_log_tail(record.log_path)
    return f"\n--- last lines of {record.log_path} ---\n{tail}"


def _opener(probe: Probe) -> urllib.request.OpenerDirector:
    """An opener that never uses an HTTP proxy (the services are on loopback)."""
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if probe.url.startswith("https:"):
        handlers.append(urllib.request.HTTPSHandler(context=_tls_context(probe)))
    return urllib.request.build_opener(*handlers)


def _tls_context(probe: Probe) -> ssl.SSLContext:
    context = ssl.create_default_context(
        cafile=None if probe.ca_file is None else str(probe.ca_file)
    )
    if probe.cert_file is not None:
        context.load_cert_chain(
            str(probe.cert_file), None if probe.key_file is None else str(probe.key_file)
        )
    return context


def _str_or_none(path: Path | None) -> str | None:
    return None if path is None else str(path)


def _path_or_none(value: object) -> Path | None:
    return None if value is None else Path(str(value))
