"""`prometheus_query`: PromQL against the Prometheus the platform configured, summarised.

The worker's ``AGENTRUN_PROMETHEUS_URL`` names the server (the model cannot choose another).
Without ``range`` the query is an instant query at the current time (``/api/v1/query``); with
``range`` (and an optional ``step``) it is a range query ending now
(``/api/v1/query_range``). Results are summarised for the model: at most ``MAX_SERIES`` series,
largest first for instant vectors, each range series as its point count, min, max, average and
last value, so a result stays small whatever the query matches. Failures: a query Prometheus
refuses (bad PromQL, a range too fine) is the model's (``domain``); an unreachable server, a
5xx or a timeout is infrastructure.

Every query reads the run's own series only (``check_scope``): it is parsed with
``promql-parser`` (the Rust ``promql-parser`` crate's Python binding) before it is sent, and
every vector selector in it — inside functions, aggregations, binary operations with vector
matching, subqueries, matrix selectors — must carry the equality matcher
``<scope label>="<the run's namespace>"`` (the label is ``AGENTRUN_PROMETHEUS_SCOPE_LABEL``,
default ``namespace``). Matchers of one selector are ANDed, so whatever else it says
(``{__name__=~".+"}``, ``namespace=~".*"``, ``namespace!="x"``) it can only match that
namespace's series. Refused as the model's error (``domain``, naming the selectors): a
selector without the matcher, a selector with ``or`` between matcher groups, the ``info``
function (it joins ``target_info`` series no selector names), and a query the parser cannot
read. The query is sent as written, never rewritten: the library's printer does not escape
strings, so a rewritten query could mean something else to Prometheus.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping
from typing import Any

import aiohttp
import promql_parser

from agentrun.kernel import ToolFault

from . import catalog

__all__ = ["MAX_POINTS", "MAX_SERIES", "SPEC", "PrometheusQuery", "check_scope", "summarize"]

MAX_SERIES = 20
"""Series shown at most; the rest are counted."""
MAX_POINTS = 11_000
"""Points per series Prometheus may return (its own limit); ``step`` is raised to fit."""
TIMEOUT_SECONDS = 20.0
_DURATION = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION_PATTERN = "^[0-9]+(s|m|h|d)$"
DEFAULT_SCOPE_LABEL = "namespace"
"""The label every selector must match the run's namespace on
(``AGENTRUN_PROMETHEUS_SCOPE_LABEL``)."""
UNSCOPED_FUNCTIONS = frozenset({"info"})
"""Functions that read series no selector of the query names (``info`` joins ``target_info``)."""

SPEC = catalog.ToolSpec(
    name="prometheus_query",
    description=(
        "Run a PromQL query against the platform's Prometheus and get a short summary. "
        "Only this run's namespace can be read: every selector must carry the matcher the "
        'tool\'s error names (e.g. {namespace="team-a"}). '
        "Without 'range': the current value of each series (largest first). With 'range' "
        "(e.g. 30m, 6h): each series over that window ending now, as point count, min, max, "
        f"average and last value; 'step' sets the resolution (default range/60). At most "
        f"{MAX_SERIES} series are listed; aggregate (sum by, topk) to see what matters. "
        "Invalid PromQL comes back as an error with Prometheus' message."
    ),
    parameters=catalog.object_schema(
        {
            "query": {
                "type": "string",
                "minLength": 1,
                "maxLength": 4096,
                "description": 'PromQL, e.g. sum by (job) (rate(requests_total{code=~"5.."}[5m]))',
            },
            "range": {
                "type": "string",
                "pattern": _DURATION_PATTERN,
                "description": "Window ending now for a range query, e.g. 30m, 6h, 2d.",
            },
            "step": {
                "type": "string",
                "pattern": _DURATION_PATTERN,
                "description": "Resolution of a range query, e.g. 1m (default: range/60).",
            },
        },
        required=["query"],
    ),
    effect="read",
    pollable=True,
)


def _seconds(text: str) -> int:
    return int(text[:-1]) * _DURATION[text[-1]]


def _labels(metric: Mapping[str, str]) -> str:
    name = metric.get("__name__", "")
    rest = ",".join(f'{k}="{v}"' for k, v in sorted(metric.items()) if k != "__name__")
    return f"{name}{{{rest}}}" if rest or not name else name


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def _fmt(value: float) -> str:
    return f"{value:.6g}"


def _vector_lines(series: list[Any]) -> list[str]:
    def size(s: Any) -> float:
        value = _number(s["value"][1])
        return -value if not math.isnan(value) else math.inf

    return [f"{_labels(s['metric'])} {s['value'][1]}" for s in sorted(series, key=size)]


def _matrix_line(s: Any) -> str:
    points = s.get("values") or [[0, "NaN"]]
    values = [_number(v[1]) for v in points]
    finite = [v for v in values if not math.isnan(v)] or [math.nan]
    at, last = points[-1]
    return (
        f"{_labels(s['metric'])} points={len(values)} min={_fmt(min(finite))} "
        f"max={_fmt(max(finite))} avg={_fmt(sum(finite) / len(finite))} "
        f"last={last}@{time.strftime('%H:%M:%SZ', time.gmtime(float(at)))}"
    )


def check_scope(query: str, *, label: str, value: str) -> None:
    """Raises ``ToolError`` (``domain``) unless every vector selector of ``query`` carries
    ``label="value"`` and nothing in it reads series no selector names (see the module
    docstring); the message names the selectors to fix."""
    try:
        expr = promql_parser.parse(query)
    except ValueError as err:
        raise catalog.ToolError(f"the query cannot be checked: {err}") from None
    required = f'{label}="{value}"'
    problems: list[str] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.Call) and node.func.name in UNSCOPED_FUNCTIONS:
            problems.append(f"{node.func.name}() reads series no selector names")
        if not isinstance(node, promql_parser.VectorSelector):
            return
        matchers = node.matchers
        if matchers.or_matchers:
            problems.append(f"{node.name or ''}{{… or …}} ('or' between matchers)")
        elif not any(
            m.name == label and m.op == promql_parser.MatchOp.Equal and m.value == value
            for m in matchers.matchers
        ):
            problems.append(f"{node.name or ''}{matchers}")

    promql_parser.walk(expr, visit)
    if problems:
        raise catalog.ToolError(
            f"this run may read only series with {required}: give every selector that "
            f"matcher (e.g. up{{{required}}}); not scoped: {'; '.join(problems)[:1000]}"
        )


def summarize(data: Mapping[str, Any]) -> str:
    """The model's text for a Prometheus ``data`` object (``resultType`` and ``result``)."""
    kind, result = data.get("resultType"), data.get("result")
    if kind in ("scalar", "string") and isinstance(result, list) and len(result) == 2:
        return f"{kind}: {result[1]}"
    series: list[Any] = list(result or [])
    if not series:
        return f"{kind}: no series matched"
    head = f"{kind}: {len(series)} series"
    if len(series) > MAX_SERIES:
        head += f", showing {MAX_SERIES}"
    if kind == "vector":
        lines = _vector_lines(series)[:MAX_SERIES]
    else:
        lines = [_matrix_line(s) for s in series[:MAX_SERIES]]
    if len(series) > MAX_SERIES:
        lines.append(f"... {len(series) - MAX_SERIES} more series not shown")
    return "\n".join([head, *lines])


