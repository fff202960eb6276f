"""A restarted control plane resumes at the same version with every version and ranking."""

from __future__ import annotations

import sqlite3

import pytest

from rimuru.controlplane.plane import ControlPlane
from rimuru.controlplane.store import DB_FILE, PolicyStore
from rimuru.policy import HotnessRanking, Tunables

RANKING = HotnessRanking(((2, 0, 1), (0, 1, 2)), ((0.5, 0.3, 0.2), (0.4, 0.4, 0.2)))


def test_restart_resumes_versions_and_rankings(tmp_path):
    plane = ControlPlane.open(tmp_path)
    plane.set_policy("qwen", Tunables(expert_offload_limit=1))
    ranking, _ = plane.upload_ranking("qwen", "offline", RANKING)
    plane.set_policy("qwen", Tunables(expert_offload_limit=2))
    plane.set_policy("mixtral", Tunables(mode="fixed"))
    before = {d: plane.get_policy(d) for d in ("qwen", "mixtral")}
    plane.close()

    again = ControlPlane.open(tmp_path)
    assert {d: again.get_policy(d) for d in ("qwen", "mixtral")} == before
    assert before["qwen"].version == 3 and before["qwen"].ranking == ranking.ref
    assert again.get_ranking("qwen") == ranking
    assert again.store.policy("qwen", 1).tunables.expert_offload_limit == 1
    # Numbering continues, never reuses a version.
    assert again.set_policy("qwen", Tunables()).version == 4
    again.close()


def test_a_failed_write_changes_nothing(tmp_path):
    store = PolicyStore.open(tmp_path)
    store.set_tunables("qwen", Tunables())
    # Another writer took version 2 behind the store's back: the next append collides
    # after the ranking row went in, and the whole transaction must roll back.
    other = sqlite3.connect(tmp_path / DB_FILE)
    other.execute("INSERT INTO policies VALUES ('qwen', 2, '{}', NULL, 0, 'other')")
    other.commit()
    other.close()
    with pytest.raises(sqlite3.IntegrityError):
        store.set_ranking("qwen", "offline", RANKING)
    assert store.current("qwen").version == 1
    assert store.ranking("qwen", 1) is None
    store.close()


def test_a_policy_stored_before_pages_per_expert_retired_still_loads(tmp_path):
    # Older control planes stored every field of Tunables, pages_per_expert (always 3) too.
    store = PolicyStore.open(tmp_path)
    store.close()
    old = sqlite3.connect(tmp_path / DB_FILE)
    stored = (
        '{"mode": "fixed", "expert_offload_limit": 2, "shrink_threshold": 2, '
        '"grow_threshold": 9, "max_grow_per_round": 5, "pages_per_expert": 3, '
        '"online_hotness": false, "copy_budget": 0.0, "elastic_rule": "cost", '
        '"tpot_slo_ms": 0.0}'
    )
    old.execute("INSERT INTO policies VALUES ('qwen', 1, ?, NULL, 0, 'set')", (stored,))
    old.commit()
    old.close()
    again = ControlPlane.open(tmp_path)
    assert again.get_policy("qwen").tunables == Tunables(mode="fixed", expert_offload_limit=2)
    again.close()
