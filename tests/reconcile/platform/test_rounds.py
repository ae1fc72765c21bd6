"""Keys put in turn by party, then by namespace inside each party (``platform.rounds``)."""

from __future__ import annotations

import itertools

from agentrun.operator.platform.rounds import in_turn

KEYS = [
    *((f"a-{i}", n) for n in range(3) for i in range(3)),
    *(("b", n) for n in range(3)),
]
"""Tenant A's three namespaces, three keys each, then tenant B's one namespace's three."""


def namespace(key: tuple[str, int]) -> str:
    return key[0]


def tenant(space: str) -> str:
    return "tenant/a" if space.startswith("a-") else "tenant/b"


def test_each_namespace_its_own_party_takes_one_place_a_round() -> None:
    order = list(in_turn(KEYS, namespace=namespace))
    assert order[:4] == [("a-0", 0), ("a-1", 0), ("a-2", 0), ("b", 0)]


def test_a_tenants_namespaces_together_take_one_place_a_round_in_turn_inside_it() -> None:
    order = list(in_turn(KEYS, namespace=namespace, party=tenant))
    assert order[:6] == [("a-0", 0), ("b", 0), ("a-1", 0), ("b", 1), ("a-2", 0), ("b", 2)]
    assert order[6:] == [("a-0", 1), ("a-1", 1), ("a-2", 1), ("a-0", 2), ("a-1", 2), ("a-2", 2)]
    assert sorted(order) == sorted(KEYS)  # each once


def test_each_namespaces_keys_keep_their_order_and_a_pass_takes_a_slice() -> None:
    keys = [("x", 2), ("y", 9), ("x", 1), ("x", 3)]
    assert list(itertools.islice(in_turn(keys, namespace=namespace), 3)) == [
        ("x", 2),
        ("y", 9),
        ("x", 1),
    ]
    assert list(in_turn([], namespace=namespace)) == []


def test_a_namespaces_party_is_asked_once() -> None:
    asked: list[str] = []

    def counted(space: str) -> str:
        asked.append(space)
        return tenant(space)

    assert len(list(in_turn(KEYS, namespace=namespace, party=counted))) == len(KEYS)
    assert sorted(asked) == ["a-0", "a-1", "a-2", "b"]
