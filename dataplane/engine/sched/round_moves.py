"""How the boundary between experts and KV moved in one scheduling round, as one typed
object: the change lists in the order the residency table applied them. The step
statistics count the round's own moves (make_room's inside the round, the adjuster's after
it); tensor parallelism sends every move since its last message, those between rounds
too (start-up residency, a live policy push), netted into one change list.

What must stay true: `net_changes` of the lists equals the difference between the page
table before the first and after the last (what a follower must apply to match rank 0),
so an expert evicted and loaded again in between travels as one load at its new pages,
and one loaded and evicted again does not travel at all.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rimuru.dataplane.adjust.adjuster import ChangeList, ExpertLoad
from rimuru.dataplane.adjust.order import ExpertKey


@dataclass(frozen=True)
class RoundMoves:
    between: tuple[ChangeList, ...] = ()  # since the last round: start-up, a live push
    inside: tuple[ChangeList, ...] = ()  # this round's: make_room's, then the adjuster's

    @property
    def num_evicted(self) -> int:
        return sum(len(c.evict) for c in self.inside)

    @property
    def num_loaded(self) -> int:
        return sum(len(c.load) for c in self.inside)

    @property
    def changes(self) -> tuple[ChangeList, ...]:
        return self.between + self.inside


def net_changes(lists: Iterable[ChangeList]) -> ChangeList:
    """The ordered change lists as one: each expert's last state where it differs from its
    state before the first (evicted first: it was resident; loaded first: it was not).
    Each list applies its evictions before its loads (ResidencyTable.apply)."""
    was_resident: dict[ExpertKey, bool] = {}
    now: dict[ExpertKey, tuple[int, ...] | None] = {}
    for changes in lists:
        for key in changes.evict:
            was_resident.setdefault(key, True)
            now[key] = None
        for load in changes.load:
            key = (load.layer, load.expert)
            was_resident.setdefault(key, False)
            now[key] = load.pages
    evict = tuple(key for key, pages in now.items() if pages is None and was_resident[key])
    load = tuple(
        ExpertLoad(layer, expert, pages)
        for (layer, expert), pages in now.items()
        if pages is not None
    )
    return ChangeList(evict=tuple(sorted(evict)), load=tuple(sorted(load, key=_key)))


def _key(load: ExpertLoad) -> ExpertKey:
    return load.layer, load.expert
