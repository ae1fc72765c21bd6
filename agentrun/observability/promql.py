"""PromQL of the dashboard and the alert rules: extract it, instantiate it, look inside it.

Pure functions, no I/O: callers load the JSON / YAML and pass the parsed mapping.

- `dashboard_queries` / `rule_queries` list every expression of a Grafana dashboard or a
  Prometheus rule file as `Query` values.
- `instantiate` turns a Grafana-templated expression (``$tenant``, ``$__rate_interval`` …)
  into PromQL that a plain Prometheus accepts, and refuses to leave a variable behind.
- `alert_condition_query` / `condition_operands` give the series behind an alert condition,
  so a test can check that they have data while the alert does not fire.
- `selectors`, `metric_names`, `ranges` and `syntax_problems` look inside an expression.

This is a lexer plus bracket matching, not a PromQL parser: it knows enough of the grammar
(strings, durations, label matchers, grouping clauses, keywords, operator precedence of the
lowest levels) for the expressions this project writes. ``promtool`` stays the authority on
syntax; `syntax_problems` is a sanity check for machines without it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "Matcher",
    "PromQLSyntaxError",
    "Query",
    "Selector",
    "Token",
    "alert_condition_query",
    "condition_operands",
    "dashboard_constants",
    "dashboard_queries",
    "instantiate",
    "lex",
    "metric_names",
    "ranges",
    "rule_queries",
    "selectors",
    "syntax_problems",
]

AGGREGATIONS = frozenset(
    {
        "avg",
        "bottomk",
        "count",
        "count_values",
        "group",
        "limit_ratio",
        "limitk",
        "max",
        "min",
        "quantile",
        "stddev",
        "stdvar",
        "sum",
        "topk",
    }
)
"""Aggregation operators (keywords: PromQL matches them case-insensitively)."""

FUNCTIONS = frozenset(
    {
        "abs",
        "absent",
        "absent_over_time",
        "acos",
        "acosh",
        "asin",
        "asinh",
        "atan",
        "atanh",
        "avg_over_time",
        "ceil",
        "changes",
        "clamp",
        "clamp_max",
        "clamp_min",
        "cos",
        "cosh",
        "count_over_time",
        "day_of_month",
        "day_of_week",
        "day_of_year",
        "days_in_month",
        "deg",
        "delta",
        "deriv",
        "double_exponential_smoothing",
        "end",
        "exp",
        "floor",
        "histogram_avg",
        "histogram_count",
        "histogram_fraction",
        "histogram_quantile",
        "histogram_stddev",
        "histogram_stdvar",
        "histogram_sum",
        "holt_winters",
        "hour",
        "idelta",
        "increase",
        "info",
        "irate",
        "label_join",
        "label_replace",
        "last_over_time",
        "ln",
        "log10",
        "log2",
        "mad_over_time",
        "max_over_time",
        "min_over_time",
        "minute",
        "month",
        "pi",
        "predict_linear",
        "present_over_time",
        "quantile_over_time",
        "rad",
        "rate",
        "resets",
        "round",
        "scalar",
        "sgn",
        "sin",
        "sinh",
        "sort",
        "sort_by_label",
        "sort_by_label_desc",
        "sort_desc",
        "sqrt",
        "start",
        "stddev_over_time",
        "stdvar_over_time",
        "sum_over_time",
        "tan",
        "tanh",
        "time",
        "timestamp",
        "vector",
        "year",
    }
)
"""PromQL functions (``start``/``end`` are the ``@`` modifier's). Used by `syntax_problems`."""

GROUPING_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
"""Keywords followed by a parenthesised list of label names (optional for group_*)."""

SET_OPERATORS = frozenset({"and", "or", "unless"})
"""Binary set operators: the lowest precedence levels of PromQL (``or`` below the others)."""

COMPARISONS = frozenset({"==", "!=", ">", "<", ">=", "<="})
"""Comparison operators: one precedence level above the set operators."""

_OTHER_KEYWORDS = frozenset({"bool", "offset", "atan2"})
_MATCH_OPERATORS = frozenset({"=", "!=", "=~", "!~"})
_OPENERS = {"(": ")", "{": "}", "[": "]"}
_CLOSERS = frozenset(_OPENERS.values())

_LEXEME = re.compile(
    r"""
      (?P<space>\s+|\#[^\n]*)
    | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|`[^`]*`)
    | (?P<variable>\$\{[^}]*\}|\$[A-Za-z_]\w*)
    | (?P<duration>(?:\d+(?:ms|[smhdwy]))+(?![\w.]))
    | (?P<number>0[xX][0-9a-fA-F]+|(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)
    | (?P<ident>[A-Za-z_][A-Za-z0-9_:]*)
    | (?P<op>==|!=|=~|!~|>=|<=|[-+*/%^<>=,(){}\[\]:@])
    """,
    re.VERBOSE,
)
_DURATION = re.compile(r"(?:\d+(?:ms|[smhdwy]))+")
_VARIABLE = re.compile(r"\$\{(?P<braced>[^}]*)\}|\$(?P<plain>[A-Za-z_]\w*)")
_VARIABLE_IN_STRING = re.compile(r"\$\{[^}0-9][^}]*\}|\$[A-Za-z_]\w*")


class PromQLSyntaxError(ValueError):
    """An expression this module cannot read (a character no PromQL token starts with)."""


@dataclass(frozen=True)
class Token:
    """One lexeme: kind is string, variable, duration, number, ident or op."""

    kind: str
    text: str
    start: int
    end: int


@dataclass(frozen=True)
class Matcher:
    """One label matcher of a selector, with the string value unquoted."""

    label: str
    op: str
    value: str


@dataclass(frozen=True)
class Selector:
    """A vector selector: its metric name (None for ``{...}`` without one) and matchers."""

    metric: str | None
    matchers: tuple[Matcher, ...]

    def matcher(self, label: str) -> Matcher | None:
        """The first matcher on ``label``, if any."""
        return next((m for m in self.matchers if m.label == label), None)


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
    queries = []
    for panel in _panels(dashboard.get("panels") or []):
        for target in panel.get("targets") or []:
            raw = target.get("expr")
            if not raw:
                continue
            queries.append(
                Query(
                    source="panel",
                    title=str(panel.get("title", "")),
                    ref_id=str(target.get("refId", "")),
                    expr=_substitute(str(raw), constants, strict=False),
                    raw_expr=str(raw),
                    instant=bool(target.get("instant")) and not target.get("range"),
                )
            )
    return queries


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
    rate_interval: str = "1m",
    interval: str = "1m",
    time_range: str = "1h",
    variables: Mapping[str, str] | None = None,
) -> str:
    """``expr`` with Grafana's variables replaced, ready for a plain Prometheus.

    Replaces ``$tenant`` / ``${tenant}`` with ``tenant_regex`` (a regular expression, as
    Grafana's multi-value "All" gives: the dashboard sets ``allValue`` to ``.*``),
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
        name = match.group("plain") or match.group("braced")
        if name.isdigit():  # ${1}: a regex group reference, not a Grafana variable
            out.append(match.group(0))
        elif ":" in name or "." in name:
            raise ValueError(f"{match.group(0)}: variable formats and fields are not supported")
        elif name in values:
            out.append(_escape_for(quote, values[name]))
        elif strict:
            raise ValueError(f"no value for Grafana variable {match.group(0)} in {expr!r}")
        else:
            out.append(match.group(0))
        i = match.end()
    return "".join(out)


# ----------------------------------------------------------------------------- lexing


def lex(expr: str) -> list[Token]:
    """The tokens of ``expr`` (spaces and ``#`` comments dropped).

    ``Inf`` and ``NaN`` (any case) are numbers; Grafana variables outside strings are
    ``variable`` tokens. Raises `PromQLSyntaxError` at a character no token starts with.
    """
    tokens = []
    position = 0
    while position < len(expr):
        match = _LEXEME.match(expr, position)
        if match is None:
            raise PromQLSyntaxError(f"unexpected {expr[position]!r} at {position} in {expr!r}")
        kind = match.lastgroup or ""
        text = match.group(0)
        if kind == "ident" and text.lower() in {"inf", "nan"}:
            kind = "number"
        if kind != "space":
            tokens.append(Token(kind, text, match.start(), match.end()))
        position = match.end()
    return tokens


def _depths(tokens: Sequence[Token]) -> list[int]:
    """Bracket nesting of each token; an opener or closer has the depth around it."""
    depth = 0
    depths = []
    for token in tokens:
        if token.kind == "op" and token.text in _CLOSERS:
            depth -= 1
        depths.append(depth)
        if token.kind == "op" and token.text in _OPENERS:
            depth += 1
    return depths


def _closing(tokens: Sequence[Token], opener: int) -> int:
    """Index of the token closing the bracket at ``opener`` (len(tokens) if unclosed)."""
    depth = 0
    for index in range(opener, len(tokens)):
        token = tokens[index]
        if token.kind == "op" and token.text in _OPENERS:
            depth += 1
        elif token.kind == "op" and token.text in _CLOSERS:
            depth -= 1
            if depth == 0:
                return index
    return len(tokens)


def _is(token: Token | None, text: str) -> bool:
    return token is not None and token.kind == "op" and token.text == text


def _at(tokens: Sequence[Token], index: int) -> Token | None:
    return tokens[index] if 0 <= index < len(tokens) else None


def _unquote(literal: str) -> str:
    """The value of a PromQL string literal (Go escapes; unknown escapes kept as written)."""
    if literal.startswith("`"):
        return literal[1:-1]
    body = literal[1:-1]
    simple = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'"}
    out = []
    i = 0
    while i < len(body):
        if body[i] == "\\" and i + 1 < len(body):
            out.append(simple.get(body[i + 1], body[i : i + 2]))
            i += 2
        else:
            out.append(body[i])
            i += 1
    return "".join(out)


# -------------------------------------------------------------------------- inspection


def _matchers(tokens: Sequence[Token]) -> tuple[str | None, tuple[Matcher, ...]]:
    """The metric name given inside braces (``{"name"}``) and the matchers of a ``{...}``."""
    name: str | None = None
    found = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        op, value = _at(tokens, index + 1), _at(tokens, index + 2)
        if (
            token.kind in {"ident", "string"}
            and op is not None
            and op.text in _MATCH_OPERATORS
            and value is not None
            and value.kind == "string"
        ):
            label = _unquote(token.text) if token.kind == "string" else token.text
            found.append(Matcher(label, op.text, _unquote(value.text)))
            index += 3
        elif token.kind == "string":
            name = _unquote(token.text)
            index += 1
        else:
            index += 1
    name_matcher = next((m for m in found if m.label == "__name__" and m.op == "="), None)
    return name or (name_matcher.value if name_matcher else None), tuple(found)


def selectors(expr: str) -> list[Selector]:
    """Every vector selector of ``expr`` in order, e.g. ``rate(a{x="1"}[5m]) / b`` → a, b.

    Identifiers that are functions, aggregations, keywords or label names of grouping
    clauses are not selectors. Grafana variables are skipped, so a templated expression can
    be read before `instantiate`.
    """
    tokens = lex(expr)
    found = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        after = _at(tokens, index + 1)
        if token.kind == "ident":
            word = token.text.lower()
            if word in GROUPING_KEYWORDS:
                index = _closing(tokens, index + 1) + 1 if _is(after, "(") else index + 1
                continue
            if (
                word in SET_OPERATORS
                or word in _OTHER_KEYWORDS
                or word in AGGREGATIONS  # keywords: `sum by (x) (...)` has no "(" after sum
                or _is(after, "(")
            ):
                index += 1
                continue
            if _is(after, "{"):
                end = _closing(tokens, index + 1)
                found.append(Selector(token.text, _matchers(tokens[index + 2 : end])[1]))
                index = end + 1
                continue
            found.append(Selector(token.text, ()))
        elif _is(token, "{"):
            end = _closing(tokens, index)
            name, matchers = _matchers(tokens[index + 1 : end])
            found.append(Selector(name, matchers))
            index = end + 1
            continue
        index += 1
    return found


def metric_names(expr: str) -> set[str]:
    """The metric names that the selectors of ``expr`` read."""
    return {selector.metric for selector in selectors(expr) if selector.metric}


def ranges(expr: str) -> list[str]:
    """The text inside each ``[...]`` of ``expr`` (range selectors and subqueries)."""
    tokens = lex(expr)
    found = []
    for index, token in enumerate(tokens):
        if _is(token, "["):
            end = _closing(tokens, index)
            if end < len(tokens):
                found.append(expr[token.end : tokens[end].start].strip())
    return found


def _bracket_problems(tokens: Sequence[Token]) -> list[str]:
    problems = []
    stack: list[Token] = []
    for token in tokens:
        if token.kind != "op":
            continue
        if token.text in _OPENERS:
            stack.append(token)
        elif token.text in _CLOSERS:
            if not stack or _OPENERS[stack[-1].text] != token.text:
                problems.append(f"unmatched {token.text!r} at {token.start}")
                return problems
            stack.pop()
    problems.extend(f"unclosed {token.text!r} at {token.start}" for token in stack)
    return problems


def _range_problem(inside: Sequence[Token]) -> str | None:
    texts = [(t.kind, t.text) for t in inside]
    kinds = [kind if kind != "op" else text for kind, text in texts]
    if kinds in (["duration"], ["duration", ":"], ["duration", ":", "duration"]):
        return None
    return f"[{' '.join(t.text for t in inside)}] is not a range or subquery duration"


def _matcher_problem(inside: Sequence[Token]) -> str | None:
    index = 0
    while index < len(inside):
        token, op, value = inside[index], _at(inside, index + 1), _at(inside, index + 2)
        if token.kind == "string" and (op is None or _is(op, ",")):
            index += 2  # {"metric.name", ...}
            continue
        if not (
            token.kind in {"ident", "string"}
            and op is not None
            and op.text in _MATCH_OPERATORS
            and value is not None
            and value.kind == "string"
        ):
            return f"bad label matcher at {token.start}: {token.text!r}"
        follower = _at(inside, index + 3)
        if follower is not None and not _is(follower, ","):
            return f"expected ',' or '}}' at {follower.start}"
        index += 4
    return None


def _call_problem(token: Token, tokens: Sequence[Token], index: int) -> str | None:
    word = token.text.lower()
    if word in GROUPING_KEYWORDS or word in SET_OPERATORS or word in _OTHER_KEYWORDS:
        return None
    if word in AGGREGATIONS or token.text in FUNCTIONS:
        return None
    if _is(_at(tokens, index + 1), "("):
        return f"unknown function {token.text!r} at {token.start}"
    return None


def syntax_problems(expr: str) -> list[str]:
    """What is visibly wrong with ``expr`` as plain PromQL ([] when nothing is found).

    Checks: it lexes; no Grafana variable is left (outside or inside strings; ``$1`` is
    fine); brackets nest; ``[...]`` holds a duration or a subquery ``d:`` / ``d:d``; ``{...}``
    holds comma-separated ``label op "value"`` matchers; every call is a known function or
    aggregation; the expression neither starts nor ends with a binary operator. It does not
    check operand types, operator adjacency or argument counts: promtool does.
    """
    if not expr.strip():
        return ["empty expression"]
    try:
        tokens = lex(expr)
    except PromQLSyntaxError as error:
        return [str(error)]
    problems = [f"Grafana variable {t.text} left" for t in tokens if t.kind == "variable"]
    problems += [
        f"Grafana variable {m.group(0)} left in string {t.text}"
        for t in tokens
        if t.kind == "string" and not t.text.startswith("`")
        for m in _VARIABLE_IN_STRING.finditer(t.text)
    ]
    brackets = _bracket_problems(tokens)
    if brackets:
        return problems + brackets
    for index, token in enumerate(tokens):
        if _is(token, "[") or _is(token, "{"):
            inside = tokens[index + 1 : _closing(tokens, index)]
            check = _range_problem if token.text == "[" else _matcher_problem
            problem = check(inside)
        elif token.kind == "ident":
            problem = _call_problem(token, tokens, index)
        else:
            problem = None
        if problem:
            problems.append(problem)
    first, last = tokens[0], tokens[-1]
    binary = {"*", "/", "%", "^", "==", "!=", ">", "<", ">=", "<=", "=", "=~", "!~", ","}
    if first.kind == "op" and first.text in binary:
        problems.append(f"starts with operator {first.text!r}")
    if (last.kind == "op" and last.text in binary | {"+", "-"}) or (
        last.kind == "ident" and last.text.lower() in SET_OPERATORS | {"bool", "offset"}
    ):
        problems.append(f"ends with {last.text!r}")
    return problems


# ------------------------------------------------------------------- alert conditions


def _strip_parens(tokens: Sequence[Token]) -> Sequence[Token]:
    """``tokens`` without parentheses that wrap all of them (repeatedly)."""
    while len(tokens) >= 2 and _is(tokens[0], "(") and _closing(tokens, 0) == len(tokens) - 1:
        tokens = tokens[1:-1]
    return tokens


def _is_scalar_literal(tokens: Sequence[Token]) -> bool:
    """A number literal, optionally signed and parenthesised: ``0.9``, ``-1``, ``(1e3)``."""
    tokens = _strip_parens(tokens)
    while tokens and tokens[0].kind == "op" and tokens[0].text in "+-":
        tokens = _strip_parens(tokens[1:])
    return len(tokens) == 1 and tokens[0].kind == "number"


def _top_level(tokens: Sequence[Token]) -> list[int]:
    return [index for index, depth in enumerate(_depths(tokens)) if depth == 0]


def _text(expr: str, tokens: Sequence[Token]) -> str:
    return expr[tokens[0].start : tokens[-1].end] if tokens else ""


def _condition_tokens(tokens: Sequence[Token]) -> Sequence[Token] | None:
    top = _top_level(tokens)
    if any(tokens[i].kind == "ident" and tokens[i].text.lower() in SET_OPERATORS for i in top):
        return None  # the root is a set operation, not a comparison
    comparisons = [i for i in top if tokens[i].kind == "op" and tokens[i].text in COMPARISONS]
    if not comparisons:
        return None
    last = comparisons[-1]
    right = tokens[last + 1 :]
    if right and right[0].kind == "ident" and right[0].text.lower() == "bool":
        right = right[1:]
    if _is_scalar_literal(right) and last > 0:
        return tokens[:last]
    first = comparisons[0]
    if len(comparisons) == 1 and _is_scalar_literal(tokens[:first]):
        right = tokens[first + 1 :]
        if right and right[0].kind == "ident" and right[0].text.lower() == "bool":
            right = right[1:]
        return right or None
    return None


def alert_condition_query(expr: str) -> str | None:
    """The expression an alert compares with a scalar, e.g. ``a / b`` for ``a / b > 0.9``.

    Alerting on ``X > 0.9`` returns nothing while all is well, so a test cannot tell "no
    alert" from "no data"; querying ``X`` can. The root of ``expr`` must be a comparison
    (``== != > < >= <=``, with or without ``bool``) whose right-hand side is a number
    literal (signed or parenthesised allowed); the left-hand side is returned as written.
    ``0.9 < X`` (a single comparison with the number on the left) gives ``X``.
    ``a > 0.5 > 0.9`` gives ``a > 0.5``: comparisons associate to the left.

    Returns None when there is no such comparison at the root: a set operation (``a > 0 and
    b == 0``: use `condition_operands`), a comparison with a vector or with arithmetic
    (``a > 2 * 60``), or no comparison at all (``absent(x)``, whose condition is the absence
    of data and so has no series to check).
    """
    tokens = lex(expr)
    condition = _condition_tokens(_strip_parens(tokens))
    return _text(expr, condition) if condition else None


def _split_set_operations(tokens: Sequence[Token]) -> list[Sequence[Token]]:
    """Operands of the top-level ``and`` / ``or`` / ``unless`` (matching clauses dropped)."""
    tokens = _strip_parens(tokens)
    top = set(_top_level(tokens))
    parts: list[Sequence[Token]] = []
    start = 0
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if index in top and token.kind == "ident" and token.text.lower() in SET_OPERATORS:
            parts.append(tokens[start:index])
            index += 1
            while (
                index < len(tokens)
                and tokens[index].kind == "ident"
                and tokens[index].text.lower() in GROUPING_KEYWORDS
            ):
                index += 1
                if _is(_at(tokens, index), "("):
                    index = _closing(tokens, index) + 1
            start = index
            continue
        index += 1
    parts.append(tokens[start:])
    if len(parts) == 1:
        return parts
    return [leaf for part in parts for leaf in _split_set_operations(part)]


def condition_operands(expr: str) -> list[str]:
    """The series an alert condition is built from: one expression per operand.

    Splits ``expr`` at its top-level set operators (``and``, ``or``, ``unless``, recursing
    into parenthesised operands and dropping ``on(...)`` / ``ignoring(...)``), then applies
    `alert_condition_query` to each operand, keeping an operand as written when it has no
    comparison with a number. So ``sum by (t) (a) > 0 unless on (t) sum by (t) (rate(b[5m]))
    > 0`` gives ``["sum by (t) (a)", "sum by (t) (rate(b[5m]))"]``; ``a > 0.9`` gives
    ``["a"]``. Each result should have data whenever the system has been exercised, whether
    or not the alert fires. Limits are those of `alert_condition_query`; an operand such as
    ``absent(x)`` comes back unchanged and has data only when ``x`` has none.
    """
    operands = []
    for part in _split_set_operations(lex(expr)):
        if not part:
            continue
        text = _text(expr, part)
        operands.append(alert_condition_query(text) or text)
    return operands
