"""Fixtures: the scripted model server in-process, and the real openai client against it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import openai
import pytest

from agentrun.testing import mockllm, scenario

SCENARIOS = """
scenarios:
  - name: rectangle
    match: {goal: "rectangle"}
    turns:
      - content: "Let me compute both."
        tool_calls:
          - {name: calculate, arguments: {expression: "3*4"}}
          - {id: call_custom, name: calculate, arguments: {expression: "2*(3+4)"}}
        usage: {prompt_tokens: 120, completion_tokens: 30, cached_tokens: 20}
      - content: "Area 12, perimeter 14."
        usage: {prompt_tokens: 200, completion_tokens: 8}
  - name: duplicate-ids
    match: {goal: "duplicate ids"}
    turns:
      - tool_calls:
          - {id: call_same, name: calculate, arguments: {expression: "1+1"}}
          - {id: call_same, name: calculate, arguments: {expression: "2+2"}}
  - name: usage-null
    match: {goal: "no usage"}
    turns:
      - {content: "done", usage: null}
  - name: usage-estimated
    match: {goal: "estimate usage"}
    turns:
      - {content: "twelve characters plus"}
  - name: rate-limited-once
    match: {goal: "rate limit"}
    turns:
      - content: "after the retry"
        fault: {status: 429, times: 1, retry_after: 2}
  - name: always-500
    match: {goal: "server down"}
    turns:
      - content: "never seen"
        fault: {status: 500}
  - name: slow
    match: {goal: "slow"}
    turns:
      - {content: "finally", latency_ms: 250}
  - name: endless
    match: {goal: "endless"}
    turns:
      - tool_calls:
          - {name: calculate, arguments: {expression: "{turn}*3+1"}}
    after: repeat_last
  - name: fresh-ids
    match: {goal: "ask again"}
    turns:
      - tool_calls:
          - {id: "w{request}", name: write, arguments: [{a: 1, b: 2}, '{"b":2,"a":1}']}
  - name: short
    match: {goal: "short script"}
    turns:
      - {content: "only one turn"}
  - name: refusal
    match: {goal: "refuse"}
    turns:
      - {refusal: "I can't help with that."}
  - name: empty-tool-calls
    match: {goal: "empty calls"}
    turns:
      - {content: null, tool_calls: []}
  - name: malformed-arguments
    match: {goal: "malformed"}
    turns:
      - tool_calls:
          - {name: calculate, arguments: "{\\"expression\\": \\"1+1\\"\\\\n}"}
          - {name: "list_pods<|channel|>json", arguments: ""}
  - name: stream-cjk
    match: {goal: "stream cjk"}
    turns:
      - {content: "長い答えはここにあります", count: char, chunk_tokens: 2}
  - name: stream-slow
    match: {goal: "keeps streaming"}
    turns:
      - content: "a long answer that keeps coming, piece by piece, for a while; {turn} {turn}
          and it goes on with more words than anyone would read in one sitting, on and on
          and on again, until the reader gives up and closes the connection to stop it"
        chunk_ms: 40
        chunk_tokens: 1
  - name: stream-no-usage
    match: {goal: "stream without usage"}
    turns:
      - {content: "no usage chunk at the end", stream_usage: false}
  - name: stream-json
    match: {goal: "stream json"}
    turns:
      - {content: "one body", stream: json}
  - name: stream-refused
    match: {goal: "streaming turned down"}
    turns:
      - {content: "not streamed", stream: refuse}
  - name: honors-max-tokens
    match: {goal: "honor limit"}
    turns:
      - {content: "abcdefghijklmnopqrstuvwxyz", max_tokens: honor}
  - name: ignores-max-tokens
    match: {goal: "ignore limit"}
    turns:
      - content: "abcdefghijklmnopqrstuvwxyz"
        usage: {prompt_tokens: 10, completion_tokens: 20000}
  - name: streamed-calls
    match: {goal: "stream calls"}
    turns:
      - content: "calling"
        tool_calls:
          - {name: calculate, arguments: {expression: "12345*678"}}
          - {name: calculate, arguments: {expression: "1+1"}}
  - name: by-system
    match: {system: "^You are terse", goal: "system"}
    turns:
      - {content: "terse", finish_reason: length}
"""


@pytest.fixture
async def mock() -> AsyncIterator[mockllm.MockLLM]:
    """A fresh server on a free port with the SCENARIOS above."""
    async with mockllm.MockLLM(scenario.parse_scenarios(SCENARIOS, source="conftest")) as server:
        yield server


@pytest.fixture
async def client(mock: mockllm.MockLLM) -> AsyncIterator[openai.AsyncOpenAI]:
    """The real openai client, no retries (the tests see every fault)."""
    async with openai.AsyncOpenAI(base_url=mock.base_url, api_key="test", max_retries=0) as c:
        yield c


@pytest.fixture
async def lenient_client() -> AsyncIterator[openai.AsyncOpenAI]:
    """The real openai client against a server with the call-id form check off (as the
    benchmarks' in-process peer uses it), no retries."""
    parsed = scenario.parse_scenarios(SCENARIOS, source="conftest")
    async with (
        mockllm.MockLLM(parsed, strict_call_ids=False) as server,
        openai.AsyncOpenAI(base_url=server.base_url, api_key="t", max_retries=0) as c,
    ):
        yield c
