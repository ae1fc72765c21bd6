"""The scripted OpenAI-compatible model server for tests and demos (aiohttp.web).

Run it as a process::

    python -m agentrun.testing.mockllm --host 127.0.0.1 --port 0 --scenarios a.yaml,b.yaml

The first stdout line is ``listening on http://HOST:PORT/v1`` (flushed; with ``--port 0``
the port is a free one the OS picked). Or in-process: ``async with MockLLM(scenarios) as m:``
and point ``openai.AsyncOpenAI(base_url=m.base_url, api_key="test")`` at it.

Endpoints:

- ``POST /v1/chat/completions``: chat completions answered from the scenarios (format,
  matching and reply shape: `agentrun.testing.scenario`); ``stream: true`` is answered with
  server-sent ``chat.completion.chunk`` events (usage last with
  ``stream_options.include_usage``), or as the turn's ``stream`` mode says (one JSON body, or
  400). A request no scenario matches and a conversation past its script with ``after:
  error`` are answered 400 with an OpenAI-shaped error saying why, and so is a request that
  breaks the
  strictest providers' rules (role order, tool results right after their call, 9-alphanumeric
  call ids, function names: `agentrun.testing.strict`), as Mistral's API does
  (``--no-strict-call-ids`` or ``strict_call_ids=False``: any unique string id passes, for
  clients that echo the model's ids as given, such as the OpenAI Agents SDK; every other
  rule still holds). A turn's
  ``fault`` answers its status (with ``Retry-After`` when scripted); ``times: N`` counts per
  conversation (system text + first user message) and turn k, so the retry of a ``times: 1``
  fault gets the reply.
- ``GET /v1/models``: ``mock`` plus every model name requested so far.
- ``GET /healthz``: ``{"status": "ok"}``.
- ``GET /_mock/requests[?scenario=NAME]``: ``{"requests": [{index, time (time.time() at
  arrival), model, scenario, turn, status, body}]}`` in arrival order (the newest
  ``max_recorded`` only; status is null while a request is still being answered), and
  ``streams_cut``: streamed replies whose client closed the connection before their end.
- ``POST /_mock/reset``: forget recorded requests and fault counts (scenarios stay).
- ``POST /_mock/scenarios[?mode=replace|append]``: load scenarios from the YAML body,
  replacing (default) or appending to the current set; ``GET /_mock/scenarios`` lists names.

Built for throughput (hundreds of requests a second on one core): scenarios are parsed and
their regexes compiled once at load; a request costs one JSON parse, a regex search per
candidate scenario and one JSON dump. Access logging is off unless ``--access-log``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import itertools
import json
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from . import scenario as sc
from . import strict

__all__ = ["MockLLM", "MockState", "RecordedRequest", "build_app", "load_scenario_files", "main"]

DEFAULT_MAX_RECORDED = 10_000
MOCK_MODEL = "mock"


@dataclass(slots=True)
class RecordedRequest:
    """One chat completion request as the mock saw it."""

    index: int
    time: float
    """time.time() at arrival, seconds since the epoch."""
    model: str | None
    body: Any
    """The parsed JSON request body (not copied)."""
    scenario: str | None = None
    turn: int | None = None
    status: int | None = None
    """HTTP status answered; None while the answer is pending (latency)."""
    api_key: str | None = None
    """The bearer token the client sent (tests check credentials reach the model)."""

    def as_dict(self) -> dict[str, Any]:
        """The JSON form served by ``GET /_mock/requests``."""
        return {
            "index": self.index,
            "time": self.time,
            "model": self.model,
            "scenario": self.scenario,
            "turn": self.turn,
            "status": self.status,
            "api_key": self.api_key,
            "body": self.body,
        }


class MockState:
    """Scenarios, the request record and the fault counters of one server."""

    def __init__(
        self,
        scenarios: Sequence[sc.Scenario] = (),
        *,
        max_recorded: int = DEFAULT_MAX_RECORDED,
        strict_call_ids: bool = True,
    ) -> None:
        sc.check_unique(scenarios, source="scenarios")
        self.scenarios: tuple[sc.Scenario, ...] = tuple(scenarios)
        self.strict_call_ids = strict_call_ids
        """Whether a call id must have the strictest providers' form (``strict.CALL_ID``)."""
        self.requests: collections.deque[RecordedRequest] = collections.deque(maxlen=max_recorded)
        self.models: dict[str, None] = {MOCK_MODEL: None}
        self._fault_counts: dict[tuple[str, str, str | None, int], int] = {}
        self._indexes = itertools.count()
        self.streams_cut = 0
        """Streamed replies whose client went away before the end (it cut the response)."""

    def record(
        self, body: Any, *, model: str | None, arrived: float, api_key: str | None = None
    ) -> RecordedRequest:
        """Append a request that arrived at `arrived` (time.time()); returns its record."""
        entry = RecordedRequest(
            index=next(self._indexes), time=arrived, model=model, body=body, api_key=api_key
        )
        self.requests.append(entry)
        return entry

    def should_fail(self, fault: sc.Fault, name: str, conversation: sc.Conversation) -> bool:
        """Count one request against `fault`; True if this one must fail."""
        if fault.times is None:
            return True
        key = (name, conversation.system, conversation.first_user, conversation.turn)
        seen = self._fault_counts.get(key, 0)
        self._fault_counts[key] = seen + 1
        return seen < fault.times

    def reset(self) -> None:
        """Forget recorded requests and fault counts."""
        self.requests.clear()
        self._fault_counts.clear()

    def load(self, scenarios: Sequence[sc.Scenario], *, append: bool = False) -> None:
        """Replace (or append to) the scenarios; raises ScenarioError on duplicate names."""
        combined = (*self.scenarios, *scenarios) if append else tuple(scenarios)
        sc.check_unique(combined, source="scenarios")
        self.scenarios = combined


