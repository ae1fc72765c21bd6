"""Users' and tool servers' schemas and patterns run in bounded time (agentrun.kernel.schemas):
RE2 for every pattern, a deterministic work budget for every validation, no remote $ref."""

from __future__ import annotations

import http.server
import json
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest

from agentrun import kernel
from agentrun.kernel import output, schemas

HOSTILE = "^(a+)+$"
"""Catastrophic on a backtracking engine: Python's re takes seconds at 30 characters."""
ANSWER = "a" * 100_000 + "!"


def _messages(schema: Any, instance: Any) -> list[str]:
    return [e.message for e in schemas.errors(schemas.validator_for(schema), instance)]


CPU_LIMIT = 30.0
"""CPU seconds any test here may use: a validation that lost its bounds (an exponential
schema, a hostile pattern on a backtracking engine) fails the test at this limit instead of
running for hours (``make mutate`` counts such a change as caught within its timeout)."""


@pytest.fixture(autouse=True)
def _cpu_limit() -> Iterator[None]:
    def stop(signum: int, frame: object) -> None:
        raise AssertionError(f"the test used more than {CPU_LIMIT} s of CPU")

    previous = signal.signal(signal.SIGPROF, stop)
    signal.setitimer(signal.ITIMER_PROF, CPU_LIMIT)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


def _quick(seconds: float = 1.0) -> Any:
    """A context that fails when its block takes more CPU than ``seconds``."""

    class Quick:
        def __enter__(self) -> None:
            self.start = time.process_time()

        def __exit__(self, *exc: object) -> None:
            used = time.process_time() - self.start
            assert used < seconds, f"took {used:.2f} s of CPU"

    return Quick()


# --- patterns on RE2 ------------------------------------------------------------------------

HOSTILE_SCHEMAS = {
    "pattern": ({"properties": {"x": {"pattern": HOSTILE}}}, {"x": ANSWER}),
    "patternProperties": ({"patternProperties": {HOSTILE: {"type": "integer"}}}, {ANSWER: "1"}),
    "additionalProperties": (
        {"patternProperties": {HOSTILE: {}}, "additionalProperties": False},
        {ANSWER: 1},
    ),
    "unevaluatedProperties": (
        {"allOf": [{"patternProperties": {HOSTILE: {}}}], "unevaluatedProperties": False},
        {ANSWER: 1},
    ),
    "propertyNames": ({"propertyNames": {"pattern": HOSTILE}}, {ANSWER: 1}),
    "draft-07": (
        {"$schema": "http://json-schema.org/draft-07/schema#", "pattern": HOSTILE},
        ANSWER,
    ),
    "draft 2019-09 unevaluated": (
        {
            "$schema": "https://json-schema.org/draft/2019-09/schema",
            "patternProperties": {HOSTILE: {}},
            "unevaluatedProperties": False,
        },
        {ANSWER: 1},
    ),
    # a subschema naming its dialect ($schema) is still checked on RE2: jsonschema's evolve
    # once took the draft's own class there (seconds at 24 characters, behind one $ref)
    "$ref to a root naming its dialect": (
        {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "properties": {"x": {"$ref": "#"}},
            "pattern": HOSTILE,
        },
        {"x": ANSWER},
    ),
    "$recursiveRef (2019-09)": (
        {
            "$schema": "https://json-schema.org/draft/2019-09/schema",
            "$recursiveAnchor": True,
            "properties": {"x": {"$recursiveRef": "#"}},
            "pattern": HOSTILE,
        },
        {"x": ANSWER},
    ),
    "an embedded draft-07 resource": (
        {
            "$defs": {
                "d7": {
                    "$id": "https://example.com/d7",
                    "$schema": "http://json-schema.org/draft-07/schema#",
                    "pattern": HOSTILE,
                }
            },
            "properties": {"x": {"$ref": "https://example.com/d7"}},
        },
        {"x": ANSWER},
    ),
}


VALID_THOUGH_HOSTILE = {"patternProperties"}
"""The key does not match, so nothing is checked: valid, however long re would take."""


@pytest.mark.parametrize("schema, instance", HOSTILE_SCHEMAS.values(), ids=HOSTILE_SCHEMAS)
def test_a_catastrophic_pattern_is_decided_in_linear_time(
    schema: Any, instance: Any, request: pytest.FixtureRequest
) -> None:
    with _quick():
        found = _messages(schema, instance)
    valid = request.node.callspec.id in VALID_THOUGH_HOSTILE
    assert (found == []) is valid


def test_patterns_match_as_json_schema_says() -> None:
    schema = {"properties": {"code": {"pattern": "^[A-Z]{3}-\\d+$"}}}
    assert _messages(schema, {"code": "ABC-12"}) == []
    assert _messages(schema, {"code": "abc-12"}) == ["'abc-12' does not match '^[A-Z]{3}-\\\\d+$'"]
    assert _messages({"pattern": "b"}, "abc") == []  # a search, not a full match


