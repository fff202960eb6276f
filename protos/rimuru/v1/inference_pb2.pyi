from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_ABORT: _ClassVar[FinishReason]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_ABORT: FinishReason

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "seed", "max_tokens", "stop_token_ids", "ignore_eos")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    seed: int
    max_tokens: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    ignore_eos: bool
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., max_tokens: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., ignore_eos: _Optional[bool] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "text", "token_ids", "sampling")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    text: str
    token_ids: TokenIds
    sampling: SamplingParams
    def __init__(self, request_id: _Optional[str] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ...) -> None: ...

class TokenDelta(_message.Message):
    __slots__ = ("token_ids", "text")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "num_preemptions", "cached_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    num_preemptions: int
    cached_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., num_preemptions: _Optional[int] = ..., cached_tokens: _Optional[int] = ...) -> None: ...

class Timing(_message.Message):
    __slots__ = ("queue_seconds", "time_to_first_token_seconds", "mean_inter_token_seconds", "e2e_seconds")
    QUEUE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TIME_TO_FIRST_TOKEN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MEAN_INTER_TOKEN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    E2E_SECONDS_FIELD_NUMBER: _ClassVar[int]
    queue_seconds: float
    time_to_first_token_seconds: float
    mean_inter_token_seconds: float
    e2e_seconds: float
    def __init__(self, queue_seconds: _Optional[float] = ..., time_to_first_token_seconds: _Optional[float] = ..., mean_inter_token_seconds: _Optional[float] = ..., e2e_seconds: _Optional[float] = ...) -> None: ...

class GenerateFinal(_message.Message):
    __slots__ = ("finish_reason", "usage", "timing")
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    finish_reason: FinishReason
    usage: Usage
    timing: Timing
    def __init__(self, finish_reason: _Optional[_Union[FinishReason, str]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("request_id", "delta", "final")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    delta: TokenDelta
    final: GenerateFinal
    def __init__(self, request_id: _Optional[str] = ..., delta: _Optional[_Union[TokenDelta, _Mapping]] = ..., final: _Optional[_Union[GenerateFinal, _Mapping]] = ...) -> None: ...

class TokenizeRequest(_message.Message):
    __slots__ = ("text", "add_special_tokens")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    ADD_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    text: str
    add_special_tokens: bool
    def __init__(self, text: _Optional[str] = ..., add_special_tokens: _Optional[bool] = ...) -> None: ...

class TokenizeResponse(_message.Message):
    __slots__ = ("token_ids",)
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ModelInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelInfoResponse(_message.Message):
    __slots__ = ("model_name", "preset", "dtype", "vocab_size", "max_model_len", "num_layers", "hidden_size", "num_experts", "num_experts_per_token", "moe_intermediate_size", "num_kv_heads", "head_dim", "kv_block_size", "eos_token_ids", "async_scheduling")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    PRESET_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_EXPERTS_FIELD_NUMBER: _ClassVar[int]
    NUM_EXPERTS_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    MOE_INTERMEDIATE_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    ASYNC_SCHEDULING_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    preset: str
    dtype: str
    vocab_size: int
    max_model_len: int
    num_layers: int
    hidden_size: int
    num_experts: int
    num_experts_per_token: int
    moe_intermediate_size: int
    num_kv_heads: int
    head_dim: int
    kv_block_size: int
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    async_scheduling: bool
    def __init__(self, model_name: _Optional[str] = ..., preset: _Optional[str] = ..., dtype: _Optional[str] = ..., vocab_size: _Optional[int] = ..., max_model_len: _Optional[int] = ..., num_layers: _Optional[int] = ..., hidden_size: _Optional[int] = ..., num_experts: _Optional[int] = ..., num_experts_per_token: _Optional[int] = ..., moe_intermediate_size: _Optional[int] = ..., num_kv_heads: _Optional[int] = ..., head_dim: _Optional[int] = ..., kv_block_size: _Optional[int] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., async_scheduling: _Optional[bool] = ...) -> None: ...

class EngineStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EngineStatsResponse(_message.Message):
    __slots__ = ("num_requests_running", "num_requests_waiting", "num_pool_pages", "num_free_pages", "num_kv_pages", "num_expert_pages", "kv_cache_usage_perc", "num_experts_resident", "num_expert_evictions", "num_expert_loads", "bytes_host_to_device", "num_preemptions", "predictor_hit_rate", "policy_version", "policy_mode")
    NUM_REQUESTS_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_REQUESTS_WAITING_FIELD_NUMBER: _ClassVar[int]
    NUM_POOL_PAGES_FIELD_NUMBER: _ClassVar[int]
    NUM_FREE_PAGES_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_PAGES_FIELD_NUMBER: _ClassVar[int]
    NUM_EXPERT_PAGES_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_USAGE_PERC_FIELD_NUMBER: _ClassVar[int]
    NUM_EXPERTS_RESIDENT_FIELD_NUMBER: _ClassVar[int]
    NUM_EXPERT_EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    NUM_EXPERT_LOADS_FIELD_NUMBER: _ClassVar[int]
    BYTES_HOST_TO_DEVICE_FIELD_NUMBER: _ClassVar[int]
    NUM_PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    PREDICTOR_HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    POLICY_MODE_FIELD_NUMBER: _ClassVar[int]
    num_requests_running: int
    num_requests_waiting: int
    num_pool_pages: int
    num_free_pages: int
    num_kv_pages: int
    num_expert_pages: int
    kv_cache_usage_perc: float
    num_experts_resident: _containers.RepeatedScalarFieldContainer[int]
    num_expert_evictions: int
    num_expert_loads: int
    bytes_host_to_device: int
    num_preemptions: int
    predictor_hit_rate: float
    policy_version: int
    policy_mode: str
    def __init__(self, num_requests_running: _Optional[int] = ..., num_requests_waiting: _Optional[int] = ..., num_pool_pages: _Optional[int] = ..., num_free_pages: _Optional[int] = ..., num_kv_pages: _Optional[int] = ..., num_expert_pages: _Optional[int] = ..., kv_cache_usage_perc: _Optional[float] = ..., num_experts_resident: _Optional[_Iterable[int]] = ..., num_expert_evictions: _Optional[int] = ..., num_expert_loads: _Optional[int] = ..., bytes_host_to_device: _Optional[int] = ..., num_preemptions: _Optional[int] = ..., predictor_hit_rate: _Optional[float] = ..., policy_version: _Optional[int] = ..., policy_mode: _Optional[str] = ...) -> None: ...
