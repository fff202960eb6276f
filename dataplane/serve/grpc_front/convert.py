"""Protos <-> the data plane's values; the only module that knows both.

Reading a request validates it: a GenerateRequest that converts is one the engine will
accept (save for the pool-dependent fit, which only the engine thread can judge), and a
bad field raises InvalidArgument naming it as the proto spells it.
"""

from __future__ import annotations

from rimuru.dataplane.engine.sched.request import SamplingParams
from rimuru.dataplane.model.tokenizer import Tokenizer
from rimuru.dataplane.serve.plane.errors import FailedPrecondition, InvalidArgument
from rimuru.dataplane.serve.plane.events import (
    EngineSnapshot,
    FinishedEvent,
    GenerateSpec,
    ModelInfo,
    PolicyChange,
)
from rimuru.policy_proto import ranking_from_layers, tunables_from_proto
from rimuru.v1 import control_pb2 as cpb
from rimuru.v1 import inference_pb2 as pb

MAX_REQUEST_ID_CHARS = 256
DEFAULT_MAX_TOKENS = SamplingParams().max_tokens
FINISH_REASONS = {
    "length": pb.FINISH_REASON_LENGTH,
    "stopped": pb.FINISH_REASON_STOP,
    "aborted": pb.FINISH_REASON_ABORT,
}


def generate_spec(
    request: pb.GenerateRequest,
    info: ModelInfo,
    tokenizer: Tokenizer | None,
    arrival_time: float,
) -> GenerateSpec:
    if len(request.request_id) > MAX_REQUEST_ID_CHARS:
        raise InvalidArgument(
            "request_id", f"is {len(request.request_id)} characters; at most {MAX_REQUEST_ID_CHARS}"
        )
    prompt = _prompt(request, info, tokenizer)
    params = sampling_params(request.sampling, request.HasField("sampling"))
    total = len(prompt) + params.max_tokens
    if total > info.max_model_len:
        raise InvalidArgument(
            "sampling.max_tokens",
            f"prompt ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) = {total} exceeds "
            f"the model's context of {info.max_model_len} tokens: shorten the prompt or set "
            f"max_tokens <= {max(0, info.max_model_len - len(prompt))}",
        )
    return GenerateSpec(request.request_id, tuple(prompt), params, arrival_time)


def _prompt(request: pb.GenerateRequest, info: ModelInfo, tokenizer: Tokenizer | None) -> list[int]:
    which = request.WhichOneof("input")
    if which is None:
        raise InvalidArgument("input", "give the prompt as `text` or as `token_ids`")
    if which == "text":
        if tokenizer is None:
            raise FailedPrecondition(
                f"text: model {info.model_name!r} has no tokenizer on this server; "
                f"send token_ids instead"
            )
        ids = tokenizer.encode(request.text)
        if not ids:
            raise InvalidArgument("text", "is empty: give at least one character")
        return ids
    ids = list(request.token_ids.ids)
    if not ids:
        raise InvalidArgument("token_ids.ids", "is empty: give at least one token id")
    for i, t in enumerate(ids):
        if not 0 <= t < info.vocab_size:
            raise InvalidArgument(
                f"token_ids.ids[{i}]", f"{t} is outside the vocabulary [0, {info.vocab_size})"
            )
    return ids


def sampling_params(msg: pb.SamplingParams, present: bool = True) -> SamplingParams:
    """Proto -> engine params; unset optional fields take the engine's defaults."""
    if not present:
        return SamplingParams()
    fields = {
        "max_tokens": msg.max_tokens if msg.HasField("max_tokens") else DEFAULT_MAX_TOKENS,
        "stop_token_ids": tuple(msg.stop_token_ids),
        "ignore_eos": msg.ignore_eos,
    }
    if msg.HasField("temperature"):
        fields["temperature"] = msg.temperature
    if msg.HasField("top_k"):
        fields["top_k"] = msg.top_k
    if msg.HasField("top_p"):
        fields["top_p"] = msg.top_p
    if msg.HasField("seed"):
        fields["seed"] = msg.seed
    try:
        return SamplingParams(**fields)
    except ValueError as exc:
        # SamplingParams names its field first ("top_p must lie in ..."): prefix the path.
        name = str(exc).split(" ", 1)[0]
        field = f"sampling.{name}" if name in fields else "sampling"
        raise InvalidArgument(field, str(exc)) from None


