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
