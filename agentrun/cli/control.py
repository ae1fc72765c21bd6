"""Reading and controlling AgentRuns through the API server, for both user programs.

``RunClient`` is the Kubernetes access of ``agentrun`` (``main``) and ``kubectl agentrun``
(``kubectl``): read a run's status, list, create and annotate runs, read an AgentEval and the
Events about an object, ask who the caller is (a ``SelfSubjectReview``, for the reviewer an
approval names), over one API session per command, with the user's own kubeconfig and
so their own RBAC. ``cmd_cancel`` and ``cmd_review`` are the ``cancel`` and ``approve``/``deny``
commands both programs offer: each sets a control annotation the operator reads and removes.
A decision binds what the person saw: it names the held call's digest (``--digest``, or a
confirmation on a terminal after the call was shown in full), and the operator applies it
only while that call is the pending one.

What belongs here: those calls and commands. What does not: argument parsing (each program
builds its own parser), the views of ``kubectl agentrun`` (``kubectl``, ``trajectory``).

The Kubernetes client (``kubernetes_asyncio``) and the trajectory's views are imported by the
calls that use them, not with this module: a program's parser (``--help``, a usage error)
imports this module and needs neither.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, TypeVar

from agentrun import display
from agentrun.cli import kubeflags

if TYPE_CHECKING:
    from kubernetes_asyncio import client
    from kubernetes_asyncio.client.exceptions import ApiException

T = TypeVar("T")

REVIEWER = "agentrun.dev/reviewer"
"""Set with ``approve``/``deny`` to the caller's own user name (checked by the API server)."""

MERGE_PATCH: dict[str, Any] = {"_content_type": "application/merge-patch+json"}
"""kubernetes_asyncio picks JSON Patch for list bodies only; force RFC 7386 merge patch."""


SSL_EOF_WARNING = "returning true from eof_received() has no effect when using ssl"
"""asyncio's warning each time a TLS server closes a nats-py connection: harmless, and noise."""


KUBECONFIG_MISSING = "Config not found: %s"
"""kubernetes_asyncio's warning (its format, unfilled) when no kubeconfig file is there: the
programs' own error says so, with what to do (``kubeflags.NoKubeconfig``)."""

NOISE = {"asyncio": SSL_EOF_WARNING, "kubernetes_asyncio.config.kube_config": KUBECONFIG_MISSING}
"""logger → the one message the CLI programs drop from it."""


class _DropOne(logging.Filter):
    """Drops the records whose message format is ``noise`` (exactly that one)."""

    def __init__(self, noise: str) -> None:
        super().__init__()
        self.noise = noise

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != self.noise and record.getMessage() != self.noise


def quiet_library_noise() -> None:
    """Drop each message of ``NOISE`` from its logger, for the CLI programs only (the
    services keep every warning); installing it again is a no-op."""
    for name, noise in NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropOne) for f in logger.filters):
            logger.addFilter(_DropOne(noise))


class RunAccessError(RuntimeError):
    """The API server refused a read or patch of an AgentRun; `str()` reads like kubectl's
    ``Error from server (NotFound): agentruns.agentrun.dev "x" not found``."""

    @classmethod
    def from_api(cls, err: ApiException, *, namespace: str | None = None) -> RunAccessError:
        """From the API server's ``Status`` body (reason, message), else the HTTP status; a
        404 of a request in ``namespace`` names it and how to name another (``-n``): a run
        looked for in the context's namespace, not its own, is the usual cause."""
        try:
            body = json.loads(err.body or "{}")
        except (TypeError, ValueError):
            body = {}
        reason = body.get("reason") or err.reason or err.status
        message = body.get("message") or str(err.body or "").strip() or f"HTTP {err.status}"
        if err.status == 404 and namespace:
            message += f" in namespace {namespace!r} (another: -n NAMESPACE)"
        return cls(f"Error from server ({reason}): {message}")


