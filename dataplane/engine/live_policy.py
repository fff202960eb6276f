"""A policy version applied live, between two steps: tunables and a hotness ranking, as one
change that is checked before anything moves and, if the new start-up residency cannot be
loaded, rolled back whole (a NACKed push must leave the engine as it was: 11-30, a push
whose ranking reload failed had left the new tunables in force and every expert released,
and the next request failed the engine).

A mixin of `Engine`, as setup.py's EngineSetup: it reads the engine's tunables, ranking,
scheduler, experts, reclaim and copy_control.
"""

from __future__ import annotations

import dataclasses

from rimuru.policy import HotnessRanking, Tunables


class LivePolicy:
    def set_ranking(self, ranking: HotnessRanking) -> None:
        """Adopt a new hotness ranking. When idle, start-up residency is re-chosen from it
        (every policy); while serving, the elastic adjuster follows it from the next round."""
        self.apply_policy(self.tunables, ranking)

    def set_tunables(self, tunables: Tunables) -> None:
        """Apply new tunables between two steps (mode changes need a restart)."""
        self.apply_policy(tunables)

    def apply_policy(self, tunables: Tunables, ranking: HotnessRanking | None = None) -> None:
        """Both halves of a policy push, or neither: raises ValueError with nothing changed."""
        self._check_tunables(tunables)
        if ranking is not None and (ranking.num_layers, ranking.num_experts) != (
            self.ranking.num_layers,
            self.ranking.num_experts,
        ):
            raise ValueError(
                f"ranking is for {ranking.num_layers} layers x {ranking.num_experts} experts; "
                f"this model has {self.ranking.num_layers} x {self.ranking.num_experts}"
            )
        before = (self.tunables, self.ranking)
        if tunables.copy_budget != self.tunables.copy_budget:
            self.copy_control.budget_changed()
        self.tunables = tunables
        if ranking is None:
            return
        self.ranking = ranking
        if self.scheduler.has_unfinished():
            return  # serving: the adjuster follows the ranking from the next round
        try:
            self._reload_residency()
        except ValueError:
            self.tunables, self.ranking = before
            self._reload_residency()  # what was loaded before loads again
            raise

    def reset_residency(self) -> None:
        """Start-up residency again, from the policy in force; idle only (a benchmark's next
        run must not start from the last one's evictions)."""
        if self.scheduler.has_unfinished():
            raise RuntimeError("requests are in flight: residency can be reset only when idle")
        self._reload_residency()

    def _check_tunables(self, tunables: Tunables) -> None:
        if tunables.mode != self.tunables.mode:
            raise ValueError(
                f"mode {tunables.mode!r} differs from the running mode {self.tunables.mode!r}: "
                f"changing the memory policy needs a restart"
            )
        if tunables.pages_per_expert != self.tunables.pages_per_expert:
            raise ValueError("pages_per_expert is fixed by the model (w1, w3, w2)")
        self._check_buffer_fits(tunables)
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

    def _reload_residency(self) -> None:
        """Idle: start-up residency re-chosen from the tunables and ranking now in force."""
        # re-placing the start-up set is not serving traffic: the counters (exported as
        # metrics) stay as they were, also when the reload fails and is rolled back
        saved = dataclasses.replace(self.experts.counters)
        try:
            self.experts.release_all()
            self.reclaim.complete(self.step_id)
            self._load_initial_experts()
        finally:
            self.experts.counters = saved