REFUSED = {
    "backreference": ("(a)\\1", "invalid escape sequence"),
    "lookahead": ("(?=a)b", "invalid perl operator"),
    "negative lookbehind": ("(?<!a)b", "invalid perl operator"),
    "not a regex": ("[a-", "missing ]"),
    "too large": ("((a{100}){100}){100}", "repetition"),
    "too long": ("a" * (schemas.MAX_PATTERN_CHARS + 1), "longer than"),
}


@pytest.mark.parametrize("pattern, why", REFUSED.values(), ids=REFUSED)
def test_patterns_the_linear_engine_refuses_are_named(pattern: str, why: str) -> None:
    problem = schemas.pattern_problem(pattern)
    assert problem is not None and why in problem
    nested = {"properties": {"a/b": {"items": {"pattern": pattern}}}}
    problem = schemas.schema_problem(nested)
    assert problem is not None and problem.startswith("at /properties/a~1b/items/pattern: ")
    keyed = {"$defs": {"x": {"patternProperties": {pattern: {}}}}}
    problem = schemas.schema_problem(keyed)
    assert problem is not None and problem.startswith("at /$defs/x/patternProperties/")


def test_a_refused_pattern_that_reaches_validation_is_an_error_not_a_crash() -> None:
    """Admission refuses such a schema; one that reaches a validation anyway (a tool server's
    schema changed under a cached offer) fails it with the admission's own words."""
    refusal = (
        "'(?=a)' is not a regular expression the linear-time engine accepts (RE2 syntax: no "
        "backreferences or lookaround): invalid perl operator: (?="
    )
    assert _messages({"pattern": "(?=a)"}, "a") == [refusal]
    assert _messages({"patternProperties": {"(?=a)": {}, "^b": {}}}, {"a": 1}) == [refusal]


def test_errors_under_pattern_properties_name_their_places_as_jsonschema_does() -> None:
    schema = {"patternProperties": {"^a": {"type": "integer"}, "b$": {"minimum": 3}}}
    instance = {"ab": "x", "b": 1}
    ours = schemas.errors(schemas.validator_for(schema), instance)
    stock = jsonschema.Draft202012Validator(schema).iter_errors(instance)
    assert (
        sorted((list(e.absolute_path), list(e.absolute_schema_path)) for e in ours)
        == sorted((list(e.absolute_path), list(e.absolute_schema_path)) for e in stock)
        == [
            (["ab"], ["patternProperties", "^a", "type"]),
            (["b"], ["patternProperties", "b$", "minimum"]),
        ]
    )


@pytest.mark.parametrize(
    ("schema", "answer", "message"),
    [
        pytest.param(
            {"type": "string", "pattern": "^a"},
            '"\\ud800"',
            "(root): '\\ud800' does not match '^a'",
            id="pattern",
        ),
        pytest.param(
            {"propertyNames": {"pattern": "^a"}},
            '{"\\ud800x": 1}',
            "(root): '\\ud800x' does not match '^a'",
            id="property-names",
        ),
        pytest.param(
            {"patternProperties": {"^a": {}}, "additionalProperties": False},
            '{"\\ud800x": 1}',
            "(root): '\\ud800x' does not match any of the regexes: '^a'",
            id="pattern-properties",
        ),
        # one U+FFFD for each byte of its UTF-8 form, as decision.clean_text repairs it
        pytest.param(
            {"type": "string", "pattern": "^\ufffd{3}$"}, '"\\udc00"', None, id="repaired"
        ),
    ],
)
def test_half_a_surrogate_pair_in_an_answer_is_matched_repaired_not_a_crash(
    schema: dict[str, Any], answer: str, message: str | None
) -> None:
    """A model's JSON may escape half a surrogate pair (ASCII text, valid JSON): parsed, it is a
    string UTF-8 cannot encode, and RE2 raised UnicodeEncodeError out of the check — a turn's
    output check, an AgentEval's grading (the suite given up for it)."""
    assert output.output_error(answer, schema) == message


def test_data_that_looks_like_a_pattern_is_not_checked() -> None:
    schema = {"enum": [{"pattern": "(?=x)"}], "const": {"pattern": "(a)\\1"}, "default": {}}
    assert schemas.schema_problem(schema) is None
    assert schemas.schema_problem({"examples": [{"patternProperties": {"(?=x)": 1}}]}) is None


# --- admission checks -----------------------------------------------------------------------


def _deep(levels: int, *, beside: dict[str, Any] | None = None) -> dict[str, Any]:
    """A schema ``levels`` objects deep (``{}`` is one), ``beside`` merged into its top."""
    deep: dict[str, Any] = {}
    for _ in range(levels - 1):
        deep = {"items": deep}
    return deep | (beside or {})


