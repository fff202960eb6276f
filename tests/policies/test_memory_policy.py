"""The memory policies as objects: the name table, and each policy's answers."""

from dataclasses import replace

import pytest

from rimuru.dataplane.policies import (
    Elastic,
    ElasticPaper,
    Fixed,
    Resident,
    memory_policy,
    policy_named,
)
from rimuru.policy import Tunables


@pytest.mark.parametrize(
    ("tunables", "cls"),
    [
        (Tunables(mode="resident", expert_offload_limit=0), Resident),
        (Tunables(mode="fixed"), Fixed),
        (Tunables(mode="elastic"), Elastic),
        (Tunables(mode="elastic", elastic_rule="paper"), ElasticPaper),
        # the rule names elastic's variant only: other policies ignore it
        (Tunables(mode="fixed", elastic_rule="paper"), Fixed),
    ],
)
def test_each_wire_name_maps_to_its_policy(tunables, cls):
    policy = memory_policy(tunables)
    assert type(policy) is cls and policy.name == tunables.mode


def test_what_each_policy_answers():
    t = Tunables(mode="elastic", expert_offload_limit=6, grow_threshold=5)
    resident, fixed = memory_policy(Tunables(mode="resident", expert_offload_limit=0)), Fixed()
    elastic, paper = memory_policy(t), memory_policy(replace(t, elastic_rule="paper"))
    assert [p.moves_boundary for p in (resident, fixed, elastic, paper)] == [0, 0, 1, 1]
    assert [p.offloads for p in (resident, fixed, elastic, paper)] == [0, 1, 1, 1]
    assert [p.prices_copies for p in (resident, fixed, elastic, paper)] == [0, 0, 1, 0]
    assert [p.least_kept(16, t) for p in (resident, fixed, elastic, paper)] == [16, None, 10, 10]
    assert elastic.least_kept(4, t) == 0  # a limit above the layer's experts offloads them all
    assert [p.loading_slots(16, t) for p in (resident, fixed, elastic)] == [1, 16, 6]
    assert (
        elastic.loading_slots(4, t) == 4
        and elastic.loading_slots(16, replace(t, expert_offload_limit=0)) == 1
    )
    assert [p.free_pages_at_start(t) for p in (resident, fixed, elastic)] == [0, 0, 5]
    assert [p.graphs_with_host_copies() for p in (resident, fixed, elastic)] == [1, 0, 1]


def test_a_policy_is_named_by_mode_and_rule():
    assert type(policy_named("elastic", "paper")) is ElasticPaper
    assert type(policy_named("fixed", "paper")) is Fixed
    with pytest.raises(ValueError, match="no memory policy is named 'lru'"):
        policy_named("lru")
