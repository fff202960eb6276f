"""`rimuru serve`: the gRPC data plane, until SIGTERM/SIGINT (then drain and exit).

Every flag also reads an environment variable, RIMURU_<FLAG> (e.g. RIMURU_PORT,
RIMURU_CONTROL_PLANE), so the operator's pods need no arguments; flags win over the
environment. The operator's ConfigMap names are read too (RIMURU_PRESET,
RIMURU_MODEL_PATH, RIMURU_MEMORY_BUDGET_BYTES, RIMURU_POLICY_MODE).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket

from rimuru.cli_args import port, positive_int
from rimuru.dataplane.engine.config import CUDAGRAPH_MODES, EXPERT_COPY_MODES
from rimuru.dataplane.memory.units import parse_bytes

log = logging.getLogger("rimuru.serve")
DEFAULT_PORT = 50052  # the control plane's default is 50051


def _env(*names: str, default: str | None = None) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            return value
    return default


def add_arguments(p: argparse.ArgumentParser) -> None:
    def option(flag: str, *extra_env: str, default=None, help: str = "", **kwargs) -> None:
        env = "RIMURU_" + flag.removeprefix("--").replace("-", "_").upper()
        names = (env, *extra_env)
        p.add_argument(
            flag,
            default=_env(*names, default=default),
            help=f"{help} (env {', '.join(names)})".strip(),
            **kwargs,
        )

    option("--host", default="[::]", help="bind address")
    option("--port", default=str(DEFAULT_PORT), type=port, help="gRPC port, 0 = any free port")
    option(
        "--model",
        "RIMURU_MODEL_PATH",
        "RIMURU_PRESET",
        default="tiny",
        help="preset name or local Hugging Face directory",
    )
    option("--device", default="cpu", help="cpu or cuda[:N]")
    option("--dtype", default=None, help="float32, bfloat16 or float16; default: the model's")
    option(
        "--memory-budget",
        "RIMURU_MEMORY_BUDGET_BYTES",
        help="bytes the engine may use on the device, e.g. 28.8GiB",
    )
    option("--gpu-memory-utilization", type=float, help="or a share of the GPU's memory")
    option("--max-num-seqs", default="256", type=int, help="requests in one batch, at most")
    option("--max-num-batched-tokens", default="2048", type=int, help="tokens per step, at most")
    option("--max-model-len", type=int, help="context length; default: the model's")
    option("--block-size", default="16", type=int, help="tokens per KV page (16)")
    option(
        "--mode",
        "RIMURU_POLICY_MODE",
        default="elastic",
        choices=("resident", "fixed", "elastic"),
        help="memory policy",
    )
    option("--expert-offload-limit", default="8", type=int, help="experts per layer off the device")
    option("--shrink-threshold", default="2", type=int, help="adjuster: evict below this")
    option("--grow-threshold", default="9", type=int, help="adjuster: load above this")
    option("--max-grow-per-round", default="5", type=int, help="adjuster: loads per round")
    option("--pages-per-expert", default="3", type=int, help="pool pages per expert (w1, w3, w2)")
    option("--copy-budget", default="0", type=float,
           help="elastic: expert copies per decode step the offloaded experts may cost "
           "(expected or measured, the larger); evictions stop and admission is capped there "
           "(0 = no budget)")  # fmt: skip
    option("--fixed-expert-share", default="0.5", type=float, help="fixed policy: pool share")
    option(
        "--evict-to-admit",
        default="on",
        help="on or off: elastic evicts experts inside a scheduling round before preempting a "
        "running request short of KV pages (off: preempt, move the boundary between rounds)",
    )
    option(
        "--expert-copy",
        default="device",
        choices=EXPERT_COPY_MODES,
        help="host: host-driven expert copies with prefetch; device: a kernel copies routed "
        "offloaded experts into fixed slots (graph-safe)",
    )
    option(
        "--enforce-eager",
        default="off",
        help="on or off: on = never replay CUDA graphs, decode or piecewise (vLLM's --enforce-eager)",
    )
    option(
        "--cudagraph-mode",
        default=CUDAGRAPH_MODES[0],
        choices=CUDAGRAPH_MODES,
        help="full_and_piecewise: decode steps as whole graphs, the others as piecewise "
        "graphs with eager attention; full_decode_only: the others eager",
    )
    option(
        "--loading-buffer-slots",
        type=int,
        help="experts per loading buffer; caps the live expert_offload_limit (default: "
        "enough for the start-up policy)",
    )
    option("--hotness", help="offline hotness ranking file (rimuru profile-hotness)")
    option("--seed", default="0", type=int, help="weights seed of presets")
    option(
        "--max-waiting",
        default="1024",
        type=int,
        help="requests that may wait to be scheduled (new or preempted); a request arriving "
        "when that many wait gets RESOURCE_EXHAUSTED (default: 1024; 0 = unbounded)",
    )
    option("--control-plane", help="HOST:PORT of the control plane to follow (default: none)")
    option("--deployment", default="default", help="deployment name at the control plane")
    option(
        "--node-id", default=socket.gethostname(), help="this replica's name at the control plane"
    )
    option(
        "--token-file",
        help="bearer token file: sent with routing reports (they move the control plane's "
        "online hotness ranking, so a control plane with a token requires it)",
    )
    option(
        "--control-plane-ca",
        help="PEM CA certificate of a control plane that serves TLS (default: plaintext)",
    )
    option("--report-interval", default="10", type=float, help="seconds between routing reports")
    option("--metrics-port", type=port, help="Prometheus /metrics port, 0 = any (default: off)")
    option("--drain-grace-seconds", default="30", type=float, help="SIGTERM: drain for this long")
    option("--threads", default="1", type=positive_int, help="torch CPU threads")
    option("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ...")


def run(args: argparse.Namespace) -> int:
    from rimuru.dataplane.engine.config import check_device_available

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    config = engine_config(args)  # a ValueError here is reported by rimuru.cli, exit 2
    # Here, not in engine_config (the operator reads a GPU pod's config on any machine), and
    # before the server starts: the engine would only fail in the background, after it.
    check_device_available(config.device)
    link = control_plane_link(args)
    import torch

    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    return asyncio.run(_serve(args, config, link))


def engine_config(args: argparse.Namespace):
    from rimuru.dataplane.engine.config import EngineConfig
    from rimuru.policy import Tunables

    if args.max_waiting is not None and args.max_waiting < 0:
        raise ValueError(f"--max-waiting must be >= 0; got {args.max_waiting}")
    if args.drain_grace_seconds < 0:
        raise ValueError(f"--drain-grace-seconds must be >= 0; got {args.drain_grace_seconds}")
    dtype = None if args.dtype in (None, "", "auto") else args.dtype
    return EngineConfig(
        model=args.model,
        dtype=dtype,
        device=args.device,
        seed=args.seed,
        memory_budget=parse_bytes(args.memory_budget) if args.memory_budget else None,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        block_size=args.block_size,
        fixed_expert_share=args.fixed_expert_share,
        loading_buffer_slots=args.loading_buffer_slots,
        hotness_path=args.hotness,
        evict_to_admit=_on_off("--evict-to-admit", args.evict_to_admit),
        enforce_eager=_on_off("--enforce-eager", args.enforce_eager),
        cudagraph_mode=args.cudagraph_mode,
        expert_copy=args.expert_copy,
        tunables=Tunables(
            mode=args.mode,
            expert_offload_limit=args.expert_offload_limit,
            shrink_threshold=args.shrink_threshold,
            grow_threshold=args.grow_threshold,
            max_grow_per_round=args.max_grow_per_round,
            pages_per_expert=args.pages_per_expert,
            copy_budget=args.copy_budget,
        ),
    )


_ON, _OFF = ("on", "true", "1", "yes"), ("off", "false", "0", "no")


def _on_off(flag: str, value: str) -> bool:
    """A switch from the command line or the environment (argparse does not check an
    environment default against `choices`, so both are checked here)."""
    text = str(value).strip().lower()
    if text in _ON or text in _OFF:
        return text in _ON
    raise ValueError(f"{flag} must be on or off (or true/false, 1/0, yes/no); got {value!r}")


def control_plane_link(args: argparse.Namespace):
    from rimuru.dataplane.serve.control import ControlPlaneLink

    if not args.control_plane:
        return None
    if ":" not in args.control_plane:
        raise ValueError(f"--control-plane must be HOST:PORT; got {args.control_plane!r}")
    if args.report_interval <= 0:
        raise ValueError(f"--report-interval must be > 0 seconds; got {args.report_interval}")
    token = None
    if args.token_file:
        from rimuru.dataplane.serve.policy_watch import read_token

        token = read_token(args.token_file)
    root_certificates = None
    if args.control_plane_ca:
        try:
            with open(args.control_plane_ca, "rb") as f:
                root_certificates = f.read()
        except OSError as exc:
            raise ValueError(
                f"cannot read --control-plane-ca {args.control_plane_ca}: {exc}"
            ) from exc
    return ControlPlaneLink(
        args.control_plane,
        args.deployment,
        args.node_id,
        report_interval_s=args.report_interval,
        token=token,
        root_certificates=root_certificates,
    )


async def _serve(args: argparse.Namespace, config, link) -> int:
    from rimuru.dataplane.serve.plane import FAILED
    from rimuru.dataplane.serve.server import create_server
    from rimuru.dataplane.serve.telemetry import PrometheusEndpoint

    endpoint = None
    if args.metrics_port is not None:
        endpoint = PrometheusEndpoint(args.host.strip("[]") or "::", args.metrics_port)
        log.info("metrics on :%d/metrics", endpoint.port)
    server, port, handle = await create_server(
        config,
        f"{args.host}:{args.port}",
        max_waiting=args.max_waiting or None,
        control_plane=link,
        metric_readers=[endpoint.reader] if endpoint else [],
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # An engine that dies while serving ends the process: the pod restarts, clients retry.
    handle.plane.on_state_change(lambda state: stop.set() if state == FAILED else None)
    await server.start()
    log.info("data plane on port %d (health NOT_SERVING until the model is warm)", port)
    starting = asyncio.create_task(handle.start())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    code = 0
    if starting.done() and starting.exception() is not None:
        log.error("the engine did not start: %s", starting.exception())
        code = 1
    elif starting.done():
        info = starting.result()
        log.info("serving %s (%s); health SERVING", info.model_name, config.tunables.mode)
        await stopping
        if handle.plane.state == FAILED:
            log.error("the engine failed while serving; exiting")
            code = 1
        else:
            log.info("stopping: draining for up to %.0f s", args.drain_grace_seconds)
    else:
        starting.cancel()
    aborted = await handle.shutdown(args.drain_grace_seconds)
    if aborted:
        log.warning("%d streams were aborted at the end of the grace period", aborted)
    if endpoint is not None:
        endpoint.close()
    return code
