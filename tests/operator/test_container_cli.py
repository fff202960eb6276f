"""What each child's container starts: its args and ConfigMap environment, read by the
CLI's own parser (`rimuru serve`, `rimuru controlplane`), give what the spec asked for."""

from __future__ import annotations

import argparse
import copy
import importlib
from dataclasses import replace

import pytest

from rimuru.operator.builders import (
    build_controlplane_deployment,
    build_dataplane_deployment,
    build_engine_config_map,
)
from tests.operator.test_builders import CONFIG, _changed, _parse


def _parse_args(module_name: str, args: list[str]) -> argparse.Namespace:
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return parser.parse_args(args)


def test_controlplane_container_args_are_its_cli(gpu_rd):
    pod = build_controlplane_deployment(_parse(gpu_rd), CONFIG)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"][0] == "controlplane"
    args = _parse_args("rimuru.controlplane.cli", container["args"][1:])
    assert (args.port, str(args.data_dir), args.token_file, args.dataplane_token_file) == (
        50052,
        "/var/lib/rimuru",
        "/var/run/secrets/rimuru/token",
        "/var/run/secrets/rimuru/dataplane-token",
    )
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/var/lib/rimuru", "/var/run/secrets/rimuru"} <= mounts
    # Both tokens, each under the file name its flag reads.
    (token_volume,) = [v for v in pod["volumes"] if v["name"] == "token"]
    files = {
        source["secret"]["name"]: source["secret"]["items"][0]["path"]
        for source in token_volume["projected"]["sources"]
    }
    assert files == {"qwen-moe-token": "token", "qwen-moe-dataplane-token": "dataplane-token"}


def test_dataplane_pod_is_what_rimuru_serve_reads(gpu_rd, monkeypatch):
    """The pod's args and its ConfigMap environment, read by `rimuru serve`'s own parser,
    give the engine the spec asked for."""
    spec = _parse(gpu_rd)
    pod = build_dataplane_deployment(spec, CONFIG)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    for key, value in build_engine_config_map(spec)["data"].items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("RIMURU_NODE_ID", "qwen-moe-dataplane-7d9f-abcde")  # the fieldRef
    assert container["args"][0] == "serve"
    args = _parse_args("rimuru.dataplane.serve.cli", container["args"][1:])
    assert (args.port, args.metrics_port, args.http_port) == (50051, 9464, 8000)
    assert (args.control_plane, args.deployment) == ("qwen-moe-controlplane:50052", "qwen-moe")
    assert args.node_id == "qwen-moe-dataplane-7d9f-abcde"
    from rimuru.dataplane.serve.cli import engine_config as serve_engine_config

    engine = serve_engine_config(args)
    assert (engine.model, engine.dtype, engine.device) == (
        "/models/Qwen1.5-MoE-A2.7B",
        "bfloat16",
        "cuda",
    )
    assert (engine.gpu_memory_utilization, engine.memory_budget) == (0.9, None)
    assert (engine.max_num_seqs, engine.max_num_batched_tokens) == (256, 8192)
    assert engine.tunables.mode == "elastic"


@pytest.mark.parametrize("grace, drain", [(120, 110), (60, 50), (10, 0), (0, 0)])
def test_the_pod_grace_period_covers_the_drain_and_the_exit(gpu_rd, grace, drain):
    rd = _changed(gpu_rd, "dataPlane.terminationGracePeriodSeconds", grace)
    pod = build_dataplane_deployment(_parse(rd), CONFIG)["spec"]["template"]["spec"]
    args = _parse_args("rimuru.dataplane.serve.cli", pod["containers"][0]["args"][1:])
    assert (pod["terminationGracePeriodSeconds"], args.drain_grace_seconds) == (grace, drain)


def test_max_waiting_reaches_rimuru_serve(tiny_rd, monkeypatch):
    assert "RIMURU_MAX_WAITING" not in build_engine_config_map(_parse(tiny_rd))["data"]
    data = build_engine_config_map(_parse(_changed(tiny_rd, "engine.maxWaiting", 7)))["data"]
    for key, value in data.items():
        monkeypatch.setenv(key, value)
    assert _parse_args("rimuru.dataplane.serve.cli", []).max_waiting == 7


def test_memory_budget_reaches_rimuru_serve_in_bytes(tiny_rd, monkeypatch):
    for key, value in build_engine_config_map(_parse(tiny_rd))["data"].items():
        monkeypatch.setenv(key, value)
    from rimuru.dataplane.serve.cli import engine_config as serve_engine_config

    engine = serve_engine_config(_parse_args("rimuru.dataplane.serve.cli", []))
    assert (engine.model, engine.device, engine.memory_budget) == ("tiny", "cpu", 512 * 2**20)


def test_loading_buffer_slots_reach_the_engine_config(tiny_rd):
    without = copy.deepcopy(tiny_rd)
    del without["spec"]["engine"]["loadingBufferSlots"]
    assert "RIMURU_LOADING_BUFFER_SLOTS" not in build_engine_config_map(_parse(without))["data"]


