"""The engine's configuration as environment variables of `rimuru serve` (ConfigMap data).

Everything that shapes the engine lives here and only here; its hash is stamped on the
data-plane pod template, so changing it rolls the pods. One policy field belongs here
too: the engine cannot change its memory policy (`mode`) while it runs (it NACKs such a
push), so new pods must start with it. The live policy fields
(`LIVE_KEYS`) are here as well, so that a pod starts with the spec's values rather than
`rimuru serve`'s defaults (which also size its loading buffers: a spec with
`loadingBufferSlots: 4` and `expertOffloadLimit: 2` crashloops on a default limit above 4),
but they stay out of the hash: changing them is a push, not a rollout.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from rimuru.operator.naming import MODEL_MOUNT
from rimuru.operator.spec import DeploymentSpec
from rimuru.policy import Tunables


def engine_config(spec: DeploymentSpec) -> dict[str, str]:
    """Environment of `rimuru serve` that describes the engine (ConfigMap data)."""
    model, engine = spec.model, spec.engine
    config = {"RIMURU_DTYPE": model.dtype}
    if model.preset is not None:
        config["RIMURU_PRESET"] = model.preset
    else:
        config["RIMURU_MODEL_PATH"] = f"{MODEL_MOUNT}/{model.path.lstrip('/')}"
    config["RIMURU_DEVICE"] = "cuda" if spec.data_plane.num_gpus > 0 else "cpu"
    if engine.memory_budget_bytes is not None:
        config["RIMURU_MEMORY_BUDGET_BYTES"] = str(engine.memory_budget_bytes)
    else:
        config["RIMURU_GPU_MEMORY_UTILIZATION"] = repr(engine.gpu_memory_utilization)
    config["RIMURU_MAX_NUM_SEQS"] = str(engine.max_num_seqs)
    config["RIMURU_MAX_NUM_BATCHED_TOKENS"] = str(engine.max_num_batched_tokens)
    if engine.loading_buffer_slots is not None:
        config["RIMURU_LOADING_BUFFER_SLOTS"] = str(engine.loading_buffer_slots)
    if engine.evict_to_admit is not None:
        config["RIMURU_EVICT_TO_ADMIT"] = "on" if engine.evict_to_admit else "off"
    if engine.enforce_eager is not None:
        config["RIMURU_ENFORCE_EAGER"] = "on" if engine.enforce_eager else "off"
    if engine.expert_copy is not None:
        config["RIMURU_EXPERT_COPY"] = engine.expert_copy
    if engine.cudagraph_mode is not None:
        config["RIMURU_CUDAGRAPH_MODE"] = engine.cudagraph_mode
    if engine.async_scheduling is not None:
        config["RIMURU_ASYNC_SCHEDULING"] = "on" if engine.async_scheduling else "off"
    if engine.max_model_len is not None:
        config["RIMURU_MAX_MODEL_LEN"] = str(engine.max_model_len)
    if engine.max_waiting is not None:
        config["RIMURU_MAX_WAITING"] = str(engine.max_waiting)
    if engine.fixed_expert_share is not None:
        config["RIMURU_FIXED_EXPERT_SHARE"] = repr(engine.fixed_expert_share)
    if engine.tensor_parallel_size > 1:
        config["RIMURU_TENSOR_PARALLEL_SIZE"] = str(engine.tensor_parallel_size)
    tunables = spec.policy.tunables
    config["RIMURU_POLICY_MODE"] = tunables.mode
    config.update(_live_policy(tunables))
    return config


def _live_policy(tunables: Tunables) -> dict[str, str]:
    """Start-up values of the live policy fields: in the ConfigMap, not in the hash."""
    return {
        "RIMURU_EXPERT_OFFLOAD_LIMIT": str(tunables.expert_offload_limit),
        "RIMURU_SHRINK_THRESHOLD": str(tunables.shrink_threshold),
        "RIMURU_GROW_THRESHOLD": str(tunables.grow_threshold),
        "RIMURU_MAX_GROW_PER_ROUND": str(tunables.max_grow_per_round),
        "RIMURU_COPY_BUDGET": repr(float(tunables.copy_budget)),
        "RIMURU_ELASTIC_RULE": tunables.elastic_rule,
        "RIMURU_TPOT_SLO_MS": repr(float(tunables.tpot_slo_ms)),
    }


LIVE_KEYS = frozenset(_live_policy(Tunables()))


def engine_config_hash(data: Mapping[str, str]) -> str:
    shaping = {k: v for k, v in data.items() if k not in LIVE_KEYS}
    canonical = json.dumps(shaping, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
