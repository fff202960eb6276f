"""Engine configuration: immutable, explicit, validated once. Derived sizes live in
`budget.MemoryPlan`, never written back here."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from rimuru.dataplane.policies import memory_policy, policy_named
from rimuru.policy import Tunables

EXPERT_COPY_MODES = ("device", "host")  # expert_copy's values, the default first
# cudagraph_mode's values (vLLM's CUDAGraphMode names), the default first
CUDAGRAPH_MODES = ("full_and_piecewise", "full_decode_only")
_CUDA_DEVICE = re.compile(r"cuda(?::(\d+))?")


@dataclass(frozen=True)
class EngineConfig:
    model: str = "tiny"  # a preset name or a local Hugging Face directory
    dtype: str | None = None  # None = the model's own
    device: str = "cpu"
    seed: int = 0
    router_skew: float = 1.0  # presets only: Zipf exponent of expert popularity (0 = none)
    memory_budget: int | None = None  # bytes for everything the engine keeps on the device
    gpu_memory_utilization: float | None = None  # or a share of the device's memory
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None  # None = the model's context
    tunables: Tunables = field(default_factory=Tunables)
    fixed_expert_share: float = 0.5  # `fixed` policy: share of the pool given to experts
    loading_buffer_slots: int | None = None  # None = enough for the policy's offloading
    hotness_path: str | None = None  # offline ranking file; None = uniform until set_ranking()
    use_kernels: bool | None = None  # None = Triton kernels on CUDA, torch reference on CPU
    moe_path: str = "paged"  # "paged": read experts in place; "gather": copy first (ablation)
    # Where the Triton kernels run: norms, RoPE and the router's softmax and top-k as fused
    # kernels (model/ops.py). False keeps them in torch, 2-3x the launches per layer (for
    # step_profile.py's comparison).
    fused_layer_ops: bool = True
    activation_reserve: int | None = None  # None = measure with a profiling forward
    # Elastic: when a running request lacks KV pages inside a scheduling round, evict
    # experts (up to expert_offload_limit) before preempting anyone. More requests stay
    # running; the offloaded experts are then copied in on every step that routes to them.
    # False = preempt as vLLM does and move the boundary only between rounds, except for a
    # request running alone: preempting it would only recompute it against the same pool.
    evict_to_admit: bool = True
    # CUDA with Triton kernels: run the forward at every batch shape before serving, so no
    # kernel compiles mid-serving (warmup.py). False only to shorten start-up in tests.
    warmup: bool = True
    # CUDA with Triton kernels: decode-only steps replay CUDA graphs (cuda_graphs.py); with
    # expert_copy="host" only while every expert is resident. True = always eager, as vLLM's
    # --enforce-eager.
    enforce_eager: bool = False
    max_seq_len_to_capture: int = 8192  # longer contexts decode eagerly (vLLM's name)
    # Which steps are graphs, when graphs are on. "full_and_piecewise": decode-only steps
    # as whole graphs, the other steps (prompt chunks, long contexts) as piecewise graphs
    # with attention eager between the pieces (piecewise_graphs.py) — where every step can
    # be a graph (device copy-in, or the resident policy) and the memory plan has room.
    # "full_decode_only": the other steps run eagerly (a baseline to compare against).
    cudagraph_mode: str = "full_and_piecewise"
    # How offloaded experts reach the device for a step. "device" (default): a kernel
    # copies the routed ones into fixed slots, no host sync, so the step stays a CUDA
    # graph (device_copy.py says why that is worth its costs). "host": the host reads the
    # routing and copies, prefetching the next layer's predicted experts; a layer with
    # offloaded experts then syncs and runs eagerly.
    expert_copy: str = "device"
    # Ranks of one host splitting every layer (dataplane/parallel/): the budget flags are
    # per GPU; device "cuda" puts rank r on cuda:r.
    tensor_parallel_size: int = 1
    # Schedule and launch round n+1 before reading round n's tokens back (vLLM V1's async
    # scheduling): the host's work between two steps overlaps the device's (in_flight.py).
    # One device; fixed and elastic with device copy-in (host copies sync mid-step).
    # None = on wherever it can overlap anything (`schedules_async`): a CUDA device, one
    # rank, and device copy-in or the resident policy. On the CPU the host is the device.
    async_scheduling: bool | None = None
    # Automatic prefix caching (engine/sched/prefix_cache.py, vLLM's name): a request
    # reuses the KV pages of the longest cached chain of its prompt's full 16-token blocks.
    # None = on for attention-only models; hybrid models run without it (not built for
    # their GDN states), and say so at start-up.
    enable_prefix_caching: bool | None = None

    def __post_init__(self) -> None:
        check_device_name(self.device)
        if self.memory_budget is not None and self.gpu_memory_utilization is not None:
            raise ValueError("give either memory_budget or gpu_memory_utilization, not both")
        if self.memory_budget is not None and self.memory_budget <= 0:
            raise ValueError(f"memory_budget must be > 0 bytes, got {self.memory_budget}")
        if self.gpu_memory_utilization is not None and not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must lie in (0, 1], got {self.gpu_memory_utilization}"
            )
        # Refused before minutes of loading, not after: the device defaults to the CPU.
        if self.gpu_memory_utilization is not None and self.device == "cpu":
            raise ValueError(
                "gpu_memory_utilization needs a CUDA device: add --device cuda, or on the CPU "
                "give --memory-budget in bytes"
            )
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(
                f"max_model_len must be >= 1 token, got {self.max_model_len}; leave it unset "
                f"for the model's own context length"
            )
        if self.loading_buffer_slots is not None and self.loading_buffer_slots < 1:
            raise ValueError(
                f"loading_buffer_slots must be >= 1 expert, got {self.loading_buffer_slots}; "
                f"leave it unset for what the policy needs"
            )
        if not 0.0 <= self.fixed_expert_share <= 1.0:
            raise ValueError(
                f"fixed_expert_share must lie in [0, 1], got {self.fixed_expert_share}"
            )
        if self.moe_path not in ("paged", "gather"):
            raise ValueError(f"moe_path must be 'paged' or 'gather', got {self.moe_path!r}")
        if self.expert_copy not in EXPERT_COPY_MODES:
            raise ValueError(f"expert_copy must be 'host' or 'device', got {self.expert_copy!r}")
        if self.expert_copy == "device" and self.moe_path != "paged":
            raise ValueError(
                "moe_path='gather' copies experts from the host itself: give it "
                "expert_copy='host' (--expert-copy host)"
            )
        if self.cudagraph_mode not in CUDAGRAPH_MODES:
            raise ValueError(
                f"cudagraph_mode must be one of {', '.join(CUDAGRAPH_MODES)}, got "
                f"{self.cudagraph_mode!r}"
            )
        if self.max_seq_len_to_capture < 1:
            raise ValueError(
                f"max_seq_len_to_capture must be >= 1, got {self.max_seq_len_to_capture}"
            )
        if self.router_skew < 0:
            raise ValueError(f"router_skew must be >= 0, got {self.router_skew}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.tensor_parallel_size > 1 and self.device not in ("cpu", "cuda"):
            raise ValueError(
                f"with tensor_parallel_size > 1 give device cpu or cuda (rank r takes cuda:r), "
                f"not {self.device!r}; CUDA_VISIBLE_DEVICES chooses the GPUs"
            )

        if self.async_scheduling and not self._copies_on_the_device:
            raise ValueError(
                f"async_scheduling needs device copy-in under {self.tunables.mode!r}: host "
                f"copies read each layer's routing on the host mid-step; drop "
                f"--async-scheduling or give --expert-copy device"
            )
        if self.async_scheduling and self.tensor_parallel_size > 1:
            raise ValueError(
                "async_scheduling runs on one device: drop --async-scheduling or give "
                "--tensor-parallel-size 1"
            )

    @property
    def _copies_on_the_device(self) -> bool:
        """No step reads routing on the host mid-forward (what async scheduling needs)."""
        return not memory_policy(self.tunables).offloads or self.expert_copy == "device"

    @property
    def schedules_async(self) -> bool:
        """Whether the engine schedules round n+1 while round n runs (async_scheduling,
        or where that is None, a CUDA device with one rank, and device copy-in or the
        resident policy)."""
        if self.async_scheduling is not None:
            return self.async_scheduling
        return (
            self.device.startswith("cuda")
            and self.tensor_parallel_size == 1
            and self._copies_on_the_device
        )

    @property
    def policy(self) -> str:
        return self.tunables.mode

    def with_mode(self, mode: str) -> EngineConfig:
        """This config under another memory policy (bench and plan compare policies): the
        copy budget and the TPOT SLO belong to elastic alone, so the other modes drop them."""
        t = self.tunables
        elastic = policy_named(mode, t.elastic_rule).moves_boundary
        return replace(self, tunables=replace(
            t, mode=mode, copy_budget=t.copy_budget if elastic else 0.0,
            tpot_slo_ms=t.tpot_slo_ms if elastic else 0.0,
        ))  # fmt: skip


def check_device_name(device: str) -> None:
    """Refuse a device string the engine cannot mean. Whether that device is on this machine
    is checked where the engine starts (`check_device_available`): a config is also built
    where it will not run (the operator checks a GPU pod's arguments on any machine)."""
    if device != "cpu" and _CUDA_DEVICE.fullmatch(device) is None:
        raise ValueError(f"device must be cpu, cuda or cuda:N (N = GPU index), got {device!r}")


def check_device_available(device: str) -> None:
    """Refuse a CUDA device this machine lacks, before any weights are read: torch would
    otherwise fail deep inside start-up ("Torch not compiled with CUDA enabled")."""
    match = _CUDA_DEVICE.fullmatch(device)
    if match is None:
        return
    import torch  # here, not at the top: the CLIs import this module for --help

    if not torch.cuda.is_available():
        why = (
            "this torch is built without CUDA"
            if torch.version.cuda is None
            else "no GPU is visible"
        )
        raise ValueError(f"device {device!r} needs a CUDA GPU, but {why}: use --device cpu")
    count = torch.cuda.device_count()
    if match.group(1) is not None and int(match.group(1)) >= count:
        raise ValueError(
            f"device {device!r} does not exist: {count} GPU(s) are visible, "
            f"cuda:0 to cuda:{count - 1}"
        )
