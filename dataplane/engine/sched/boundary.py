"""Moving the boundary: the adjuster's decision, reserved in the allocator and applied to the
residency table. The engine calls it after every scheduling round (the Rimuru paper's
adjuster) and, in elastic mode, inside a round before a running request would be preempted
(`ElasticBoundary`: the batch the copy budget prices, and the scheduler's two hooks,
make_room and admit_limit).

Callers guarantee that the previous forward — the last that could read an evicted expert —
has completed, so evicted pages are free at once (`last_step` is that forward's step).
"""

from __future__ import annotations

from rimuru.dataplane.adjust.adjuster import (
    AdjusterDecision,
    ChangeList,
    Residency,
    StepShape,
    decide,
    expected_copies,
    num_to_evict,
    reserve,
    route_probability,
)
from rimuru.dataplane.adjust.payoff import CostView, eviction_pays
from rimuru.dataplane.engine.experts.copy_budget import CopyControl
from rimuru.dataplane.engine.experts.live_routing import LiveRouting
from rimuru.dataplane.engine.experts.moe_backend import MoEBackend
from rimuru.dataplane.engine.experts.residency_table import ResidencyTable
from rimuru.dataplane.engine.experts.step_cost import StepCostMeter
from rimuru.dataplane.engine.sched.kv_cache import KVCacheManager
from rimuru.dataplane.engine.sched.policy_state import PolicyState
from rimuru.dataplane.engine.sched.scheduler import RoundState
from rimuru.dataplane.memory.allocator import PageAllocator
from rimuru.dataplane.memory.geometry import PageType
from rimuru.dataplane.policies import memory_policy
from rimuru.policy import EXPERT_MATRICES, HotnessRanking, Tunables

# The most copy_scale prices copies up by: a meter that still counts copies of experts just
# brought back (its average lags ~10 steps) must not freeze the boundary.
MAX_COPY_SCALE = 3.0


def move_boundary(
    kv_pages_short: int,
    allocator: PageAllocator,
    kv: KVCacheManager,
    residency: ResidencyTable,
    ranking: HotnessRanking,
    tunables: Tunables,
    last_step: int,
    *,
    evict_only: bool = False,
    step: StepShape | None = None,  # for tunables.copy_budget
    counted: Residency | None = None,  # the experts the budget prices (adjuster.decide)
    measured: float = 0.0,  # copies per decode step lately (adjuster.decide)
    costs: CostView | None = None,  # for elastic_rule "cost" (payoff.py)
) -> ChangeList:
    decision = decide(
        kv.shortfall_in_expert_pages(kv_pages_short),
        allocator.num_free(PageType.EXPERT),
        ranking,
        residency.resident_sets(),
        tunables,
        step,
        counted,
        measured,
        costs,
    )
    if evict_only:
        decision = AdjusterDecision(evict=decision.evict)
    changes = reserve(decision, allocator, tunables)
    residency.apply(changes, last_step=last_step)
    return changes


