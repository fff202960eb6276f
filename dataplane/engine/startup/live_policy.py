"""The policy in force, applied: start-up residency chosen from it, and a push (tunables and a
hotness ranking) applied live between two steps as one change that is checked before
anything moves and, if the new start-up residency cannot be loaded, rolled back whole (a
NACKed push must leave the engine as it was: new tunables left in force with every expert
released would fail the next request).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from rimuru.dataplane.engine.experts.copy_budget import CopyControl
from rimuru.dataplane.engine.experts.counters import ExpertCounters
from rimuru.dataplane.engine.experts.residency_table import ResidencyTable
from rimuru.dataplane.engine.sched.policy_state import PolicyState
from rimuru.dataplane.engine.sched.scheduler import Scheduler
from rimuru.dataplane.engine.startup.residency import initial_experts, max_offloaded
from rimuru.dataplane.engine.startup.setup import check_buffer_fits, check_offload_fits
from rimuru.dataplane.memory.allocator import PageAllocator
from rimuru.dataplane.memory.geometry import PageType
from rimuru.dataplane.memory.reclaim import DeferredReclaim
from rimuru.policy import HotnessRanking, Tunables
from rimuru.policy.tunables import EXPERT_MATRICES


class LivePolicy:
    def __init__(
        self,
        policy: PolicyState,
        scheduler: Scheduler,
        residency: ResidencyTable,
        counters: ExpertCounters,
        num_buffer_slots: int,  # experts a loading buffer holds (the copy-in's)
        allocator: PageAllocator,
        reclaim: DeferredReclaim,
        copy_control: CopyControl,
        fixed_expert_share: float,
        max_kv_tokens: Callable[[Tunables], int],  # tokens one request could hold under them
    ):
        self.policy = policy
        self.scheduler = scheduler
        self.residency = residency
        self.counters = counters
        self.num_buffer_slots = num_buffer_slots
        self.allocator = allocator
        self.reclaim = reclaim
        self.copy_control = copy_control
        self.fixed_expert_share = fixed_expert_share
        self.max_kv_tokens = max_kv_tokens

    def load_initial_experts(self) -> None:
        """Start-up residency (residency.py) from the policy in force, into free pages."""
        t, ranking = self.policy.tunables, self.policy.ranking
        # device copy-in's slots are pool pages: start-up residency leaves room for them
        slots = self.num_buffer_slots if self.residency.loading_slots is not None else 0
        chosen = initial_experts(
            t, ranking, self.allocator.num_free(PageType.EXPERT), self.fixed_expert_share, slots
        )
        offloaded = max_offloaded(chosen, ranking.num_layers, ranking.num_experts)
        check_offload_fits(t.mode, offloaded, self.num_buffer_slots)
        self.residency.load_initial(chosen, EXPERT_MATRICES)
        # The copy budget prices only experts resident now that the adjuster evicts later.
        self.copy_control.reset(self.residency.resident_sets(), ranking.num_experts)

    def check_buffer_fits(self, tunables: Tunables) -> None:
        check_buffer_fits(tunables, self.policy.ranking.num_experts, self.num_buffer_slots)

    def apply(self, tunables: Tunables, ranking: HotnessRanking | None, step: int) -> None:
        """Both halves of a policy push, or neither: raises ValueError with nothing changed.
        `step`: the last step launched. Under async scheduling its forward may still run
        (an abort can leave the scheduler empty with a step in flight); a reload is then
        safe as the adjuster's moves between rounds are: expert copies wait for the
        device's queued work (ResidencyTable.place) before they write freed pages."""
        self._check_tunables(tunables)
        current = self.policy.ranking
        if ranking is not None and (ranking.num_layers, ranking.num_experts) != (
            current.num_layers,
            current.num_experts,
        ):
            raise ValueError(
                f"ranking is for {ranking.num_layers} layers x {ranking.num_experts} experts; "
                f"this model has {current.num_layers} x {current.num_experts}"
            )
        before = dataclasses.replace(self.policy)
        if tunables.copy_budget != self.policy.tunables.copy_budget:
            self.copy_control.budget_changed()
        self.policy.tunables = tunables
        if ranking is None:
            return
        self.policy.ranking = ranking
        if self.scheduler.has_unfinished():
            return  # serving: the adjuster follows the ranking from the next round
        try:
            self._reload_residency(step)
        except ValueError:
            self.policy.tunables, self.policy.ranking = before.tunables, before.ranking
            self._reload_residency(step)  # what was loaded before loads again
            raise

    def reset_residency(self, step: int) -> None:
        """Start-up residency again, from the policy in force; idle only (a benchmark's next
        run must not start from the last one's evictions)."""
        if self.scheduler.has_unfinished():
            raise RuntimeError("requests are in flight: residency can be reset only when idle")
        self._reload_residency(step)

    def _check_tunables(self, tunables: Tunables) -> None:
        current = self.policy.tunables
        if tunables.mode != current.mode:
            raise ValueError(
                f"mode {tunables.mode!r} differs from the running mode {current.mode!r}: "
                f"changing the memory policy needs a restart"
            )
        self.check_buffer_fits(tunables)
        # A request was accepted because it fit; one that no longer could would wait at the
        # head of the queue for ever, and every request behind it with it.
        fits = self.max_kv_tokens(tunables)
        for request in [*self.scheduler.running, *self.scheduler.waiting]:
            need = len(request.prompt_token_ids) + request.params.max_tokens
            if need > fits:
                raise ValueError(
                    f"request {request.request_id!r} needs {need} tokens of KV cache, more than "
                    f"the {fits} these tunables leave room for (expert_offload_limit="
                    f"{tunables.expert_offload_limit}); once it has finished, push them again as "
                    f"a new version (a NACKed version is not pushed again)"
                )

    def _reload_residency(self, step: int) -> None:
        """Nothing scheduled: start-up residency re-chosen from the tunables and ranking now
        in force."""
        # re-placing the start-up set is not serving traffic: the counters (exported as
        # metrics) stay as they were, also when the reload fails and is rolled back
        saved = self.counters.snapshot()
        try:
            self.residency.release_all()
            self.reclaim.complete(step)
            self.load_initial_experts()
        finally:
            self.counters.restore(saved)
