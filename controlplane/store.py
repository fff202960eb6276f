"""Durable history of policy versions and rankings per deployment (stdlib sqlite3).

Every write is one transaction (BEGIN IMMEDIATE ... COMMIT) with synchronous=FULL in WAL
mode: once a call returns, a crash or restart keeps the version; a failed one leaves no
trace. Versions are max(stored) + 1 per deployment, so a restart resumes where it was.
`path=None` keeps everything in memory (tests, ephemeral runs).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from rimuru.controlplane.errors import FailedPrecondition, VersionConflict
from rimuru.controlplane.policy import Policy, RankingRef
from rimuru.controlplane.ranking import Ranking
from rimuru.policy import HotnessRanking, Tunables

SCHEMA = """
CREATE TABLE IF NOT EXISTS policies (
    deployment TEXT NOT NULL,
    version INTEGER NOT NULL,
    tunables TEXT NOT NULL,          -- JSON of Tunables
    ranking_version INTEGER,         -- rankings.version, NULL = no ranking
    created REAL NOT NULL,
    reason TEXT NOT NULL,
    PRIMARY KEY (deployment, version)
);
CREATE TABLE IF NOT EXISTS rankings (
    deployment TEXT NOT NULL,
    version INTEGER NOT NULL,
    ranking_id TEXT NOT NULL,
    digest TEXT NOT NULL,
    layers TEXT NOT NULL,            -- JSON [[layer, [expert ids], [probabilities]], ...]
    created REAL NOT NULL,
    PRIMARY KEY (deployment, version)
);
"""
DB_FILE = "controlplane.sqlite3"
MAX_SQLITE_INT = 2**63 - 1  # the wire's uint64 versions above this are never stored


class PolicyStore:
    def __init__(self, path: Path | None = None, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self._clock = clock
        # Autocommit mode: transactions are explicit, so each write is exactly one.
        self._db = sqlite3.connect(":memory:" if path is None else str(path), isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(SCHEMA)
        self._current: dict[str, Policy] = {}
        for (deployment,) in self._db.execute("SELECT DISTINCT deployment FROM policies"):
            self._current[deployment] = self._load_policy(deployment, None)

    @classmethod
    def open(cls, data_dir: Path | None) -> PolicyStore:
        if data_dir is None:
            return cls(None)
        data_dir.mkdir(parents=True, exist_ok=True)
        return cls(data_dir / DB_FILE)

    def close(self) -> None:
        self._db.close()

    # -- reads ---------------------------------------------------------------------------

    def current(self, deployment: str) -> Policy | None:
        return self._current.get(deployment)

    def deployments(self) -> list[str]:
        return sorted(self._current)

    def policy(self, deployment: str, version: int) -> Policy | None:
        if not 0 < version <= MAX_SQLITE_INT:
            return None
        return self._load_policy(deployment, version)

    def ranking(self, deployment: str, version: int) -> Ranking | None:
        if not 0 < version <= MAX_SQLITE_INT:
            return None
        row = self._db.execute(
            "SELECT ranking_id, digest, layers FROM rankings WHERE deployment=? AND version=?",
            (deployment, version),
        ).fetchone()
        if row is None:
            return None
        ranking_id, ranking_digest, layers_json = row
        # rows are stored in layer order 0..L-1 (set_ranking writes them from a ranking)
        rows = json.loads(layers_json)
        hotness = HotnessRanking(
            tuple(tuple(ids) for _, ids, _ in rows), tuple(tuple(probs) for _, _, probs in rows)
        )
        return Ranking(RankingRef(ranking_id, version, ranking_digest), deployment, hotness)

    # -- writes --------------------------------------------------------------------------

    def set_tunables(
        self, deployment: str, tunables: Tunables, expected_version: int | None = None
    ) -> Policy:
        """Append a version with new tunables and the current ranking."""
        current = self.current(deployment)
        current_version = 0 if current is None else current.version
        if expected_version is not None and expected_version != current_version:
            raise VersionConflict(
                f"deployment {deployment!r} is at version {current_version}, not "
                f"{expected_version}: read the policy again and retry"
            )
        ranking = None if current is None else current.ranking
        with self._transaction():
            policy = self._append(deployment, tunables, ranking, "set")
        self._current[deployment] = policy
        return policy

    def set_ranking(
        self,
        deployment: str,
        ranking_id: str,
        hotness: HotnessRanking,
        reason: str = "upload-ranking",
    ) -> tuple[Ranking, Policy]:
        """Store a ranking and append a version that uses it (same tunables), atomically."""
        current = self.current(deployment)
        if current is None:
            raise FailedPrecondition(
                f"deployment {deployment!r} has no policy yet: set one (rimuru policy set) "
                "before uploading a ranking"
            )
        with self._transaction():
            (last,) = self._db.execute(
                "SELECT COALESCE(MAX(version), 0) FROM rankings WHERE deployment=?",
                (deployment,),
            ).fetchone()
            ref = RankingRef(ranking_id, last + 1, hotness.digest())
            layers_json = json.dumps(
                [
                    [layer, list(order), list(prob)]
                    for layer, (order, prob) in enumerate(
                        zip(hotness.order, hotness.prob, strict=True)
                    )
                ]
            )
            self._db.execute(
                "INSERT INTO rankings VALUES (?, ?, ?, ?, ?, ?)",
                (deployment, ref.version, ref.id, ref.digest, layers_json, self._clock()),
            )
            policy = self._append(deployment, current.tunables, ref, reason)
        self._current[deployment] = policy
        return Ranking(ref, deployment, hotness), policy

    def _append(
        self, deployment: str, tunables: Tunables, ranking: RankingRef | None, reason: str
    ) -> Policy:
        current = self.current(deployment)
        policy = Policy(
            deployment=deployment,
            version=1 if current is None else current.version + 1,
            tunables=tunables,
            ranking=ranking,
            created_unix_seconds=self._clock(),
            reason=reason,
        )
        self._db.execute(
            "INSERT INTO policies VALUES (?, ?, ?, ?, ?, ?)",
            (
                deployment,
                policy.version,
                json.dumps(tunables.to_dict()),
                None if ranking is None else ranking.version,
                policy.created_unix_seconds,
                reason,
            ),
        )
        return policy

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        # The in-memory current policy is updated by the caller only after COMMIT.
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _load_policy(self, deployment: str, version: int | None) -> Policy | None:
        query = (
            "SELECT p.version, p.tunables, p.created, p.reason, r.version, r.ranking_id, "
            "r.digest FROM policies p LEFT JOIN rankings r "
            "ON r.deployment = p.deployment AND r.version = p.ranking_version "
            "WHERE p.deployment = ? "
        )
        if version is None:
            row = self._db.execute(query + "ORDER BY p.version DESC LIMIT 1", (deployment,))
        else:
            row = self._db.execute(query + "AND p.version = ?", (deployment, version))
        found = row.fetchone()
        if found is None:
            return None
        number, tunables_json, created, reason, r_version, r_id, r_digest = found
        return Policy(
            deployment=deployment,
            version=number,
            tunables=Tunables.from_dict(json.loads(tunables_json)),
            ranking=None if r_version is None else RankingRef(r_id, r_version, r_digest),
            created_unix_seconds=created,
            reason=reason,
        )