def sampling_to_proto(p: SamplingParams) -> pb.SamplingParams:
    msg = pb.SamplingParams(
        temperature=p.temperature,
        top_k=p.top_k,
        top_p=p.top_p,
        max_tokens=p.max_tokens,
        stop_token_ids=list(p.stop_token_ids),
        ignore_eos=p.ignore_eos,
    )
    if p.seed is not None:
        msg.seed = p.seed
    return msg


def final_response(request_id: str, event: FinishedEvent) -> pb.GenerateResponse:
    u, t = event.usage, event.timing
    return pb.GenerateResponse(
        request_id=request_id,
        final=pb.GenerateFinal(
            finish_reason=FINISH_REASONS.get(event.finish_reason, pb.FINISH_REASON_UNSPECIFIED),
            usage=pb.Usage(
                prompt_tokens=u.prompt_tokens,
                completion_tokens=u.completion_tokens,
                num_preemptions=u.num_preemptions,
                cached_tokens=u.cached_tokens,
            ),
            timing=pb.Timing(
                queue_seconds=t.queue_seconds,
                time_to_first_token_seconds=t.time_to_first_token_seconds,
                mean_inter_token_seconds=t.mean_inter_token_seconds,
                e2e_seconds=t.e2e_seconds,
            ),
        ),
    )


def model_info_response(info: ModelInfo) -> pb.ModelInfoResponse:
    return pb.ModelInfoResponse(
        model_name=info.model_name,
        preset=info.preset,
        dtype=info.dtype,
        vocab_size=info.vocab_size,
        max_model_len=info.max_model_len,
        num_layers=info.num_layers,
        hidden_size=info.hidden_size,
        num_experts=info.num_experts,
        num_experts_per_token=info.num_experts_per_token,
        moe_intermediate_size=info.moe_intermediate_size,
        num_kv_heads=info.num_kv_heads,
        head_dim=info.head_dim,
        kv_block_size=info.kv_block_size,
        eos_token_ids=list(info.eos_token_ids),
        async_scheduling=info.async_scheduling,
    )


def engine_stats_response(s: EngineSnapshot) -> pb.EngineStatsResponse:
    return pb.EngineStatsResponse(
        num_requests_running=s.num_requests_running,
        num_requests_waiting=s.num_requests_waiting,
        num_pool_pages=s.num_pool_pages,
        num_free_pages=s.num_free_pages,
        num_kv_pages=s.num_kv_pages,
        num_expert_pages=s.num_expert_pages,
        kv_cache_usage_perc=s.kv_cache_usage_perc,
        num_experts_resident=list(s.num_experts_resident),
        num_expert_evictions=s.num_expert_evictions,
        num_expert_loads=s.num_expert_loads,
        bytes_host_to_device=s.bytes_host_to_device,
        num_preemptions=s.num_preemptions,
        predictor_hit_rate=s.predictor_hit_rate,
        policy_version=s.policy_version,
        policy_mode=s.policy_mode,
    )


def policy_change(update: cpb.PolicyUpdate) -> PolicyChange:
    """A pushed version as the engine's values; ValueError (-> NACK) if it does not convert."""
    tunables = tunables_from_proto(update.policy.tunables)
    ranking = None
    if update.HasField("ranking"):
        ref = update.ranking.ref
        source = f"control plane: {ref.id} v{ref.version}"
        ranking = ranking_from_layers(update.ranking.layers, source)
    return PolicyChange(update.version, tunables, ranking)