class RunClient:
    """Reads and annotates AgentRuns of one namespace over one API session.

    ``async with RunClient(namespace, options) as runs:`` loads the kubeconfig of
    ``options`` (``kubeflags.KubeOptions``: file, context, whom to impersonate; default
    ``KUBECONFIG`` or the in-cluster credentials, as oneself) once; raises ConfigException
    when there are none (or no such file or context), ValueError for groups to impersonate
    without a user.
    """

    def __init__(self, namespace: str, options: kubeflags.KubeOptions | None = None) -> None:
        self.namespace = namespace
        self.options = options or kubeflags.KubeOptions()
        self._api: client.ApiClient | None = None

    async def __aenter__(self) -> RunClient:
        self._api = await self.options.api_client()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._api is not None:
            await self._api.close()

    @property
    def api(self) -> client.ApiClient:
        """The session's ``ApiClient``; raises RuntimeError outside ``async with``."""
        if self._api is None:
            raise RuntimeError("RunClient used outside `async with`")
        return self._api

    def _objects(self) -> client.CustomObjectsApi:
        from kubernetes_asyncio import client

        return client.CustomObjectsApi(self.api)

    async def _call(self, request: Awaitable[T], *, namespaced: bool = True) -> T:
        """``request``'s answer; the API server's refusal (``ApiException``) as RunAccessError
        (a 404 of a ``namespaced`` request naming the client's namespace)."""
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            return await request
        except ApiException as err:
            where = self.namespace if namespaced else None
            raise RunAccessError.from_api(err, namespace=where) from err

    async def get(self, name: str) -> dict[str, Any]:
        """The AgentRun object; raises RunAccessError (not found, forbidden, …)."""
        from agentrun import kube

        return await self._get(kube.RUNS, name)

    async def get_eval(self, name: str) -> dict[str, Any]:
        """The AgentEval object; raises RunAccessError (not found, forbidden, …)."""
        from agentrun import kube

        return await self._get(kube.EVALS, name)

    async def _get(self, plural: str, name: str) -> dict[str, Any]:
        from agentrun import kube

        obj: dict[str, Any] = await self._call(
            self._objects().get_namespaced_custom_object(
                kube.GROUP, kube.VERSION, self.namespace, plural, name
            )
        )
        return obj

    async def status(self, name: str) -> dict[str, Any]:
        """The run's ``.status`` ({} before the operator wrote one).

        Raises RunAccessError (not found, forbidden, …).
        """
        status: dict[str, Any] = (await self.get(name)).get("status") or {}
        return status

    async def list_runs(self, *, all_namespaces: bool = False) -> list[dict[str, Any]]:
        """The AgentRuns of the namespace (or of every namespace); raises RunAccessError."""
        from agentrun import kube

        objects = self._objects()
        if all_namespaces:
            request = objects.list_cluster_custom_object(kube.GROUP, kube.VERSION, kube.RUNS)
        else:
            request = objects.list_namespaced_custom_object(
                kube.GROUP, kube.VERSION, self.namespace, kube.RUNS
            )
        listed = await self._call(request, namespaced=not all_namespaces)
        items: list[dict[str, Any]] = listed.get("items", [])
        return items

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create an AgentRun in the namespace; the created object. Raises RunAccessError
        (e.g. the API server's validation refused it)."""
        from agentrun import kube

        created: dict[str, Any] = await self._call(
            self._objects().create_namespaced_custom_object(
                kube.GROUP, kube.VERSION, self.namespace, kube.RUNS, body
            )
        )
        return created

    async def delete(self, name: str) -> None:
        """Delete the AgentRun (the operator, seeing the deletion, stops a run still going and
        frees its hold and slot); raises RunAccessError
        (not found, forbidden, …)."""
        from agentrun import kube

        await self._call(
            self._objects().delete_namespaced_custom_object(
                kube.GROUP, kube.VERSION, self.namespace, kube.RUNS, name
            )
        )

    async def events_of(self, uid: str) -> list[dict[str, Any]] | None:
        """The Kubernetes Events about the object ``uid`` in the namespace, oldest first, or
        None when the caller may not list Events there (none of the agentrun roles grants it:
        a person bound only ``agentrun-view`` or ``agentrun-approve`` still describes a run, as
        ``kubectl describe`` shows an object without them); raises RunAccessError otherwise."""
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client.exceptions import ApiException

        request = client.CoreV1Api(self.api).list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.uid={uid}"
        )
        try:
            listed = await request
        except ApiException as err:
            if err.status == 403:
                return None
            raise RunAccessError.from_api(err, namespace=self.namespace) from err
        events = [self.api.sanitize_for_serialization(e) for e in listed.items]
        return sorted(events, key=lambda e: str(e.get("lastTimestamp") or ""))

    async def whoami(self) -> str:
        """The user name the API server authenticates this client as (a
        ``SelfSubjectReview``, what ``kubectl auth whoami`` asks); raises RunAccessError."""
        from kubernetes_asyncio import client

        review = await self._call(
            client.AuthenticationV1Api(self.api).create_self_subject_review(
                client.V1SelfSubjectReview()
            ),
            namespaced=False,
        )
        return str(review.status.user_info.username)

    async def annotate(self, name: str, *, key: str, value: str) -> None:
        """Set annotation `key` to `value` on the run (merge patch); raises RunAccessError."""
        await self.annotate_all(name, {key: value})

    async def annotate_all(self, name: str, annotations: dict[str, str]) -> None:
        """Set every annotation of ``annotations`` on the run in one merge patch; raises
        RunAccessError (the API server refused: not found, forbidden, an admission policy)."""
        from agentrun import kube

        body = {"metadata": {"annotations": annotations}}
        await self._call(
            self._objects().patch_namespaced_custom_object(
                kube.GROUP, kube.VERSION, self.namespace, kube.RUNS, name, body, **MERGE_PATCH
            )
        )


