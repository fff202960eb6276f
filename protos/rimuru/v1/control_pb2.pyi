from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODE_UNSPECIFIED: _ClassVar[Mode]
    MODE_RESIDENT: _ClassVar[Mode]
    MODE_FIXED: _ClassVar[Mode]
    MODE_ELASTIC: _ClassVar[Mode]

class ElasticRule(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ELASTIC_RULE_COST: _ClassVar[ElasticRule]
    ELASTIC_RULE_PAPER: _ClassVar[ElasticRule]
MODE_UNSPECIFIED: Mode
MODE_RESIDENT: Mode
MODE_FIXED: Mode
MODE_ELASTIC: Mode
ELASTIC_RULE_COST: ElasticRule
ELASTIC_RULE_PAPER: ElasticRule

class Tunables(_message.Message):
    __slots__ = ("mode", "expert_offload_limit", "shrink_threshold", "grow_threshold", "max_grow_per_round", "pages_per_expert", "online_hotness", "copy_budget", "elastic_rule", "tpot_slo_ms")
    MODE_FIELD_NUMBER: _ClassVar[int]
    EXPERT_OFFLOAD_LIMIT_FIELD_NUMBER: _ClassVar[int]
    SHRINK_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    GROW_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    MAX_GROW_PER_ROUND_FIELD_NUMBER: _ClassVar[int]
    PAGES_PER_EXPERT_FIELD_NUMBER: _ClassVar[int]
    ONLINE_HOTNESS_FIELD_NUMBER: _ClassVar[int]
    COPY_BUDGET_FIELD_NUMBER: _ClassVar[int]
    ELASTIC_RULE_FIELD_NUMBER: _ClassVar[int]
    TPOT_SLO_MS_FIELD_NUMBER: _ClassVar[int]
    mode: Mode
    expert_offload_limit: int
    shrink_threshold: int
    grow_threshold: int
    max_grow_per_round: int
    pages_per_expert: int
    online_hotness: bool
    copy_budget: float
    elastic_rule: ElasticRule
    tpot_slo_ms: float
    def __init__(self, mode: _Optional[_Union[Mode, str]] = ..., expert_offload_limit: _Optional[int] = ..., shrink_threshold: _Optional[int] = ..., grow_threshold: _Optional[int] = ..., max_grow_per_round: _Optional[int] = ..., pages_per_expert: _Optional[int] = ..., online_hotness: _Optional[bool] = ..., copy_budget: _Optional[float] = ..., elastic_rule: _Optional[_Union[ElasticRule, str]] = ..., tpot_slo_ms: _Optional[float] = ...) -> None: ...

class RankingRef(_message.Message):
    __slots__ = ("id", "version", "digest")
    ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    id: str
    version: int
    digest: str
    def __init__(self, id: _Optional[str] = ..., version: _Optional[int] = ..., digest: _Optional[str] = ...) -> None: ...

class LayerRanking(_message.Message):
    __slots__ = ("layer", "expert_ids", "probabilities")
    LAYER_FIELD_NUMBER: _ClassVar[int]
    EXPERT_IDS_FIELD_NUMBER: _ClassVar[int]
    PROBABILITIES_FIELD_NUMBER: _ClassVar[int]
    layer: int
    expert_ids: _containers.RepeatedScalarFieldContainer[int]
    probabilities: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, layer: _Optional[int] = ..., expert_ids: _Optional[_Iterable[int]] = ..., probabilities: _Optional[_Iterable[float]] = ...) -> None: ...

class Ranking(_message.Message):
    __slots__ = ("ref", "deployment", "layers")
    REF_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    ref: RankingRef
    deployment: str
    layers: _containers.RepeatedCompositeFieldContainer[LayerRanking]
    def __init__(self, ref: _Optional[_Union[RankingRef, _Mapping]] = ..., deployment: _Optional[str] = ..., layers: _Optional[_Iterable[_Union[LayerRanking, _Mapping]]] = ...) -> None: ...

