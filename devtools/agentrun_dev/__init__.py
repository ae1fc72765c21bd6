"""agentrun-dev: the real local stack for tests and demos: control plane, nats-server, mock
model, operator and workers as child processes, started and stopped by pid.

A distribution of its own (``devtools/`` in the repository), not part of the runtime wheel;
``agentrun`` finds its ``dev`` subcommands (`cli`) through the ``agentrun.cli`` entry point
group. Modules, from the bottom up (each imports only those above it, the standard library and
cryptography / installer / packaging / platformdirs / psutil / pyyaml; of the runtime only the
``agentrun`` package itself, to find its files):

- `console`: the `Log` callable that progress lines go to.
- `procs`: start a process in its own group, stop / kill / check it by its recorded pid.
- `probes`: free loopback ports; readiness probes that fail fast with the log tail.
- `components`: a process plus how to restart and probe it (`Component`, `Launch`).
- `certs`: a throw-away PKI for kube-apiserver (and client certificates for a node).
- `gobuild`, `binaries`: kube-apiserver, etcd, kubectl from ``KUBEBUILDER_ASSETS``, the
  per-machine cache, or a pinned build from the Go module proxy; likewise the node's
  kubernetes binaries and CoreDNS.
- `controlplane`: etcd + kube-apiserver (or an existing cluster); `kubectl`: drive it.
- `natsserver`: nats-server with JetStream.
- `nodehost`, `containerd`, `nodeimages`, `node`: a real single node (containerd, kubelet,
  kube-proxy, CoreDNS, controller-manager, scheduler) joined to the local control plane; the
  host state it adds and removes; the pause and busybox images it runs, built here.
- `state`, `stack`: the whole stack behind ``agentrun dev`` and the test fixtures.
- `prometheus`: Prometheus and promtool, built once per machine like the control plane, to
  prove the dashboard and the alert rules against real scrapes.
- `helm`: helm, built once per machine like the control plane, and a runner for the chart.
- `image`: container images built with buildah from Debian packages and wheels (the
  agentrun and NATS images the chart runs), cached by a hash of their inputs.
- `demo`: what ``agentrun dev demo`` adds on top: the ``mock`` AgentModel and the examples.
- `cli`: the ``agentrun dev up|down|status|env|demo|binaries`` subcommands.
- `layout`: the repository's layout checks ``make lint`` runs (import contracts on an
  installed copy, module sizes).

Import the modules (``from agentrun_dev import stack``); there is no re-export here, so
importing one piece does not start loading the rest.
"""
