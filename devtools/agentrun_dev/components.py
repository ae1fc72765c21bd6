"""A component of the local stack: a process, how to start it again, and how to know it is up.

`Component` joins a `procs.ProcessSpec` (how to start), a `procs.ProcessRecord` (what runs now)
and an optional `probes.Probe` (when it is ready). It is plain, JSON-serialisable data, so the
CLI can stop, check and restart components that an earlier invocation started, and tests can
crash and restart them the same way.

What belongs here: the generic start / restart / stop of one component. Which components
exist, and their arguments, belong to `controlplane`, `natsserver` and `stack`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrun_dev import console, probes, procs


@dataclasses.dataclass(frozen=True, slots=True)
class Launch:
    """How one caller launches its components: log directory, lifetime, progress output."""

    log_dir: Path
    """Each component logs to ``<log_dir>/<name>.log``."""
    die_with_parent: bool = False
    """Kill the components when the launching thread exits (tests); see `procs.ProcessSpec`."""
    log: console.Log = console.log_to_stderr
    """Receives progress lines."""

    def spec(
        self, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None
    ) -> procs.ProcessSpec:
        """A spec for `argv` named `name`, logging to ``<log_dir>/<name>.log``."""
        return procs.ProcessSpec(
            name=name,
            argv=tuple(argv),
            log_path=self.log_dir / f"{name}.log",
            env=dict(env or {}),
            die_with_parent=self.die_with_parent,
        )

    def start(
        self,
        spec: procs.ProcessSpec,
        *,
        probe: probes.Probe | None,
        ports: Mapping[str, int],
        ready_timeout: float = 30.0,
    ) -> Component:
        """`start_component` with this launch's progress output; raises like it."""
        return start_component(
            spec, probe=probe, ports=ports, ready_timeout=ready_timeout, log=self.log
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Component:
    """One started process of the stack."""

    spec: procs.ProcessSpec
    record: procs.ProcessRecord
    probe: probes.Probe | None = None
    """Readiness check; None means "ready once started"."""
    ports: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Named loopback ports it listens on, e.g. ``{"client": 2379}``; for status output."""
    ready_timeout: float = 30.0
    """Seconds to wait for `probe` after a (re)start."""

    @property
    def name(self) -> str:
        """The spec's name, e.g. ``"kube-apiserver"``."""
        return self.spec.name

    def is_alive(self) -> bool:
        """Whether its process still runs (see `procs.is_alive`)."""
        return procs.is_alive(self.record)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form, read back by `from_dict`."""
        return {
            "spec": self.spec.as_dict(),
            "record": self.record.as_dict(),
            "probe": None if self.probe is None else self.probe.as_dict(),
            "ports": dict(self.ports),
            "ready_timeout": self.ready_timeout,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Component:
        """Inverse of `as_dict`. Raises KeyError, TypeError or ValueError if malformed."""
        probe = data.get("probe")
        return cls(
            spec=procs.ProcessSpec.from_dict(data["spec"]),
            record=procs.ProcessRecord.from_dict(data["record"]),
            probe=None if probe is None else probes.Probe.from_dict(probe),
            ports={str(k): int(v) for k, v in dict(data.get("ports", {})).items()},
            ready_timeout=float(data.get("ready_timeout", 30.0)),
        )


def start_component(
    spec: procs.ProcessSpec,
    *,
    probe: probes.Probe | None = None,
    ports: Mapping[str, int] | None = None,
    ready_timeout: float = 30.0,
    log: console.Log = console.log_to_stderr,
) -> Component:
    """Start `spec` and wait until `probe` passes.

    Raises:
        probes.NotReadyError: not ready within `ready_timeout` seconds or exited first; the
            process is stopped before raising, so nothing is left running.
        FileNotFoundError: the program does not exist.
    """
    log(f"starting {spec.name} (log {spec.log_path})")
    record = procs.start_process(spec)
    component = Component(
        spec=spec, record=record, probe=probe, ports=dict(ports or {}), ready_timeout=ready_timeout
    )
    _wait_ready_or_stop(component)
    log(f"{spec.name} is up (pid {record.pid})")
    return component


def restart_component(
    component: Component, *, log: console.Log = console.log_to_stderr
) -> Component:
    """Stop `component` if it still runs, start its spec again and wait for its probe.

    Returns the new component (new record, same spec, probe and ports). Raises like
    `start_component`.
    """
    stop_component(component)
    return start_component(
        component.spec,
        probe=component.probe,
        ports=component.ports,
        ready_timeout=component.ready_timeout,
        log=log,
    )


def stop_component(component: Component, *, timeout: float = 10.0) -> procs.StopOutcome:
    """Stop its process by pid (SIGTERM, then SIGKILL after `timeout` s); see `procs`."""
    return procs.stop_process(component.record, timeout=timeout)


def kill_component(component: Component) -> procs.StopOutcome:
    """SIGKILL its process group at once, as a crash would; see `procs.kill_process`."""
    return procs.kill_process(component.record)


def _wait_ready_or_stop(component: Component) -> None:
    if component.probe is None:
        return
    try:
        probes.wait_ready(component.probe, record=component.record, timeout=component.ready_timeout)
    except BaseException:
        procs.stop_process(component.record, timeout=5.0)
        raise