class Policy(_message.Message):
    __slots__ = ("deployment", "version", "tunables", "ranking", "created_unix_seconds", "reason")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TUNABLES_FIELD_NUMBER: _ClassVar[int]
    RANKING_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    version: int
    tunables: Tunables
    ranking: RankingRef
    created_unix_seconds: float
    reason: str
    def __init__(self, deployment: _Optional[str] = ..., version: _Optional[int] = ..., tunables: _Optional[_Union[Tunables, _Mapping]] = ..., ranking: _Optional[_Union[RankingRef, _Mapping]] = ..., created_unix_seconds: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...

class GetPolicyRequest(_message.Message):
    __slots__ = ("deployment",)
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    def __init__(self, deployment: _Optional[str] = ...) -> None: ...

class SetPolicyRequest(_message.Message):
    __slots__ = ("deployment", "tunables", "expected_version")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    TUNABLES_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    tunables: Tunables
    expected_version: int
    def __init__(self, deployment: _Optional[str] = ..., tunables: _Optional[_Union[Tunables, _Mapping]] = ..., expected_version: _Optional[int] = ...) -> None: ...

class UploadRankingRequest(_message.Message):
    __slots__ = ("deployment", "ranking_id", "layers")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    RANKING_ID_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    ranking_id: str
    layers: _containers.RepeatedCompositeFieldContainer[LayerRanking]
    def __init__(self, deployment: _Optional[str] = ..., ranking_id: _Optional[str] = ..., layers: _Optional[_Iterable[_Union[LayerRanking, _Mapping]]] = ...) -> None: ...

class UploadRankingResponse(_message.Message):
    __slots__ = ("ranking", "policy")
    RANKING_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    ranking: RankingRef
    policy: Policy
    def __init__(self, ranking: _Optional[_Union[RankingRef, _Mapping]] = ..., policy: _Optional[_Union[Policy, _Mapping]] = ...) -> None: ...

class GetRankingRequest(_message.Message):
    __slots__ = ("deployment", "version")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    version: int
    def __init__(self, deployment: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class ListSubscribersRequest(_message.Message):
    __slots__ = ("deployment",)
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    def __init__(self, deployment: _Optional[str] = ...) -> None: ...

class Subscriber(_message.Message):
    __slots__ = ("node_id", "deployment", "applied_version", "pushed_version", "last_error", "last_nacked_version", "connected", "last_seen_unix_seconds")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    APPLIED_VERSION_FIELD_NUMBER: _ClassVar[int]
    PUSHED_VERSION_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    LAST_NACKED_VERSION_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    deployment: str
    applied_version: int
    pushed_version: int
    last_error: str
    last_nacked_version: int
    connected: bool
    last_seen_unix_seconds: float
    def __init__(self, node_id: _Optional[str] = ..., deployment: _Optional[str] = ..., applied_version: _Optional[int] = ..., pushed_version: _Optional[int] = ..., last_error: _Optional[str] = ..., last_nacked_version: _Optional[int] = ..., connected: _Optional[bool] = ..., last_seen_unix_seconds: _Optional[float] = ...) -> None: ...

class ListSubscribersResponse(_message.Message):
    __slots__ = ("subscribers",)
    SUBSCRIBERS_FIELD_NUMBER: _ClassVar[int]
    subscribers: _containers.RepeatedCompositeFieldContainer[Subscriber]
    def __init__(self, subscribers: _Optional[_Iterable[_Union[Subscriber, _Mapping]]] = ...) -> None: ...

class PolicyDiscoveryRequest(_message.Message):
    __slots__ = ("node_id", "deployment", "version_info", "response_nonce", "error_detail", "num_layers", "num_experts")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    VERSION_INFO_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_NONCE_FIELD_NUMBER: _ClassVar[int]
    ERROR_DETAIL_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    NUM_EXPERTS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    deployment: str
    version_info: int
    response_nonce: str
    error_detail: str
    num_layers: int
    num_experts: int
    def __init__(self, node_id: _Optional[str] = ..., deployment: _Optional[str] = ..., version_info: _Optional[int] = ..., response_nonce: _Optional[str] = ..., error_detail: _Optional[str] = ..., num_layers: _Optional[int] = ..., num_experts: _Optional[int] = ...) -> None: ...

class PolicyUpdate(_message.Message):
    __slots__ = ("version", "nonce", "policy", "ranking")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    RANKING_FIELD_NUMBER: _ClassVar[int]
    version: int
    nonce: str
    policy: Policy
    ranking: Ranking
    def __init__(self, version: _Optional[int] = ..., nonce: _Optional[str] = ..., policy: _Optional[_Union[Policy, _Mapping]] = ..., ranking: _Optional[_Union[Ranking, _Mapping]] = ...) -> None: ...

class LayerRoutingCounts(_message.Message):
    __slots__ = ("layer", "counts")
    LAYER_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    layer: int
    counts: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, layer: _Optional[int] = ..., counts: _Optional[_Iterable[int]] = ...) -> None: ...

class RoutingReport(_message.Message):
    __slots__ = ("node_id", "deployment", "layers")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    deployment: str
    layers: _containers.RepeatedCompositeFieldContainer[LayerRoutingCounts]
    def __init__(self, node_id: _Optional[str] = ..., deployment: _Optional[str] = ..., layers: _Optional[_Iterable[_Union[LayerRoutingCounts, _Mapping]]] = ...) -> None: ...

class ReportRoutingResponse(_message.Message):
    __slots__ = ("num_reports_accepted",)
    NUM_REPORTS_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    num_reports_accepted: int
    def __init__(self, num_reports_accepted: _Optional[int] = ...) -> None: ...