class ElasticBoundary:
    """The engine's side of moving the boundary, under the policy in force (`policy`, which
    a live push replaces)."""

    def __init__(
        self,
        policy: PolicyState,
        allocator: PageAllocator,
        kv: KVCacheManager,
        residency: ResidencyTable,
        moe: MoEBackend,  # read: its routing counts price the cost rule (live_routing.py)
        copy_control: CopyControl,
        step_cost: StepCostMeter,
        max_num_seqs: int,
        top_k: int,
        evict_to_admit: bool = True,
    ):
        self.policy = policy
        self.step_cost = step_cost
        self.live = LiveRouting()  # recent routing, the cost rule's prices
        self._hottest_key: tuple | None = None  # (residency version, ranking) of _hottest
        self._hottest = 0.0
        self.allocator = allocator
        self.kv = kv
        self.residency = residency
        self.moe = moe
        self.copy_control = copy_control
        self.max_num_seqs = max_num_seqs
        self.top_k = top_k
        self.evict_to_admit = evict_to_admit

    def move(
        self,
        kv_pages_short: int,
        round: RoundState,
        evict_only: bool = False,
        apply_copy_budget: bool = True,
    ) -> ChangeList:
        """After (or, `evict_only`, inside) the scheduling round `round`: its previous step's
        forward, the last that could read an evicted expert, has completed."""
        # The copy budget's decode step: one token per running request, and one more after
        # a round that left requests waiting (the room is for the next of them, and the
        # admission cap must then let it in). Not applied with nothing running (else a
        # waiting request the budget keeps out would wait forever) nor when asked (a lone
        # request short of pages, scheduler.py).
        step = costs = None
        admitting = not evict_only and round.num_waiting > 0
        batch = min(round.num_running + admitting, self.max_num_seqs)
        asks = self._asks_to_evict(kv_pages_short)
        demand = evict_only or kv_pages_short > 0 or round.num_waiting > 0
        if apply_copy_budget and round.num_running:
            step = StepShape(batch, self.top_k)
            if asks:  # priced only when the rules would evict
                costs = self.costs(batch, round.num_running, demand, round.step)
        # With every expert resident and no pages wanted (the cost rule then evicts none,
        # not even for headroom), no order is read: live routing is not refreshed (a read
        # and a ranking of every layer's experts, a few ms at 48 x 128 on the host) in
        # rounds where the boundary cannot move.
        still = self.residency.fully_resident() and not (asks and demand)
        ranking = self.policy.ranking if still else self.order(round.step)
        return move_boundary(
            kv_pages_short, self.allocator, self.kv, self.residency, ranking,
            self.policy.tunables, round.step - 1, evict_only=evict_only, step=step,
            counted=self.copy_control.start_resident, measured=self.copy_control.measured,
            costs=costs,
        )  # fmt: skip

    def order(self, step: int) -> HotnessRanking:
        """The ranking that orders evictions (coldest first) and loads (hottest first): the
        policy's, except under the cost rule once live routing has a full window. The cost
        rule prices each expert by recent routing; ordered by a ranking that routing has
        since left, it would reach an expert that is hot now while colder ones stay, refuse
        it, and end the round there (the first refusal ends it), and admission would stop
        at the hottest offloaded expert's price: with an offline ranking profiled on a few
        prompts that held admission in most rounds that asked (docs/benchmarks.md). The
        offline ranking seeds the order until then. With a
        copy budget the order stays the ranking's: the budget's sum and its admission cap
        price by the ranking, and must count the experts the adjuster offloads."""
        t = self.policy.tunables
        if memory_policy(t).prices_copies and t.copy_budget <= 0:
            live = self.live.ranking(self.moe, step)
            if live is not None:
                return live
        return self.policy.ranking

    def _asks_to_evict(self, kv_pages_short: int) -> bool:
        free = self.allocator.num_free(PageType.EXPERT)
        short = self.kv.shortfall_in_expert_pages(kv_pages_short)
        return num_to_evict(short, free, self.policy.tunables) > 0

    def costs(self, batch: int, num_running: int, demand: bool, step: int) -> CostView | None:
        """What the cost rule prices an eviction with now (None under the paper rule):
        the measured step cost and step mix, the copies per step (expected from recent
        routing, else the ranking, over every offloaded expert and the mix, scaled by
        copy_scale, or measured, the larger) and the batch one eviction's pages buy
        (EXPERT_MATRICES over what a running request holds)."""
        t = self.policy.tunables
        if not memory_policy(t).prices_copies:
            return None
        prices = self.live.ranking(self.moe, step)
        shares = prices or self.policy.ranking
        mix = self.step_cost.mix()
        resident = self.residency.resident_sets()
        scale = self.copy_scale(shares, resident, num_running)
        expected = expected_copies(shares, resident, StepShape(max(batch, 1), self.top_k, mix))
        copies = max(scale * expected, self.copy_control.measured)
        per_request = self.kv.held_in_expert_pages() / num_running if num_running else 0.0
        return CostView(
            cost=self.step_cost.cost(),
            batch=batch,
            copies=copies,
            batch_per_eviction=EXPERT_MATRICES / max(per_request, 1.0),
            demand=demand,
            tpot_slo_s=t.tpot_slo_ms / 1e3 if t.tpot_slo_ms else None,
            prices=prices,
            recent_step_s=self.step_cost.recent_step_s,
            mix=mix,
            copy_scale=scale,
        )

    def copy_scale(self, shares: HotnessRanking, resident: Residency, num_running: int) -> float:
        """The copies decode steps made lately over those `shares` expect of the experts
        offloaded now at the running batch, within [1, MAX_COPY_SCALE] (payoff.py says why
        not below 1); 1 until a decode step with experts offloaded was measured."""
        measured = self.copy_control.measured
        if measured <= 0 or num_running < 1:
            return 1.0
        expected = expected_copies(shares, resident, StepShape(num_running, self.top_k))
        if expected <= 0:  # nothing offloaded is expected to be routed: nothing to scale
            return 1.0
        return min(max(measured / expected, 1.0), MAX_COPY_SCALE)

    def admit_limit(self, round: RoundState) -> int:
        """Elastic with a copy budget: the batch up to which the experts offloaded now stay
        within it (copy_budget.py); else max_num_seqs. Under the cost rule, no one more is
        admitted while the hottest offloaded expert would no longer pay for its pages at
        this batch: the pages that finishing requests free then go back to experts (the
        grow rule) instead of to a larger batch whose copies cost more than it gains."""
        limit = self.copy_control.limit(
            self.policy.tunables, self.policy.ranking, self.residency, round.num_running
        )
        if round.num_running and not self._hottest_offloaded_pays(
            round.num_running + 1, round.step
        ):
            return min(limit, round.num_running)
        return limit

    def _hottest_offloaded_pays(self, batch: int, step: int) -> bool:
        t = self.policy.tunables
        if not memory_policy(t).prices_copies or self.residency.fully_resident():
            return True  # (fully resident: nothing to bring back, live routing left unread)
        prices = self.live.ranking(self.moe, step)
        hottest = self._hottest_offloaded_share(prices or self.policy.ranking)
        view = self.costs(batch, batch - 1, demand=True, step=step)
        # (past the TPOT SLO nothing pays: with experts offloaded, pages go back to them)
        dc = route_probability(hottest, StepShape(batch, self.top_k, view.mix))
        return eviction_pays(view, 0, 0.0, dc)

    def _hottest_offloaded_share(self, ranking: HotnessRanking) -> float:
        """The largest routing share among offloaded experts (at least one is); asked every
        round that has requests waiting, so kept until the residency or ranking changes."""
        key = (self.residency.residency_version, ranking)
        if (
            self._hottest_key is None
            or self._hottest_key[0] != key[0]
            or self._hottest_key[1] is not ranking
        ):
            shares = [
                ranking.share(layer, e)
                for layer, here in enumerate(self.residency.resident_sets())
                for e in range(ranking.num_experts)
                if e not in here
            ]
            self._hottest = max(shares)
            self._hottest_key = key
        return self._hottest

    def make_room(self, kv_pages_lacking: int, round: RoundState) -> int:
        """Elastic, inside a scheduling round: evict experts now so that a running request
        is not preempted; returns the KV pages gained (0 once expert_offload_limit or the
        copy budget binds). A lone running request: the budget yields. Without
        evict_to_admit only a lone request gets room here (others are preempted, as vLLM
        does): preempting it would free nothing for it, and the grow rule would bring the
        evicted experts back before it regrew, for ever."""
        lone = round.num_running == 1
        if not (self.evict_to_admit or lone):
            return 0
        before = self.allocator.num_free(PageType.KV)
        gained = 0
        # An eviction that needs one more loading slot gives its pages to the slot, not to
        # KV (device_copy.py): ask again for what still lacks while evictions still come.
        while gained < kv_pages_lacking:
            changes = self.move(
                kv_pages_lacking - gained, round, evict_only=True, apply_copy_budget=not lone
            )
            gained = self.allocator.num_free(PageType.KV) - before
            if not changes.evict:
                break
        return gained
