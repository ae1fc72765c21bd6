"""An endpoint that answers HTTP 200 with a JSON body that is not an object (``[]``, ``null``, a
string) has read the prompt: the call is charged its prompt's bound, as one answered with a
body that is not JSON at all. (It was charged nothing: the check came after the call's watch.)"""

from __future__ import annotations

from decimal import Decimal

from aiohttp import web

from agentrun import kernel
from agentrun.ledger import Granted

from .rawmodel import one_turn, serve


class RecordingHold:
    def __init__(self) -> None:
        self.charged: list[kernel.Usage] = []

    async def reserve_call(self, need, *, before=None):  # type: ignore[no-untyped-def]
        return Granted(need.output_tokens, need.prompt_tokens + need.output_tokens, Decimal(0))

    async def spend(self, usage: kernel.Usage, *, answered: bool = True) -> None:
        self.charged.append(usage)

    def note(self, usage: kernel.Usage) -> None:
        self.charged.append(usage)

    async def abandon(self, usage: kernel.Usage) -> None:
        self.charged.append(usage)


async def json_list(request: web.Request) -> web.Response:
    await request.json()
    return web.json_response([{"choices": []}])


async def not_json(request: web.Request) -> web.Response:
    await request.json()
    return web.Response(text="<html>oops</html>", content_type="application/json")


async def test_a_non_object_answer_is_charged_like_a_non_json_one() -> None:
    seen = {}
    for name, handler in (("not-json", not_json), ("json-list", json_list)):
        hold = RecordingHold()
        async with serve(handler) as url:
            _record, state = await one_turn(url, limits=kernel.Limits(), hold=hold)
        seen[name] = (state.phase, hold.charged)
    assert seen["not-json"][1], "precondition: a non-JSON answer is charged its prompt"
    assert seen["json-list"][1], (
        f"a 200 answer of a JSON list after the prompt was read: nothing charged"
        f" (ended {seen['json-list'][0]}), while a non-JSON one is charged"
        f" {seen['not-json'][1]}"
    )
    assert seen["json-list"][1] == seen["not-json"][1]  # the prompt's bound, noted once
