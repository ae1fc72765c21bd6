"""The dashboard's and the alert rules' PromQL, read with Prometheus' own parser.

Test support, imported by ``tests/observability`` and ``tests/e2e`` (``tests/`` is on
``sys.path``, as for ``prometheus_support``):

- `dashboard_queries` / `rule_queries` list every expression of a Grafana dashboard or a
  Prometheus rule file as `Query` values; `dashboard_constants` gives the dashboard's fixed
  variables.
- `instantiate` fills Grafana's variables (``$tenant``, ``$__rate_interval`` …), so a plain
  Prometheus accepts the expression. This is string templating, not PromQL parsing.
- Everything that looks *inside* an expression walks the syntax tree that a real Prometheus
  returns from ``/api/v1/parse_query`` (``PrometheusServer.parse``): `selectors`,
  `metric_names`, `ranges_ms`, `alert_condition`, `condition_operands`. `render` writes a
  tree (or a part of one) back as PromQL, e.g. to query an alert condition's operands.

The tree's node shapes are Prometheus' (``web/api/v1/translate_ast.go``): a dict with a
``type`` of ``vectorSelector``, ``matrixSelector``, ``call``, ``aggregation``,
``binaryExpr``, ``unaryExpr``, ``parenExpr``, ``subquery``, ``numberLiteral`` or
``stringLiteral``. `render` raises ValueError on anything else (duration arithmetic such as
``[5m+1m]``, which this project does not write).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Node = Mapping[str, Any]
"""One node of a Prometheus ``parse_query`` syntax tree."""
Parse = Callable[[str], dict[str, Any]]
"""``parse(expr) -> tree`` (the ``parse`` fixture of ``tests/observability``)."""

COMPARISONS = frozenset({"==", "!=", ">", "<", ">=", "<="})
SET_OPERATORS = frozenset({"and", "or", "unless"})
_DURATION = re.compile(r"(?:\d+(?:ms|[smhdwy]))+")
_LEGACY_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_VARIABLE = re.compile(r"\$\{(?P<braced>[^}]*)\}|\$(?P<plain>[A-Za-z_]\w*)")
_UNITS_MS = (
    ("y", 365 * 24 * 3_600_000),
    ("w", 7 * 24 * 3_600_000),
    ("d", 24 * 3_600_000),
    ("h", 3_600_000),
    ("m", 60_000),
    ("s", 1_000),
    ("ms", 1),
)


@dataclass(frozen=True)
class Query:
    """One PromQL expression of a dashboard target or of a rule.

    ``title`` is the panel title, or the alert / record name. ``ref_id`` is the Grafana
    target's refId ("" for rules), ``group`` the rule group ("" for panels). ``expr`` has the
    dashboard's constant variables substituted (Grafana's runtime variables stay: pass it to
    `instantiate`); ``raw_expr`` is the text as written. ``instant`` marks a Grafana instant
    query (stat and bar-gauge totals over ``$__range``).
    """

    source: Literal["panel", "alert", "record"]
    title: str
    ref_id: str
    expr: str
    raw_expr: str
    instant: bool = False
    group: str = ""


@dataclass(frozen=True)
class Matcher:
    """One label matcher of a selector: label, operator (``= != =~ !~``), unquoted value."""

    label: str
    op: str
    value: str


@dataclass(frozen=True)
class Selector:
    """A vector selector: its metric name (None for ``{...}`` without one) and matchers.

    ``matchers`` leaves out the ``__name__="metric"`` matcher Prometheus adds for a name.
    """

    metric: str | None
    matchers: tuple[Matcher, ...]

    def matcher(self, label: str) -> Matcher | None:
        """The first matcher on ``label``, if any."""
        return next((m for m in self.matchers if m.label == label), None)


# --------------------------------------------------------------------------- extraction


def _panels(panels: Sequence[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    """Every panel, including those nested in (collapsed) rows, in document order."""
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels") or [])


def dashboard_constants(dashboard: Mapping[str, Any]) -> dict[str, str]:
    """The dashboard's constant template variables (name → value).

    Constants hold fixed parts of expressions, e.g. a metric name that is still tentative, so
    that it is written once; they never depend on what the viewer selects.
    """
    constants: dict[str, str] = {}
    for variable in (dashboard.get("templating") or {}).get("list") or []:
        if variable.get("type") == "constant":
            query = variable.get("query")
            value = query.get("query") if isinstance(query, Mapping) else query
            constants[str(variable["name"])] = str(value)
    return constants


def dashboard_queries(dashboard: Mapping[str, Any]) -> list[Query]:
    """Every target ``expr`` of every panel (rows and nested panels included), in order.

    Targets without an ``expr`` are skipped. Constant variables are substituted in ``expr``.
    """
    constants = dashboard_constants(dashboard)
    return [
        Query(
            source="panel",
            title=str(panel.get("title", "")),
            ref_id=str(target.get("refId", "")),
            expr=_substitute(str(target["expr"]), constants, strict=False),
            raw_expr=str(target["expr"]),
            instant=bool(target.get("instant")) and not target.get("range"),
        )
        for panel in _panels(dashboard.get("panels") or [])
        for target in panel.get("targets") or []
        if target.get("expr")
    ]


def rule_queries(rules: Mapping[str, Any]) -> list[Query]:
    """Every alerting and recording rule ``expr`` of a Prometheus rule file, in order."""
    queries = []
    for group in rules.get("groups") or []:
        for rule in group.get("rules") or []:
            source: Literal["alert", "record"] = "alert" if "alert" in rule else "record"
            expr = str(rule.get("expr", "")).strip()
            queries.append(
                Query(
                    source=source,
                    title=str(rule.get(source, "")),
                    ref_id="",
                    expr=expr,
                    raw_expr=expr,
                    group=str(group.get("name", "")),
                )
            )
    return queries


# ------------------------------------------------------------------------- instantiation


def instantiate(
    expr: str,
    *,
    tenant_regex: str = ".*",
    namespace_regex: str = ".*",
    rate_interval: str = "1m",
    interval: str = "1m",
    time_range: str = "1h",
    variables: Mapping[str, str] | None = None,
) -> str:
    """``expr`` with Grafana's variables replaced, ready for a plain Prometheus.

    Replaces ``$tenant`` / ``${tenant}`` with ``tenant_regex`` and ``$namespace`` with
    ``namespace_regex`` (regular expressions, as Grafana's "All" gives: the dashboard sets
    ``allValue`` to ``.*``),
    ``$__rate_interval``, ``$__interval`` and ``$__range`` with the given durations, and any
    other ``$name`` / ``${name}`` from ``variables`` (e.g. `dashboard_constants`).

    A value that lands inside a quoted string is escaped for that string (backslash and the
    quote), as Grafana does for regex-formatted values: pass ``tenant_regex`` as the regular
    expression itself (``team\\.a``), not as PromQL source.

    Raises ValueError for a variable with no value (``${datasource}`` included: it belongs in
    a target's datasource, never in an expression), for ``${name:format}`` (formats are not
    supported) and for a duration argument that is not a PromQL duration. ``$1`` and ``${1}``
    (regex group references in label_replace strings) are left alone.
    """
    for name, value in (
        ("rate_interval", rate_interval),
        ("interval", interval),
        ("time_range", time_range),
    ):
        if not _DURATION.fullmatch(value):
            raise ValueError(f"{name}={value!r} is not a PromQL duration such as 1m or 1h30m")
    values = {
        "tenant": tenant_regex,
        "namespace": namespace_regex,
        "__rate_interval": rate_interval,
        "__interval": interval,
        "__range": time_range,
        **(variables or {}),
    }
    return _substitute(expr, values, strict=True)


def _escape_for(quote: str | None, value: str) -> str:
    """``value`` as it must be written inside a string opened by ``quote`` (None: outside)."""
    if quote is None:
        return value
    if quote == "`":
        if "`" in value:
            raise ValueError(f"{value!r} cannot go inside a `raw` string")
        return value
    return value.replace("\\", "\\\\").replace(quote, "\\" + quote)


def _substitute(expr: str, values: Mapping[str, str], *, strict: bool) -> str:
    """Replace Grafana variables found in ``values``; unknown ones raise when ``strict``."""
    out: list[str] = []
    quote: str | None = None
    i = 0
    while i < len(expr):
        char = expr[i]
        if quote is not None and quote != "`" and char == "\\":
            out.append(expr[i : i + 2])
            i += 2
            continue
        match = _VARIABLE.match(expr, i) if char == "$" else None
        if match is None:
            if quote is None and char in "\"'`":
                quote = char
            elif char == quote:
                quote = None
            out.append(char)
            i += 1
            continue
        out.append(_value_of(match, values, quote=quote, strict=strict, expr=expr))
        i = match.end()
    return "".join(out)


def _value_of(
    match: re.Match[str], values: Mapping[str, str], *, quote: str | None, strict: bool, expr: str
) -> str:
    """The replacement text of one Grafana variable reference (see `_substitute`)."""
    name = match.group("plain") or match.group("braced")
    if name.isdigit():  # ${1}: a regex group reference, not a Grafana variable
        return match.group(0)
    if ":" in name or "." in name:
        raise ValueError(f"{match.group(0)}: variable formats and fields are not supported")
    if name in values:
        return _escape_for(quote, values[name])
    if strict:
        raise ValueError(f"no value for Grafana variable {match.group(0)} in {expr!r}")
    return match.group(0)


# --------------------------------------------------------------- looking inside a tree


def walk(node: Node | None) -> Iterator[Node]:
    """``node`` and every node below it, parents first, children left to right."""
    if node is None:
        return
    yield node
    for key in ("expr", "param", "lhs", "rhs"):
        child = node.get(key)
        if isinstance(child, Mapping) and "type" in child:
            yield from walk(child)
    for arg in node.get("args") or []:
        yield from walk(arg)


def selectors(tree: Node) -> list[Selector]:
    """Every vector selector of `tree` (plain and inside ranges), in order."""
    found = []
    for node in walk(tree):
        if node["type"] not in {"vectorSelector", "matrixSelector"}:
            continue
        matchers = tuple(Matcher(m["name"], m["type"], m["value"]) for m in node["matchers"])
        name = node["name"] or next(
            (m.value for m in matchers if m.label == "__name__" and m.op == "="), None
        )
        own = tuple(m for m in matchers if not (m.label == "__name__" and m.value == name))
        found.append(Selector(name, own))
    return found


def metric_names(tree: Node) -> set[str]:
    """The metric names that the selectors of `tree` read."""
    return {selector.metric for selector in selectors(tree) if selector.metric}


def ranges_ms(tree: Node) -> list[int]:
    """The range of each range selector and subquery of `tree`, in milliseconds."""
    return [n["range"] for n in walk(tree) if n["type"] in {"matrixSelector", "subquery"}]


def calls(tree: Node) -> set[str]:
    """The names of the functions `tree` calls."""
    return {node["func"]["name"] for node in walk(tree) if node["type"] == "call"}


def _unwrapped(node: Node) -> Node:
    while node["type"] == "parenExpr":
        node = node["expr"]
    return node


def _is_number(node: Node) -> bool:
    """A number literal, possibly signed and parenthesised: ``0.9``, ``-1``, ``(1e3)``."""
    node = _unwrapped(node)
    while node["type"] == "unaryExpr":
        node = _unwrapped(node["expr"])
    return bool(node["type"] == "numberLiteral")


def alert_condition(tree: Node) -> Node | None:
    """The expression an alert compares with a number, e.g. ``a / b`` for ``a / b > 0.9``.

    Alerting on ``X > 0.9`` returns nothing while all is well, so a test cannot tell "no
    alert" from "no data"; querying ``X`` can. The root of `tree` (parentheses aside) must
    be a comparison (``== != > < >= <=``, with or without ``bool``) with a number literal on
    one side; the other side is returned. Comparisons associate to the left, so ``a > 0.5 >
    0.9`` gives ``a > 0.5``.

    Returns None when there is no such comparison at the root: a set operation (use
    `condition_operands`), a comparison of two vectors or with arithmetic (``a > 2 * 60``), or
    no comparison at all (``absent(x)``: its condition is the absence of data).
    """
    root = _unwrapped(tree)
    if root["type"] != "binaryExpr" or root["op"] not in COMPARISONS:
        return None
    lhs, rhs = root["lhs"], root["rhs"]
    if _is_number(rhs) and not _is_number(lhs):
        return lhs
    if _is_number(lhs) and not _is_number(rhs):
        return rhs
    return None


def _set_operands(tree: Node) -> list[Node]:
    root = _unwrapped(tree)
    if root["type"] == "binaryExpr" and root["op"] in SET_OPERATORS:
        return _set_operands(root["lhs"]) + _set_operands(root["rhs"])
    return [root]


def condition_operands(tree: Node) -> list[Node]:
    """The series an alert condition is built from: one tree per operand.

    Splits `tree` at its set operators (``and``, ``or``, ``unless``, through parentheses,
    matching clauses dropped), then takes `alert_condition` of each operand, keeping an
    operand whole when it compares with no number. So ``sum by (t) (a) > 0 unless on (t)
    sum by (t) (rate(b[5m])) > 0`` gives the trees of ``sum by (t) (a)`` and ``sum by (t)
    (rate(b[5m]))``. Each should have data whenever the system has been exercised, whether
    or not the alert fires; an operand such as ``absent(x)`` has data only when ``x`` has
    none.
    """
    return [alert_condition(part) or part for part in _set_operands(tree)]


# ---------------------------------------------------------------------------- render


def duration(ms: int) -> str:
    """A duration in milliseconds as PromQL writes it: 90000 → ``1m30s``, 0 → ``0s``."""
    if ms == 0:
        return "0s"
    sign, ms = ("-", -ms) if ms < 0 else ("", ms)
    parts = []
    for unit, size in _UNITS_MS:
        count, ms = divmod(ms, size)
        if count:
            parts.append(f"{count}{unit}")
    return sign + "".join(parts)


def _labels(names: Sequence[str]) -> str:
    return "(" + ", ".join(names) + ")"


def _name(name: str) -> str:
    """A metric or label name, quoted when it is not a classic identifier (``"gen.ai.x"``)."""
    return name if _LEGACY_NAME.fullmatch(name) else json.dumps(name)


def _selector(node: Node) -> str:
    name = node["name"]
    matchers = [
        f"{_name(m['name'])}{m['type']}{json.dumps(m['value'])}"
        for m in node["matchers"]
        if not (name and m["name"] == "__name__" and m["value"] == name)
    ]
    if name and not _LEGACY_NAME.fullmatch(name):  # a quoted name goes inside the braces
        matchers.insert(0, json.dumps(name))
        name = ""
    return name + ("{" + ", ".join(matchers) + "}" if matchers or not name else "")


def _modifiers(node: Node) -> str:
    """`` offset 5m`` and `` @ start()`` / `` @ 123.456`` of a selector or subquery."""
    text = f" offset {duration(node['offset'])}" if node["offset"] else ""
    if node.get("startOrEnd"):
        text += f" @ {node['startOrEnd']}()"
    elif node.get("timestamp") is not None:
        text += f" @ {node['timestamp'] / 1000:.3f}"
    return text


def _matching(node: Node) -> str:
    """The ``bool`` modifier and ``on``/``ignoring``/``group_*`` clauses of a binary op."""
    text = " bool" if node["bool"] else ""
    matching = node.get("matching")
    if not matching:
        return text
    if matching["on"]:
        text += f" on{_labels(matching['labels'])}"
    elif matching["labels"]:
        text += f" ignoring{_labels(matching['labels'])}"
    group = {"many-to-one": "group_left", "one-to-many": "group_right"}.get(matching["card"])
    if group:
        text += f" {group}{_labels(matching['include'])}"
    return text


def _aggregation(node: Node) -> str:
    grouping = node["grouping"]
    clause = ""
    if node["without"]:
        clause = f" without {_labels(grouping)} "
    elif grouping:
        clause = f" by {_labels(grouping)} "
    args = [render(node["param"])] if node.get("param") else []
    return f"{node['op']}{clause}({', '.join([*args, render(node['expr'])])})"


def render(node: Node) -> str:
    """`node` (a ``parse_query`` tree or part of one) as PromQL that parses back to it.

    Raises ValueError for a node type or a duration expression it does not write.
    """
    kind = node["type"]
    if node.get("rangeExpr") or node.get("offsetExpr") or node.get("stepExpr"):
        raise ValueError(f"duration expressions are not rendered: {node}")
    if kind == "vectorSelector":
        return _selector(node) + _modifiers(node)
    if kind == "matrixSelector":
        return f"{_selector(node)}[{duration(node['range'])}]{_modifiers(node)}"
    if kind == "subquery":
        step = duration(node["step"]) if node["step"] else ""
        return f"{render(node['expr'])}[{duration(node['range'])}:{step}]{_modifiers(node)}"
    if kind == "call":
        return f"{node['func']['name']}({', '.join(render(arg) for arg in node['args'])})"
    if kind == "aggregation":
        return _aggregation(node)
    if kind == "binaryExpr":
        return f"{render(node['lhs'])} {node['op']}{_matching(node)} {render(node['rhs'])}"
    if kind == "unaryExpr":
        return f"{node['op']}{render(node['expr'])}"
    if kind == "parenExpr":
        return f"({render(node['expr'])})"
    if kind == "numberLiteral":
        return str(node["val"])
    if kind == "stringLiteral":
        return json.dumps(node["val"])
    raise ValueError(f"cannot render a {kind!r} node")
