"""The user programs: what a person runs against a cluster, next to neither side of it.

- ``main``: the ``agentrun`` command (``cancel``, ``approve``, ``deny``; other distributions
  add subcommands through the ``agentrun.cli`` entry point group, as ``agentrun-dev`` adds
  ``agentrun dev …``).
- ``kubectl``: the kubectl plugin (``kubectl agentrun get|logs|describe|eval|…``, console
  script ``kubectl-agentrun``); its ``logs`` and ``describe`` commands are the modules of those
  names, imported when the command runs (so is every client library: ``--help`` needs none).
- ``control``: the Kubernetes calls and run commands both programs share (with the user's own
  kubeconfig, so their own RBAC).
- ``trajectory``: a run's committed events as readable lines (pure).

What belongs here: argument parsing, printing, and the calls a user's credentials make. What
does not: anything the operator or the workers run; nothing outside this package imports it.
"""
