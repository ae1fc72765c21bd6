"""kubectl's global flags, as ``kubectl agentrun`` takes them on every subcommand.

kubectl hands a plugin its arguments as given, so ``kubectl agentrun approve RUN --as alice``
must understand ``--as`` itself. ``KubeOptions`` is what the flags ask for: which kubeconfig
file (``--kubeconfig``) and context (``--context``) to load, and whom to impersonate (``--as``,
``--as-group``: the ``Impersonate-User`` and ``Impersonate-Group`` headers the API server
checks against the caller's ``impersonate`` permission). The namespace (``-n``) stays a plain
argument of each command; ``current_namespace`` is its default.

What belongs here: those flags, the client they configure and the default namespace. What does
not: the commands (``control``, ``kubectl``).

The Kubernetes client (``kubernetes_asyncio``, ``agentrun.kube``) is imported by the calls that
use it, not with this module: parsing a command line (``--help``, a usage error) needs none of it.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubernetes_asyncio import client

IMPERSONATE_USER = "Impersonate-User"
IMPERSONATE_GROUP = "Impersonate-Group"
KUBECONFIG_HINT = (
    "set KUBECONFIG to your cluster's kubeconfig (kubectl agentrun also takes --kubeconfig); "
    "for the local stack `make demo` started, run "
    '`eval "$(.venv/bin/agentrun dev env)"` in that checkout first'
)
"""What to do when no kubeconfig is found: the CLI programs' error says it after the cause."""


class NoKubeconfig(RuntimeError):
    """No kubeconfig file and not in a pod: `str()` is the cause, then `KUBECONFIG_HINT`."""


@dataclasses.dataclass(frozen=True)
class KubeOptions:
    """The kubeconfig path and context to load (``None``: ``KUBECONFIG`` or
    ``~/.kube/config``, its current context), the user and groups to act as (``as_user``
    ``None``: the kubeconfig's own identity)."""

    kubeconfig: str | None = None
    context: str | None = None
    as_user: str | None = None
    as_groups: tuple[str, ...] = ()

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> KubeOptions:
        """From a parsed command line; flags a program does not offer count as not given."""
        return cls(
            kubeconfig=getattr(args, "kubeconfig", None),
            context=getattr(args, "context", None),
            as_user=getattr(args, "as_user", None),
            as_groups=tuple(getattr(args, "as_groups", None) or ()),
        )

    def headers(self) -> list[tuple[str, str]]:
        """The impersonation headers, in order: ``Impersonate-User`` then one
        ``Impersonate-Group`` per group. Raises ValueError for groups without a user (the
        API server requires a user to impersonate groups; kubectl refuses the same)."""
        if self.as_groups and not self.as_user:
            raise ValueError("--as-group requires --as (a user to act as)")
        if not self.as_user:
            return []
        return [(IMPERSONATE_USER, self.as_user)] + [
            (IMPERSONATE_GROUP, group) for group in self.as_groups
        ]

    async def api_client(self) -> client.ApiClient:
        """An ``ApiClient`` of the kubeconfig and context, sending the impersonation headers
        with every request (the generated calls and ``call_api`` alike). Raises
        ConfigException (no configuration, no such file or context) or ValueError
        (``headers``); NoKubeconfig when neither a kubeconfig nor a pod's credentials are
        there and none was named (no ``--kubeconfig``, no ``--context``)."""
        from kubernetes_asyncio.config.config_exception import ConfigException

        from agentrun import kube

        headers = self.headers()
        try:
            api = await kube.api_client(config_file=self.kubeconfig, context=self.context)
        except ConfigException as err:
            if self.kubeconfig is not None or self.context is not None:
                raise  # the file or context asked for: the message names it
            raise NoKubeconfig(f"{str(err).rstrip('. ')}; {KUBECONFIG_HINT}") from err
        # the session's own headers: a header may repeat there (one per group), which the
        # ApiClient's default_headers (a dict) cannot express
        session_headers = api.rest_client.pool_manager.headers
        for name, value in headers:
            session_headers.add(name, value)
        return api


def add_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """Add ``--kubeconfig``, ``--context``, ``--as``, ``--as-group`` to ``parser``. On the
    top-level parser (``top``) they default to not given; on a subcommand's parser they set a
    value only when given, so a flag before the subcommand is not undone by it."""
    unset: Any = None if top else argparse.SUPPRESS
    parser.add_argument(
        "--kubeconfig",
        default=unset,
        metavar="PATH",
        help="the kubeconfig file to use (default: $KUBECONFIG, else ~/.kube/config)",
    )
    parser.add_argument(
        "--context",
        default=unset,
        metavar="NAME",
        help="the kubeconfig context to use (default: its current context)",
    )
    parser.add_argument(
        "--as",
        dest="as_user",
        default=unset,
        metavar="USER",
        help="user to impersonate for the operation (needs RBAC impersonate on that user)",
    )
    parser.add_argument(
        "--as-group",
        dest="as_groups",
        action="append",
        default=unset,
        metavar="GROUP",
        help="group to impersonate, with --as; repeat for several groups",
    )


def current_namespace(options: KubeOptions) -> str:
    """The namespace of the kubeconfig context ``options`` name (else the current one),
    else ``default`` (no kubeconfig, no such context, no namespace set)."""
    from kubernetes_asyncio.config import kube_config
    from kubernetes_asyncio.config.config_exception import ConfigException

    path = (
        options.kubeconfig or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    )
    try:
        contexts, active = kube_config.list_kube_config_contexts(path.split(os.pathsep)[0])
    except (ConfigException, OSError, TypeError, KeyError):
        return "default"
    if options.context is not None:
        named = [c for c in contexts or [] if c.get("name") == options.context]
        active = named[0] if named else None
    namespace = ((active or {}).get("context") or {}).get("namespace")
    return str(namespace or "default")