class PrometheusQuery:
    """The `prometheus_query` tool against one configured Prometheus."""

    spec = SPEC

    def __init__(self, url: str | None = None, *, scope_label: str = DEFAULT_SCOPE_LABEL) -> None:
        """``url``: the server's base URL (``http://prometheus:9090``); ``None``: calls fail
        saying none is configured. ``scope_label``: the label every selector must match the
        run's namespace on (``check_scope``)."""
        self.url = url.rstrip("/") if url else None
        self.scope_label = scope_label

    async def run(self, arguments: Mapping[str, Any], ctx: catalog.ToolContext) -> str:
        """Query and summarise per the module docstring; raises ToolError."""
        if self.url is None:
            raise catalog.ToolError(
                "no Prometheus is configured for this worker (AGENTRUN_PROMETHEUS_URL; "
                "the chart's value tools.prometheusQuery.url)",
                fault=ToolFault.TRANSPORT,
            )
        query = str(arguments["query"])
        check_scope(query, label=self.scope_label, value=ctx.namespace)
        params: dict[str, str] = {"query": query}
        now = time.time()
        path = "/api/v1/query"
        if arguments.get("range"):
            window = _seconds(str(arguments["range"]))
            step = (
                _seconds(str(arguments["step"])) if arguments.get("step") else max(1, window // 60)
            )
            step = max(step, math.ceil(window / MAX_POINTS))
            params.update(start=f"{now - window:.3f}", end=f"{now:.3f}", step=str(step))
            path = "/api/v1/query_range"
        else:
            params["time"] = f"{now:.3f}"
        return summarize(await self._get(path, params))

    async def _get(self, path: str, params: Mapping[str, str]) -> Mapping[str, Any]:
        try:
            async with (
                asyncio.timeout(TIMEOUT_SECONDS),
                aiohttp.ClientSession() as session,
                session.get(f"{self.url}{path}", params=params) as response,
            ):
                status = response.status
                body: Any = await response.json(content_type=None)
        except TimeoutError:
            raise catalog.ToolError(
                f"Prometheus did not answer within {TIMEOUT_SECONDS:g}s", fault=ToolFault.TIMEOUT
            ) from None
        except aiohttp.ClientConnectionError as err:
            raise catalog.ToolError(
                f"Prometheus unreachable: {type(err).__name__}: {err}", fault=ToolFault.CONNECTION
            ) from None
        except (aiohttp.ClientError, ValueError) as err:
            raise catalog.ToolError(
                f"unreadable answer from Prometheus: {err}", fault=ToolFault.TRANSPORT
            ) from None
        return _data(status, body)


def _data(status: int, body: Any) -> Mapping[str, Any]:
    """The ``data`` of a Prometheus API answer; raises ToolError for an error answer."""
    if isinstance(body, dict) and body.get("status") == "success":
        data: Mapping[str, Any] = body.get("data") or {}
        return data
    message = body.get("error", "") if isinstance(body, dict) else str(body)[:300]
    kind = body.get("errorType", "") if isinstance(body, dict) else ""
    fault = (
        ToolFault.SERVER
        if status >= 500 or kind in ("internal", "unavailable")
        else ToolFault.DOMAIN
    )
    raise catalog.ToolError(
        f"Prometheus refused the query ({kind or status}): {message}", fault=fault
    )
