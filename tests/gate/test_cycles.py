"""Dependency cycles between gates are found (and only real ones)."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from gate import GateSpec
from gate._check import find_cycles


def spec(topics: list[str], deps: list[str], group: str | None = None) -> GateSpec:
    return GateSpec(topics=topics, depends_on=deps, group=group)


def test_two_gates_waiting_for_each_other_on_one_topic() -> None:
    cycles = find_cycles({"a": spec(["t"], ["b"]), "b": spec(["t"], ["a"])})
    assert cycles == [("t", ["a", "b", "a"])]


def test_self_dependency_is_a_cycle() -> None:
    assert find_cycles({"a": spec(["t"], ["a"])}) == [("t", ["a", "a"])]


def test_chains_and_fan_in_are_not_cycles() -> None:
    gates = {"a": spec(["t"], ["b", "c"]), "b": spec(["t"], ["c"]), "x": spec(["t"], ["c"])}
    assert find_cycles(gates) == []


def test_waiting_on_different_topics_is_not_a_deadlock() -> None:
    assert find_cycles({"a": spec(["t"], ["b"]), "b": spec(["u"], ["a"])}) == []


def test_gate_group_override_is_used() -> None:
    gates = {
        "svc-a": spec(["t"], ["grp-b"], group="grp-a"),
        "svc-b": spec(["t"], ["grp-a"], group="grp-b"),
    }
    assert find_cycles(gates) == [("t", ["grp-a", "grp-b", "grp-a"])]


names = st.sampled_from("abcde")


@given(st.dictionaries(names, st.lists(names, min_size=1, max_size=3, unique=True), max_size=5))
def test_a_cycle_is_reported_exactly_when_the_graph_has_one(edges: dict[str, list[str]]) -> None:
    gates = {name: spec(["t"], deps) for name, deps in edges.items()}

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), list(edges.get(start, []))
        while todo:
            node = todo.pop()
            if node == goal:
                return True
            if node not in seen:
                seen.add(node)
                todo.extend(edges.get(node, []))
        return False

    has_cycle = any(reaches(node, node) for node in edges)
    cycles = find_cycles(gates)
    assert bool(cycles) == has_cycle
    for _, path in cycles:
        assert path[0] == path[-1]
        assert all(b in edges[a] for a, b in itertools.pairwise(path))
