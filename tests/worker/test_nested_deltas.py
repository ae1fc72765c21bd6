"""A streamed delta nested as deep as the JSON parser takes is an answer or an
``invalid_response``, never a bug. Before: a chunk nested a few hundred levels deep in a delta
field the worker does not fold (where reasoning goes) was within every bound and Python's JSON
parser took it, but ``delivery._texts`` walked it recursively, two Python frames a level (the
function and its list comprehension): ``RecursionError`` was raised from ``Delivery.add``,
outside ``parsed``/``_parsed_chunks``, so it escaped the model client as a bug rather than
``invalid_response`` (what the parser's own RecursionError became)."""

from __future__ import annotations

import json
import time

import pytest
from aiohttp import web
from http_support import serving

from agentrun.metrics import ModelErrorType
from agentrun.worker.delivery import Delivery
from agentrun.worker.model import ChatRequest, ModelClient, ModelError, RetryPolicy

DEPTH = 700
NESTED = "[" * DEPTH + '"r"' + "]" * DEPTH
CHUNK = '{"choices":[{"index":0,"delta":{"reasoning_details":' + NESTED + "}}]}"


def test_the_parser_takes_the_chunk() -> None:
    assert json.loads(CHUNK)


def test_folding_a_deeply_nested_delta_does_not_raise() -> None:
    """Seen: RecursionError."""
    delivery = Delivery()
    delivery.add(json.loads(CHUNK))
    assert delivery.unfolded == ["r"]


async def answer(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(b"data: " + CHUNK.encode() + b"\n\n")
    last = {
        "choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
    await response.write(b"data: " + json.dumps(last).encode() + b"\n\ndata: [DONE]\n\n")
    await response.write_eof()
    return response


async def test_a_deeply_nested_delta_is_an_answer_or_an_invalid_response() -> None:
    """Expected: the answer (its reasoning counted) or ``ModelError(invalid_response)``.
    Seen: ``RecursionError`` out of ``ModelClient.complete``."""
    model = ModelClient(RetryPolicy(max_retries=0, request_timeout=30))
    async with serving({"/v1/chat/completions": answer}) as base:
        request = ChatRequest(
            base_url=f"{base}/v1",
            api_key="",
            model="scripted",
            messages=[{"role": "user", "content": "hello"}],
            tools=[],
            max_output_tokens=100,
        )
        try:
            await model.complete(request, deadline=time.time() + 20)
        except ModelError as err:
            assert err.error_type is ModelErrorType.INVALID_RESPONSE, str(err)
        except RecursionError as err:
            pytest.fail(f"RecursionError escaped the model client: {str(err)[:100]}")
        finally:
            await model.close()