def load_scenario_files(paths: Sequence[str | Path]) -> tuple[sc.Scenario, ...]:
    """Parse scenario files in order; raises OSError or ScenarioError (naming the file)."""
    loaded: list[sc.Scenario] = []
    for path in paths:
        loaded.extend(sc.parse_scenarios(Path(path).read_text(), source=str(path)))
    sc.check_unique(loaded, source=", ".join(str(p) for p in paths))
    return tuple(loaded)


# --------------------------------------------------------------------------- handlers

STATE = web.AppKey("state", MockState)


def _error(status: int, message: str, *, code: str, param: str | None = None) -> web.Response:
    return web.json_response(
        sc.error_body(message, status=status, code=code, param=param), status=status
    )


def _fault_response(fault: sc.Fault, name: str, k: int) -> web.Response:
    headers = {} if fault.retry_after is None else {"Retry-After": f"{fault.retry_after:g}"}
    if isinstance(fault.body, str):
        return web.Response(status=fault.status, text=fault.body, headers=headers)
    body = (
        fault.body
        if fault.body is not None
        else sc.error_body(
            f"mock fault: status {fault.status} for scenario {name!r} turn {k}",
            status=fault.status,
            code="mock_fault",
        )
    )
    return web.json_response(body, status=fault.status, headers=headers)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/chat/completions: see the module docstring."""
    arrived = time.time()
    state = request.app[STATE]
    try:
        body = await request.json()
    except ValueError:
        return _error(400, "request body is not valid JSON", code="invalid_json")
    model = body.get("model") if isinstance(body, dict) else None
    bearer = request.headers.get("Authorization", "")
    entry = state.record(
        body,
        model=model if isinstance(model, str) else None,
        arrived=arrived,
        api_key=bearer.removeprefix("Bearer ") if bearer.startswith("Bearer ") else None,
    )
    response = await _answer(state, entry, body, request)
    entry.status = response.status
    return response


async def _answer(
    state: MockState, entry: RecordedRequest, body: Any, request: web.Request
) -> web.StreamResponse:
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        return _error(
            400, "the request needs a string 'model'", code="invalid_request", param="model"
        )
    try:
        conversation = sc.read_conversation(body.get("messages"))
    except sc.RequestError as exc:
        return _error(400, str(exc), code="invalid_request", param="messages")
    broken = strict.violations(body["messages"], call_ids=state.strict_call_ids)
    if broken:
        return _error(
            400, "; ".join(broken), code="invalid_request_message_order", param="messages"
        )
    found = sc.find_scenario(state.scenarios, conversation)
    if found is None:
        names = ", ".join(s.name for s in state.scenarios) or "<none loaded>"
        return _error(
            400,
            f"no mock scenario matches: {conversation.describe()}; scenarios tried: {names}",
            code="no_scenario_match",
            param="messages",
        )
    entry.scenario, entry.turn = found.name, conversation.turn
    turn = sc.select_turn(found, conversation.turn)
    if turn is None:
        return _error(
            400,
            f"scenario {found.name!r} has {len(found.turns)} turns and the "
            f"request is at turn {conversation.turn} (after: error)",
            code="scenario_exhausted",
            param="messages",
        )
    state.models.setdefault(body["model"], None)
    if turn.latency_ms:
        await asyncio.sleep(turn.latency_ms / 1000)
    if turn.fault is not None and state.should_fail(turn.fault, found.name, conversation):
        return _fault_response(turn.fault, found.name, conversation.turn)
    streamed = bool(body.get("stream"))
    if streamed and turn.provider.streaming is sc.Streaming.REFUSE:
        return _error(
            400, "stream: true is not supported by this server", code="unsupported", param="stream"
        )
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    completion = sc.render_completion(
        turn,
        k=conversation.turn,
        model=body["model"],
        completion_id=f"chatcmpl-mock-{entry.index}",
        created=int(entry.time),
        messages=body["messages"],
        request=entry.index,
        max_tokens=max_tokens if isinstance(max_tokens, int) else None,
    )
    if not streamed or turn.provider.streaming is sc.Streaming.JSON:
        return web.json_response(completion)
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    chunks = sc.render_chunks(completion, provider=turn.provider, include_usage=include_usage)
    return await _stream(request, chunks, pause=turn.provider.chunk_ms / 1000)


async def _stream(
    request: web.Request, chunks: Sequence[Any], *, pause: float
) -> web.StreamResponse:
    """Send ``chunks`` as server-sent events, then ``data: [DONE]``; a client that goes away
    ends the stream (counted in ``MockState.streams_cut``)."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    state = request.app[STATE]
    try:
        for chunk in chunks:
            await response.write(f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n".encode())
            if pause:
                await asyncio.sleep(pause)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
    except ConnectionError:  # the client closed the connection: it cut the response
        state.streams_cut += 1
    except asyncio.CancelledError:
        state.streams_cut += 1
        raise
    return response


async def list_models(request: web.Request) -> web.Response:
    """GET /v1/models: the OpenAI list-models shape."""
    data = [
        {"id": m, "object": "model", "created": 0, "owned_by": "agentrun-mockllm"}
        for m in request.app[STATE].models
    ]
    return web.json_response({"object": "list", "data": data})


async def healthz(request: web.Request) -> web.Response:
    """GET /healthz."""
    return web.json_response({"status": "ok"})


async def get_requests(request: web.Request) -> web.Response:
    """GET /_mock/requests[?scenario=NAME]."""
    wanted = request.query.get("scenario")
    entries = [
        e.as_dict() for e in request.app[STATE].requests if wanted is None or e.scenario == wanted
    ]
    return web.json_response({"requests": entries, "streams_cut": request.app[STATE].streams_cut})


async def post_reset(request: web.Request) -> web.Response:
    """POST /_mock/reset."""
    request.app[STATE].reset()
    return web.json_response({"ok": True})


async def post_scenarios(request: web.Request) -> web.Response:
    """POST /_mock/scenarios[?mode=replace|append] with a YAML body."""
    mode = request.query.get("mode", "replace")
    if mode not in ("replace", "append"):
        return _error(400, "mode must be replace or append", code="invalid_request", param="mode")
    state = request.app[STATE]
    try:
        parsed = sc.parse_scenarios(await request.text(), source="POST /_mock/scenarios")
        state.load(parsed, append=mode == "append")
    except sc.ScenarioError as exc:
        return _error(400, str(exc), code="invalid_scenarios")
    return web.json_response({"scenarios": [s.name for s in state.scenarios]})


async def get_scenarios(request: web.Request) -> web.Response:
    """GET /_mock/scenarios."""
    return web.json_response({"scenarios": [s.name for s in request.app[STATE].scenarios]})


def build_app(state: MockState) -> web.Application:
    """The aiohttp application serving `state` (routes in the module docstring)."""
    app = web.Application(client_max_size=64 * 1024**2)
    app[STATE] = state
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/_mock/requests", get_requests)
    app.router.add_post("/_mock/reset", post_reset)
    app.router.add_post("/_mock/scenarios", post_scenarios)
    app.router.add_get("/_mock/scenarios", get_scenarios)
    return app


# --------------------------------------------------------------------------- serving


class MockLLM:
    """The server in the current event loop: ``async with MockLLM(scenarios) as mock: ...``."""

    def __init__(
        self,
        scenarios: Sequence[sc.Scenario] = (),
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_recorded: int = DEFAULT_MAX_RECORDED,
        access_log: bool = False,
        strict_call_ids: bool = True,
    ) -> None:
        self.state = MockState(
            scenarios, max_recorded=max_recorded, strict_call_ids=strict_call_ids
        )
        self._host, self._port, self._access_log = host, port, access_log
        self._runner: web.AppRunner | None = None
        self._url: str | None = None

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT/v1``; raises RuntimeError before start()."""
        if self._url is None:
            raise RuntimeError("MockLLM is not started")
        return self._url

    async def start(self) -> str:
        """Bind and serve; returns base_url (the real port when constructed with port 0)."""
        kwargs: dict[str, Any] = {} if self._access_log else {"access_log": None}
        runner = web.AppRunner(build_app(self.state), handle_signals=False, **kwargs)
        await runner.setup()
        await web.TCPSite(runner, self._host, self._port).start()
        self._runner = runner
        port = runner.addresses[0][1]
        host = f"[{self._host}]" if ":" in self._host else self._host
        self._url = f"http://{host}:{port}/v1"
        return self._url

    async def stop(self) -> None:
        """Stop serving (idempotent)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> MockLLM:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog="python -m agentrun.testing.mockllm",
        description="Scripted OpenAI-compatible model server.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = a free port (default)")
    parser.add_argument("--scenarios", default="", help="FILE[,FILE...] of scenario YAML")
    parser.add_argument(
        "--max-recorded",
        type=int,
        default=DEFAULT_MAX_RECORDED,
        help="how many requests GET /_mock/requests keeps",
    )
    parser.add_argument("--access-log", action="store_true", help="log every request")
    parser.add_argument(
        "--no-strict-call-ids",
        dest="strict_call_ids",
        action="store_false",
        help="accept any unique string as a tool call id (other rules still hold)",
    )
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    """Serve until SIGINT or SIGTERM."""
    paths = [p for p in args.scenarios.split(",") if p]
    mock = MockLLM(
        load_scenario_files(paths),
        host=args.host,
        port=args.port,
        max_recorded=args.max_recorded,
        access_log=args.access_log,
        strict_call_ids=args.strict_call_ids,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with mock:
        print(f"listening on {mock.base_url}", flush=True)
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; exit status 2 on a bad scenario file."""
    args = parse_args(argv)
    try:
        asyncio.run(serve(args))
    except (OSError, sc.ScenarioError) as exc:
        print(f"mockllm: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