def cmd_cancel(args: argparse.Namespace) -> int:
    """``agentrun cancel RUN``: set ``agentrun.dev/cancel=true`` unless the run already ended."""

    async def cancel() -> int:
        async with RunClient(args.namespace, kubeflags.KubeOptions.from_args(args)) as runs:
            status = await runs.status(args.run)
            if status.get("terminalReason"):
                phase, reason = status.get("phase"), status["terminalReason"]
                print(f"{args.run} already ended: {phase} / {reason}")
                return 0
            await runs.annotate(args.run, key="agentrun.dev/cancel", value="true")
        print(f"agentrun.agentrun.dev/{args.run} annotated")
        return 0

    return asyncio.run(cancel())


def pending_lines(run: str, pending: dict[str, Any]) -> list[str]:
    """The held call a decision would apply to, as the person deciding must see it: which call
    of the batch, its tool and id, its digest and its arguments in full (``display``)."""
    from agentrun.cli import trajectory

    where = f"call {pending.get('call', 1)} of {pending.get('of', 1)} held in {run}"
    shown = trajectory.held_lines(
        str(pending.get("tool")), pending.get("arguments"), digest=str(pending.get("digest"))
    )
    head = f"{where}: {pending.get('tool')} call {pending.get('toolCallID')}"
    return [display.printable(line, newlines=False) for line in (head, *shown)]


def _confirmed(verb: str) -> bool:
    """Ask on the terminal; only ``y`` or ``yes`` confirms (end of input refuses)."""
    try:
        answer = input(f"{verb} this call? [y/N] ")
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def _refusal(args: argparse.Namespace, pending: dict[str, Any]) -> str | None:
    """Why the decision must not be sent for ``pending`` (``None``: send it). An approval
    names the digest it approves (``--digest``) or is confirmed on a terminal after the call
    was shown; a digest that is not the pending call's is refused (the call changed since it
    was looked at). A denial without ``--digest`` applies to the pending call."""
    digest = pending.get("digest")
    if args.digest is not None:
        if args.digest != digest:
            return (
                f"{args.run} waits on another call than {args.digest}: the pending call's digest "
                f"is {digest} (mistyped, or the call changed since you looked); review it and "
                f"{args.verb} again"
            )
        return None
    if args.verb != "approve":
        return None
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        return (
            f"approve names the call it approves: {args.prog} approve {args.run} --digest "
            f"{digest} (no terminal to confirm on)"
        )
    return None if _confirmed(args.verb) else "not approved"


def cmd_review(args: argparse.Namespace) -> int:
    """``agentrun approve|deny RUN [--digest D]``: annotate the run with the digest of the
    call it decides and ``agentrun.dev/reviewer`` with the caller's own user name (the API
    server's admission policy checks both the name and the ``approve`` permission on
    ``agentruns/approval``); the operator applies the decision only while that call is the
    pending one.

    Prints the pending call in full first. Refused (exit 1): no pending call; ``--digest``
    that is not the pending call's; ``approve`` without ``--digest`` off a terminal, or not
    confirmed on one. ``args.prog`` (the parser's default: ``agentrun`` or ``kubectl
    agentrun``) leads an error."""

    async def pending_of() -> dict[str, Any] | None:
        async with RunClient(args.namespace, kubeflags.KubeOptions.from_args(args)) as runs:
            found: dict[str, Any] | None = (await runs.status(args.run)).get("pendingApproval")
            return found

    async def decide(digest: str) -> str:
        async with RunClient(args.namespace, kubeflags.KubeOptions.from_args(args)) as runs:
            reviewer = await runs.whoami()
            await runs.annotate_all(
                args.run, {f"agentrun.dev/{args.verb}": digest, REVIEWER: reviewer}
            )
        return reviewer

    pending = asyncio.run(pending_of())
    if not pending:
        print(f"{args.prog}: error: {args.run} is not waiting for an approval", file=sys.stderr)
        return 1
    print("\n".join(pending_lines(args.run, pending)), flush=True)
    refused = _refusal(args, pending)
    if refused is not None:
        print(f"{args.prog}: error: {refused}", file=sys.stderr)
        return 1
    reviewer = asyncio.run(decide(str(pending["digest"])))
    print(
        f"{args.verb}: {pending['digest']} as {reviewer} (applied only while that call is the "
        "pending one)"
    )
    return 0


def add_digest_option(parser: argparse.ArgumentParser, *, verb: str) -> None:
    """``--digest D`` of ``approve``/``deny`` (both programs)."""
    need = (
        "required off a terminal; on one, the call is shown and you are asked"
        if verb == "approve"
        else "without it, the pending call is denied"
    )
    parser.add_argument(
        "--digest",
        default=None,
        metavar="DIGEST",
        help=f"{verb} only the held call with this digest (sha256:…, shown by describe and "
        f"logs); refused when the pending call's digest differs ({need})",
    )