def test_a_schema_at_the_limits_is_accepted_one_past_them_refused() -> None:
    """Size and depth are limits, not bounds past them: exactly ``MAX_SCHEMA_BYTES`` and
    ``MAX_SCHEMA_DEPTH`` pass; the depth reported is where the count stopped."""
    padding = schemas.MAX_SCHEMA_BYTES - len('{"description":""}')
    assert schemas.schema_problem({"description": "x" * padding}) is None
    assert schemas.schema_problem({"description": "x" * (padding + 1)}) == (
        f"{schemas.MAX_SCHEMA_BYTES + 1} bytes as JSON, over the 65536-byte limit"
    )
    assert schemas.schema_problem({"description": "é" * (padding // 2)}) is None  # bytes, UTF-8
    assert schemas.schema_problem(_deep(32)) is None
    assert schemas.schema_problem(_deep(33)) == "nested 33 levels deep, over the limit of 32"
    assert schemas.schema_problem(_deep(40)) == "nested 33 levels deep, over the limit of 32"
    # a scalar met on the way does not end the search for deeper values
    assert schemas.schema_problem(_deep(33, beside={"title": "t"})) == (
        "nested 33 levels deep, over the limit of 32"
    )
    assert schemas.schema_problem({"allOf": [True, _deep(33)]}) is not None


PLACES = {
    "array item": ({"allOf": [{}, {"pattern": "(?=a)"}]}, "/allOf/1/pattern"),
    "after data": ({"const": {"x": 1}, "properties": {"x": {"pattern": "(?=a)"}}},
                   "/properties/x/pattern"),
    "patternProperties key": ({"patternProperties": {"a/(?=b)~": {}}},
                              "/patternProperties/a~1(?=b)~0"),
    "inside a patternProperties value": ({"patternProperties": {"^a": {"pattern": "(?=a)"}}},
                                         "/patternProperties/^a/pattern"),
}  # fmt: skip
"""A refused pattern's place in the schema (a JSON Pointer: ``~`` as ``~0``, ``/`` as ``~1``)."""


@pytest.mark.parametrize("schema, where", PLACES.values(), ids=PLACES)
def test_a_refused_pattern_is_named_by_its_place_in_the_schema(schema: Any, where: str) -> None:
    problem = schemas.schema_problem(schema)
    assert problem is not None and problem.startswith(f"at {where}: "), problem


def test_only_patterns_are_compiled_not_other_text_or_property_names() -> None:
    assert schemas.schema_problem({"description": "(?=a) is lookahead"}) is None
    assert schemas.schema_problem({"title": "(a)\\1"}) is None
    assert schemas.schema_problem({"properties": {"(?=a)": {"type": "string"}}}) is None
    assert schemas.schema_problem({"pattern": 3}) is not None  # the meta-schema's type rule


def test_a_refused_pattern_is_shown_whole_up_to_80_characters() -> None:
    exact = "(?=a)" + "b" * 75
    assert schemas.pattern_problem(exact) == (
        f"{exact!r} is not a regular expression the linear-time engine accepts (RE2 syntax: "
        "no backreferences or lookaround): invalid perl operator: (?="
    )
    longer = exact + "c"
    assert schemas.pattern_problem(longer) == (
        f"{exact[:79] + '…'!r} is not a regular expression the linear-time engine accepts "
        "(RE2 syntax: no backreferences or lookaround): invalid perl operator: (?="
    )


def test_re2_is_given_a_memory_bound_and_writes_nothing_to_stderr(
    capfd: pytest.CaptureFixture[str],
) -> None:
    options = schemas._options()
    assert options.max_mem == schemas.PATTERN_MEMORY and options.log_errors is False
    # \pL{200} compiles within RE2's default 8 MiB, not within PATTERN_MEMORY
    assert "pattern too large" in str(schemas.pattern_problem("\\pL{200}"))
    assert schemas.pattern_problem("[a-z]{1000}") is None
    capfd.readouterr()
    assert schemas.pattern_problem("(?=stderr)") is not None
    assert capfd.readouterr().err == ""


def test_schema_problems_name_size_depth_and_the_meta_schema() -> None:
    big = {"description": "x" * schemas.MAX_SCHEMA_BYTES}
    assert "over the 65536-byte limit" in str(schemas.schema_problem(big))
    deep: dict[str, Any] = {}
    for _ in range(schemas.MAX_SCHEMA_DEPTH + 5):
        deep = {"items": deep}
    assert "levels deep" in str(schemas.schema_problem(deep))
    assert schemas.schema_problem({"type": "nope"}) == (
        "at $.type: 'nope' is not valid under any of the given schemas"
    )
    assert schemas.schema_problem(["not", "a schema"]) == ("must be a JSON Schema object, not list")
    assert schemas.schema_problem({"type": "object", "properties": {"a": {}}}) is None
    assert schemas.schema_problem(True) is None


def test_a_draft_07_tool_schema_is_checked_against_its_own_draft() -> None:
    draft7 = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"a": {"type": "string", "pattern": "^x"}},
        "definitions": {"b": {"type": "integer"}},
    }
    assert schemas.schema_problem(draft7) is None
    assert schemas.schema_problem({**draft7, "required": "a"}) is not None


# --- the work budget ------------------------------------------------------------------------


def _exponential() -> tuple[dict[str, Any], Any]:
    """``anyOf`` whose branches re-validate the same nested array: 2^depth on jsonschema."""
    branch = {"type": "array", "items": {"$ref": "#/$defs/n"}}
    schema = {"$defs": {"n": {"anyOf": [branch, branch, {"type": "integer"}]}}, "$ref": "#/$defs/n"}
    return schema, _nested(25)


def _nested(depth: int) -> Any:
    document: Any = 1
    for _ in range(depth):
        document = [document, "x"]
    return document


def _exponential_to_root(draft: str, ref: str) -> dict[str, Any]:
    """As ``_exponential``, each branch referring back to a root that names its dialect."""
    branch = {"type": "array", "items": {ref: "#"}}
    schema = {"$schema": draft, "anyOf": [branch, branch, {"type": "integer"}]}
    return schema | ({"$recursiveAnchor": True} if ref == "$recursiveRef" else {})


EXPONENTIAL = {
    "$ref to $defs": _exponential()[0],
    "$ref to a root naming 2020-12": _exponential_to_root(
        "https://json-schema.org/draft/2020-12/schema", "$ref"
    ),
    "$ref to a root naming draft-07": _exponential_to_root(
        "http://json-schema.org/draft-07/schema#", "$ref"
    ),
    "$recursiveRef (2019-09)": _exponential_to_root(
        "https://json-schema.org/draft/2019-09/schema", "$recursiveRef"
    ),
}
"""Every shape of exponential validation: before subschemas naming their dialect kept the
count, the three to a root ran for minutes (at a depth of 18) without giving up."""


@pytest.mark.parametrize("schema", EXPONENTIAL.values(), ids=EXPONENTIAL)
def test_a_validation_past_its_work_budget_gives_up_in_bounded_cpu(schema: Any) -> None:
    validator = schemas.validator_for(schema)
    assert schemas.schema_problem(schema) is None
    with _quick(5.0), pytest.raises(schemas.WorkExceeded, match="more than 200000 steps"):
        schemas.errors(validator, _nested(25))


def test_errors_quoting_a_large_answer_count_their_text() -> None:
    """jsonschema quotes the instance in each error it makes: ``anyOf`` over a ``$ref`` to
    another ``anyOf`` (13 KB, valid) made 90,000 errors quoting a 120 KB answer before the
    budget's end, 205 s of CPU; their text counts now, and the check gives up in about 0.6 s."""
    inner = {"anyOf": [{"type": "string"}] * 300}
    schema = {"$defs": {"a": inner}, "anyOf": [{"$ref": "#/$defs/a"}] * 300}
    assert schemas.schema_problem(schema) is None
    answer = "[" + ",".join(["1"] * 60_000) + "]"
    with _quick(5.0):
        found = output.output_error(answer, schema)
    assert found == (
        "the answer could not be checked against the schema: the check took more than 200000 steps"
    )


STEPS = [
    # (schema, instance, steps): one a keyword applied, ERROR_STEPS (3) an error per level it
    # crosses, REF_STEPS (16) a reference, 1 + len // TEXT_STEP (4,096) a pattern's search or
    # an item uniqueItems hashes, 1 a schema unevaluatedProperties looks into
    ({"type": "string"}, "x", 1),
    ({"type": "string"}, 1, 1 + 3),
    ({"properties": {"a": {"type": "string"}}}, {"a": 1}, 1 + 1 + 3 + 3),
    ({"pattern": "^a"}, "a" * 4_095, 1 + 1),
    ({"pattern": "^a"}, "a" * 8_191, 1 + 2),
    ({"pattern": "^a"}, "a" * 8_192, 1 + 3),
    ({"$ref": "#/$defs/s", "$defs": {"s": {"type": "string"}}}, "x", 16 + 1),
    ({"$ref": "#/$defs/s", "$defs": {"s": {"type": "string"}}}, 1, 16 + 1 + 3 + 3),
    ({"$ref": "#/nowhere"}, 1, 16),
    ({"uniqueItems": True}, [1, 2], 1 + 1 + 1),
    ({"uniqueItems": True}, [1, 1], 1 + 1 + 1 + 3),
    ({"uniqueItems": True}, ["x" * 8_192, "y"], 1 + 3 + 1),
    ({"anyOf": [{"type": "string"}, {"type": "integer"}]}, None, 1 + (1 + 3) * 2 + 3),
    # an error's message counts a step per MESSAGE_STEP (128) characters where it is made,
    # not again at each level it crosses: "[1, 1, …, 1] is not of type 'string'" is 323
    ({"type": "string"}, [1] * 100, 1 + 3 + 2),
    ({"items": {"type": "string"}}, [[1] * 100], 1 + (1 + 3 + 2) + 3),
    ({"patternProperties": {"^a": {"type": "integer"}}}, {"ab": 1, "b": 2}, 1 + 2 + 1),
    (
        {"patternProperties": {"^a": {}}, "additionalProperties": False},
        {"ab": 1, "b": 2},
        (1 + 2) + (1 + 2 + 3),
    ),
    ({"additionalProperties": {"type": "string"}}, {"a": 1}, 1 + 1 + 3 + 3),
    ({"properties": {"a": {}}, "unevaluatedProperties": False}, {"a": 1}, 1 + 1 + 1),
    ({"properties": {"a": {}}, "unevaluatedProperties": False}, {"a": 1, "b": 2}, 1 + 1 + 1 + 3),
    (
        {"unevaluatedProperties": {"type": "integer"}},
        {"a": 1, "b": "x"},
        # the keyword, the root looked into, both values checked as it looks, "b" checked
        # again (its error not passed up), the keyword's error
        1 + 1 + (1 + 1 + 3) + (1 + 3) + 3,
    ),
    (
        {"allOf": [{"properties": {"a": {}}}], "unevaluatedProperties": False},
        {"a": 1},
        (1 + 1) + 1 + 1 + 1 + 1,  # allOf, its properties; the keyword, the root, the branch
    ),  # checked again as it is looked into, and the branch's own look
    (
        {
            "$schema": "https://json-schema.org/draft/2019-09/schema",
            "$recursiveAnchor": True,
            "type": "object",
            "additionalProperties": {"$recursiveRef": "#"},
        },
        {"a": {}},
        1 + 1 + 16 + 1 + 1,  # the root's type and additionalProperties, once more for "a"
    ),
]


@pytest.mark.parametrize("schema, instance, steps", STEPS, ids=range(len(STEPS)))
def test_a_validation_counts_the_steps_the_module_documents(
    schema: Any, instance: Any, steps: int
) -> None:
    """The counts are part of what a run decides (a replayed turn must give up where the
    worker that committed it did), so each is pinned: ``steps`` fit the limit, one fewer not."""
    validator = schemas.validator_for(schema)
    schemas.errors(validator, instance, limit=steps)
    with pytest.raises(schemas.WorkExceeded, match=f"more than {steps - 1} steps"):
        schemas.errors(validator, instance, limit=steps - 1)


def test_the_budget_is_deterministic_a_replay_decides_the_same() -> None:
    schema, document = _exponential()
    validator = schemas.validator_for(schema)
    for limit in (1_000, 37_777):
        verdicts = set()
        for _ in range(3):
            try:
                schemas.errors(validator, document, limit=limit)
                verdicts.add("valid")
            except schemas.WorkExceeded as err:
                verdicts.add(str(err))
        assert verdicts == {f"the check took more than {limit} steps"}


def test_an_ordinary_large_answer_fits_the_budget() -> None:
    schema = {"type": "array", "items": {"type": "object", "properties": {"n": {"minimum": 0}}}}
    document = [{"n": i} for i in range(10_000)]  # about 90 KB: under the 128 KiB answer cap
    assert schemas.errors(schemas.validator_for(schema), document) == ()


def test_many_errors_stop_at_a_hundred_with_short_messages() -> None:
    found = schemas.errors(schemas.validator_for({"items": {"type": "string"}}), list(range(5000)))
    assert len(found) == schemas.MAX_ERRORS
    long = schemas.errors(schemas.validator_for({"maxLength": 1}), "x" * 10_000)
    assert len(long[0].message) == schemas.MESSAGE_CHARS


def test_a_message_is_cut_only_past_300_characters_and_inside_any_of_too() -> None:
    too_long = schemas.validator_for({"maxLength": 1})
    exactly = "x" * 286  # 'x…x' is too long: 288 + 12 = 300 characters
    assert [e.message for e in schemas.errors(too_long, exactly)] == [f"{exactly!r} is too long"]
    (over,) = schemas.errors(too_long, exactly + "y")
    assert over.message == f"'{'x' * 198}…{'x' * 86}y' is too long"
    either = schemas.validator_for({"anyOf": [{"maxLength": 1}, {"type": "integer"}]})
    (error,) = schemas.errors(either, "x" * 10_000)
    assert [len(inner.message) for inner in error.context] == [300, 300]


def test_deep_nesting_is_given_up_not_a_crash() -> None:
    document: Any = 1
    for _ in range(5_000):
        document = [document]
    schema = {"$defs": {"n": {"items": {"$ref": "#/$defs/n"}}}, "$ref": "#/$defs/n"}
    with pytest.raises(schemas.WorkExceeded, match=r"^the check nested too deeply$"):
        schemas.errors(schemas.validator_for(schema), document, limit=10**9)


@pytest.mark.parametrize(
    "items, unique",
    [
        ([1, 1.0], False),
        ([True, 1], True),
        ([{"a": 1, "b": [1]}, {"b": [1.0], "a": 1}], False),
        ([[1, 2], [2, 1]], True),
        ([{"n": i} for i in range(30_000)], True),
        ([*({"n": i} for i in range(30_000)), {"n": 0.0}], False),
    ],
    ids=["int-float", "bool-int", "key-order", "list-order", "30k-objects", "30k-one-repeated"],
)
def test_unique_items_by_json_equality(items: list[Any], unique: bool) -> None:
    found = _messages({"uniqueItems": True}, items)
    assert (found == []) is unique


def _best_cpu(items: list[Any], times: int = 3) -> float:
    """The least CPU seconds of ``times`` checks of ``items`` against ``uniqueItems``."""
    validator = schemas.validator_for({"uniqueItems": True})
    spent = []
    for _ in range(times):
        start = time.process_time()
        assert schemas.errors(validator, items, limit=10**9) == ()
        spent.append(time.process_time() - start)
    return min(spent)


def test_unique_items_take_cpu_linear_in_the_items() -> None:
    """Ten times the items take about ten times the CPU (a pairwise check: a hundred times).

    A ratio, not a bound in seconds: the same check runs several times slower under
    ``make mutate``'s instrumentation or beside a loaded CI tier (30,000 items took 0.28 s
    here, 1.66 s under mutmut), and a ratio of the same code's two sizes does not move."""
    small = _best_cpu([{"n": i} for i in range(3_000)])
    large = _best_cpu([{"n": i} for i in range(30_000)])
    assert large < 30 * small, f"{large:.3f} s for 30,000 items, {small:.4f} s for 3,000"


# --- no remote $ref ---------------------------------------------------------------------


@pytest.fixture
def listener() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server recording the paths asked of it."""
    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            body = b'{"type": "string"}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/schema.json", asked
    finally:
        server.shutdown()
        server.server_close()


def test_a_remote_reference_is_never_fetched(listener: tuple[str, list[str]]) -> None:
    url, asked = listener
    found = _messages({"properties": {"a": {"$ref": url}}}, {"a": 1})
    assert found and "does not resolve within the schema" in found[0]
    assert output.output_error('{"a": 1}', {"properties": {"a": {"$ref": url}}}) is not None
    assert asked == []


def test_local_references_resolve() -> None:
    schema = {"$defs": {"s": {"type": "string"}}, "properties": {"a": {"$ref": "#/$defs/s"}}}
    assert _messages(schema, {"a": "x"}) == []
    assert _messages(schema, {"a": 1}) == ["1 is not of type 'string'"]


# --- through the kernel -----------------------------------------------------------------


def test_an_answer_against_a_hostile_output_schema_is_decided_at_once() -> None:
    schema = {"type": "object", "properties": {"x": {"type": "string", "pattern": HOSTILE}}}
    with _quick():
        error = output.output_error(f'{{"x": "{ANSWER}"}}', schema)
    assert error is not None and error.startswith("x: 'aaaa")


def test_an_answer_past_the_work_budget_is_a_failed_check() -> None:
    schema, document = _exponential()
    error = output.output_error(json.dumps(document), schema)
    assert error == (
        "the answer could not be checked against the schema: the check took more than 200000 steps"
    )


def test_tool_arguments_against_a_hostile_input_schema_are_decided_at_once() -> None:
    schema = {"type": "object", "properties": {"q": {"pattern": HOSTILE}}}
    tool = kernel.ToolSchema("srv__t", schema)
    call = kernel.ToolCall("c1", "srv__t", f'{{"q": "{ANSWER}"}}')
    with _quick():
        (checked,) = kernel.check_calls([call], turn=0, tools={"srv__t": tool})
    assert isinstance(checked, kernel.InvalidCall)
    assert "does not match" in checked.error


def test_an_answer_nested_past_the_parser_s_stack_is_not_a_json_document() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    assert output.output_error(deep, {"type": "array"}) == (
        "the answer is not a JSON document (nested too deeply)"
    )


# --- unevaluatedProperties, exactly -----------------------------------------------------------

D2019 = "https://json-schema.org/draft/2019-09/schema"

UNEVALUATED = {
    "one left": (
        {"properties": {"a": {}}, "unevaluatedProperties": False},
        {"a": 1, "b": 2},
        "Unevaluated properties are not allowed ('b' was unexpected)",
    ),
    "two left": (
        {"properties": {"a": {}}, "unevaluatedProperties": False},
        {"a": 1, "c": 3, "b": 2},
        "Unevaluated properties are not allowed ('b', 'c' were unexpected)",
    ),
    "against a schema": (
        {"unevaluatedProperties": {"type": "integer"}},
        {"a": 1, "b": "x"},
        "Unevaluated properties are not valid under the given schema "
        "('b' was unevaluated and invalid)",
    ),
    "two against a schema": (
        {"unevaluatedProperties": {"type": "integer"}},
        {"a": "y", "b": "x"},
        "Unevaluated properties are not valid under the given schema "
        "('a', 'b' were unevaluated and invalid)",
    ),
    "null only": (
        {"unevaluatedProperties": {"type": "null"}},
        {"a": "x", "b": None},
        "Unevaluated properties are not valid under the given schema "
        "('a' was unevaluated and invalid)",
    ),
    "valid under its schema": ({"unevaluatedProperties": {"type": "integer"}}, {"a": 1}, None),
    "by patternProperties": (
        {"patternProperties": {"^a": {}}, "unevaluatedProperties": False},
        {"ab": 1, "b": 2},
        "Unevaluated properties are not allowed ('b' was unexpected)",
    ),
    "by $ref and properties together": (
        {"$ref": "#/$defs/x", "$defs": {"x": {"properties": {"x": {}}}},
         "properties": {"y": {}}, "unevaluatedProperties": False},
        {"x": 1, "y": 2, "z": 3},
        "Unevaluated properties are not allowed ('z' was unexpected)",
    ),
    "by $ref and $dynamicRef together": (
        {"$ref": "#/$defs/x", "$dynamicRef": "#d",
         "$defs": {"x": {"properties": {"x": {}}},
                   "d": {"$dynamicAnchor": "d", "properties": {"y": {}}}},
         "unevaluatedProperties": False},
        {"x": 1, "y": 2, "z": 3},
        "Unevaluated properties are not allowed ('z' was unexpected)",
    ),
    "by $recursiveRef (2019-09)": (
        {"$schema": D2019, "$recursiveAnchor": True,
         "properties": {"a": {}, "n": {"$recursiveRef": "#", "unevaluatedProperties": False}}},
        {"n": {"a": 1, "b": 2}},
        "Unevaluated properties are not allowed ('b' was unexpected)",
    ),
    "by a $ref inside another resource": (
        {"$defs": {"e": {"$id": "https://example.com/e", "$ref": "#/$defs/b",
                         "$defs": {"b": {"properties": {"x": {}}}}}},
         "$ref": "https://example.com/e", "unevaluatedProperties": False},
        {"x": 1, "y": 2},
        "Unevaluated properties are not allowed ('y' was unexpected)",
    ),
    "by a $ref the referenced schema makes": (
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"properties": {"x": {}}}},
         "$ref": "#/$defs/a", "unevaluatedProperties": False},
        {"x": 1, "y": 2},
        "Unevaluated properties are not allowed ('y' was unexpected)",
    ),
    "by a valid additionalProperties in a branch": (
        {"allOf": [{"additionalProperties": {"type": "integer"}}],
         "unevaluatedProperties": False},
        {"a": 1},
        None,
    ),
    "by allOf beside if": (
        {"allOf": [{"properties": {"x": {}}}], "if": {"required": ["a"]},
         "then": {"properties": {"b": {}}}, "unevaluatedProperties": False},
        {"a": 1, "b": 2, "x": 3},
        "Unevaluated properties are not allowed ('a' was unexpected)",
    ),
}  # fmt: skip
"""What ``unevaluatedProperties`` finds and says, keyword by keyword that evaluates: the keys
left, in sorted order, with ``was`` for one and ``were`` for more (jsonschema's messages)."""


@pytest.mark.parametrize("schema, instance, message", UNEVALUATED.values(), ids=UNEVALUATED)
def test_unevaluated_properties_name_exactly_the_keys_nothing_evaluated(
    schema: Any, instance: Any, message: str | None
) -> None:
    assert _messages(schema, instance) == ([] if message is None else [message])
    stock = jsonschema.validators.validator_for(schema, jsonschema.Draft202012Validator)
    assert [e.message for e in stock(schema).iter_errors(instance)] == _messages(schema, instance)


def test_properties_no_pattern_covers_are_named_with_every_pattern() -> None:
    schema = {"patternProperties": {"^b": {}, "^a": {}}, "additionalProperties": False}
    found = schemas.errors(schemas.validator_for(schema), {"y": 2, "x": 1, "a1": 0})
    assert [e.message for e in found] == ["'x', 'y' do not match any of the regexes: '^a', '^b'"]
    (one,) = schemas.errors(schemas.validator_for(schema), {"x": 1})
    assert one.message == "'x' does not match any of the regexes: '^a', '^b'"


def test_a_refused_pattern_covers_no_property() -> None:
    """A pattern RE2 refuses is reported itself, and matches nothing: the properties only it
    could cover are additional."""
    schema = {"patternProperties": {"(?=a)": {}}, "additionalProperties": False}
    found = schemas.errors(schemas.validator_for(schema), {"x": 1, "ab": 2})
    assert [e.message for e in found] == [
        "'(?=a)' is not a regular expression the linear-time engine accepts (RE2 syntax: no "
        "backreferences or lookaround): invalid perl operator: (?=",
        "'ab', 'x' do not match any of the regexes: '(?=a)'",
    ]


def test_a_schema_of_the_most_objects_and_arrays_is_accepted_one_more_refused() -> None:
    """Objects and arrays are counted everywhere, data too (``const``, ``enum``, ``default``,
    ``examples``): tens of thousands of empty objects fit in 64 KiB, and each is a Python dict
    once parsed."""
    limit = schemas.MAX_SCHEMA_CONTAINERS
    for keyword in ("const", "enum", "default", "examples"):
        at_limit = {keyword: [{}] * (limit - 2)}  # the schema and the array count too
        assert schemas.containers(at_limit) == limit
        assert schemas.schema_problem(at_limit) is None
        over = {keyword: [{}] * (limit - 1)}
        assert schemas.schema_problem(over) == (
            f"{limit + 1} JSON objects and arrays, over the limit of {limit}"
        )
    nested = {"type": "object", "properties": {"a": {"type": "array", "items": {}}}}
    assert schemas.containers(nested) == 4


def test_a_footprint_weighs_parsed_json_near_its_memory() -> None:
    """``footprint`` is what a cache weighs kept JSON by: thousands of empty objects weigh as
    many dicts, not the 3 bytes each of their text."""
    many = {"const": [{} for _ in range(1_000)]}
    assert 64_000 <= schemas.footprint(many) <= 200_000
    assert schemas.footprint({"a": "x" * 1_000}) >= 1_000


def test_a_schema_seen_before_is_not_checked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """An Agent re-listed by the watch, a queued run's config built again, a tool server
    refreshed: the same schema's verdict is remembered, by its canonical JSON (key order
    does not matter), however the check is reached."""
    checked = _counting_checks(monkeypatch)
    first = {"type": "object", "description": f"once {uuid.uuid4()}", "allOf": [{}] * 50}
    again = dict(reversed(list(first.items())))
    assert schemas.known_problem(first) is None and schemas.known_problem(again) is None
    assert len(checked) == 1
    assert schemas.known_problem({**first, "title": "another"}) is None
    assert len(checked) == 2


def _counting_checks(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    checked: list[object] = []
    check = schemas.schema_problem

    def counting(schema: object, **kwargs: int) -> str | None:
        checked.append(schema)
        return check(schema, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(schemas, "schema_problem", counting)
    return checked


def _sized(chars: int, extra: str = "") -> dict[str, str]:
    """A new schema whose canonical JSON (compact, keys sorted) is ``chars`` characters."""
    head = {"description": f"{uuid.uuid4()}{extra}"}
    pad = chars - len(json.dumps(head, separators=(",", ":"), ensure_ascii=False))
    return {"description": f"{head['description']}{'x' * pad}"}


def test_a_schema_of_exactly_the_size_limit_is_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    """The limit is measured on compact JSON, written as it is (non-ASCII text not escaped):
    a schema of ``MAX_SCHEMA_BYTES`` characters, or of non-ASCII text within them, is checked
    once."""
    checked = _counting_checks(monkeypatch)
    exact = _sized(schemas.MAX_SCHEMA_BYTES)
    accented = _sized(schemas.MAX_SCHEMA_BYTES - 10, extra="ééé")  # escaped: 5 characters more
    for schema in (exact, accented):
        assert schemas.known_problem(schema) is None
        assert schemas.known_problem(dict(schema)) is None
    assert checked == [exact, accented]


def test_a_schema_over_the_size_limit_is_refused_by_its_size_each_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not worth remembering: the check says the size at once."""
    checked = _counting_checks(monkeypatch)
    over = _sized(schemas.MAX_SCHEMA_BYTES + 1)
    problem = f"{schemas.MAX_SCHEMA_BYTES + 1} bytes as JSON, over the 65536-byte limit"
    assert schemas.known_problem(over) == problem
    assert schemas.known_problem(over) == problem
    assert len(checked) == 2


def test_a_known_problem_of_a_value_not_a_schema_names_its_type() -> None:
    assert schemas.known_problem("object") == "must be a JSON Schema object, not str"
    assert schemas.known_problem([{}]) == "must be a JSON Schema object, not list"