@pytest.mark.parametrize(
    "field, value, env, env_value, attribute, engine_value",
    [
        # each value differs from the engine's default: it must really travel to the engine
        ("engine.enforceEager", True, "RIMURU_ENFORCE_EAGER", "on", "enforce_eager", True),
        ("engine.expertCopy", "host", "RIMURU_EXPERT_COPY", "host", "expert_copy", "host"),
        ("engine.evictToAdmit", False, "RIMURU_EVICT_TO_ADMIT", "off", "evict_to_admit", False),
        ("engine.cudagraphMode", "full_decode_only", "RIMURU_CUDAGRAPH_MODE", "full_decode_only",
         "cudagraph_mode", "full_decode_only"),
        ("engine.maxModelLen", 96, "RIMURU_MAX_MODEL_LEN", "96", "max_model_len", 96),
        ("engine.asyncScheduling", False, "RIMURU_ASYNC_SCHEDULING", "off",
         "async_scheduling", False),
        ("engine.fixedExpertShare", 0.25, "RIMURU_FIXED_EXPERT_SHARE", "0.25",
         "fixed_expert_share", 0.25),
    ],
)  # fmt: skip
def test_optional_engine_fields_reach_rimuru_serve_only_when_set(
    tiny_rd, monkeypatch, field, value, env, env_value, attribute, engine_value
):
    from rimuru.dataplane.serve.cli import engine_config as serve_engine_config

    assert env not in build_engine_config_map(_parse(tiny_rd))["data"]
    default = getattr(serve_engine_config(_parse_args("rimuru.dataplane.serve.cli", [])), attribute)
    assert default != engine_value
    data = build_engine_config_map(_parse(_changed(tiny_rd, field, value)))["data"]
    assert data[env] == env_value
    for key, value in data.items():
        monkeypatch.setenv(key, value)
    engine = serve_engine_config(_parse_args("rimuru.dataplane.serve.cli", []))
    assert getattr(engine, attribute) == engine_value


@pytest.mark.parametrize("rd_name", ["tiny_rd", "gpu_rd"])
def test_the_pod_starts_the_engine_the_spec_means(rd_name, request, monkeypatch):
    """The data-plane pod's argv and ConfigMap environment, read by `rimuru serve`'s own
    parser and builder, give exactly the EngineConfig the spec's values mean."""
    import os

    from rimuru.dataplane.engine.startup.config import EngineConfig
    from rimuru.dataplane.serve.cli import engine_config as serve_engine_config

    spec = _parse(request.getfixturevalue(rd_name))
    for name in [n for n in os.environ if n.startswith("RIMURU_")]:
        monkeypatch.delenv(name)
    for key, value in build_engine_config_map(spec)["data"].items():
        monkeypatch.setenv(key, value)
    (container,) = build_dataplane_deployment(spec, CONFIG)["spec"]["template"]["spec"][
        "containers"
    ]
    engine = serve_engine_config(_parse_args("rimuru.dataplane.serve.cli", container["args"][1:]))
    model, eng, has_gpu = spec.model, spec.engine, spec.data_plane.resources.get("limits", {})
    optional = {
        name: getattr(eng, name)
        for name in ("loading_buffer_slots", "evict_to_admit", "enforce_eager", "expert_copy",
                     "cudagraph_mode", "async_scheduling")
        if getattr(eng, name) is not None
    }  # fmt: skip
    assert engine == EngineConfig(
        model=model.preset if model.preset is not None else f"/models/{model.path.lstrip('/')}",
        dtype=model.dtype,
        device="cuda" if "nvidia.com/gpu" in has_gpu else "cpu",
        memory_budget=eng.memory_budget_bytes,
        gpu_memory_utilization=eng.gpu_memory_utilization,
        max_num_seqs=eng.max_num_seqs,
        max_num_batched_tokens=eng.max_num_batched_tokens,
        # online_hotness is the control plane's: the engine never reads it
        tunables=replace(spec.policy.tunables, online_hotness=False),
        **optional,
    )


def test_a_new_pod_starts_with_the_specs_live_policy(tiny_rd, monkeypatch):
    """rimuru serve's defaults (limit 8) would size loading buffers the spec does not have:
    with loadingBufferSlots 4 and expertOffloadLimit 2 the pods crashlooped."""
    rd = _changed(_changed(tiny_rd, "engine.loadingBufferSlots", 4), "policy.copyBudget", 1.5)
    rd = _changed(rd, "policy.tpotSloMs", 80.0)
    for key, value in build_engine_config_map(_parse(rd))["data"].items():
        monkeypatch.setenv(key, value)
    from rimuru.dataplane.serve.cli import engine_config as serve_engine_config

    tunables = serve_engine_config(_parse_args("rimuru.dataplane.serve.cli", [])).tunables
    assert (tunables.expert_offload_limit, tunables.copy_budget) == (2, 1.5)
    assert (tunables.elastic_rule, tunables.tpot_slo_ms) == ("cost", 80.0)


def test_the_retired_block_size_the_operator_takes_is_the_engines():
    # The operator's slim image does not import the data plane: it keeps its own copy.
    from rimuru.dataplane.memory.geometry import BLOCK_SIZE
    from rimuru.operator.spec import KV_BLOCK_SIZE

    assert KV_BLOCK_SIZE == BLOCK_SIZE
