"""`rimuru serve`: the gRPC data plane, until SIGTERM/SIGINT (then drain and exit).

Every flag also reads an environment variable, RIMURU_<FLAG> (e.g. RIMURU_PORT,
RIMURU_CONTROL_PLANE), so the operator's pods need no arguments; flags win over the
environment. The operator's ConfigMap names are read too (RIMURU_PRESET,
RIMURU_MODEL_PATH, RIMURU_MEMORY_BUDGET_BYTES, RIMURU_POLICY_MODE). The engine's flags
and their defaults are every engine command's (engine/flags.py).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket

from rimuru.cli_args import log_level, port, positive_int, target
from rimuru.dataplane.engine.flags import add_engine_arguments, engine_config_from_args
from rimuru.dataplane.engine.startup.config import EngineConfig

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
    add_engine_arguments(p, environ=os.environ)
    option(
        "--max-waiting",
        default="1024",
        type=int,
        help="requests that may wait to be scheduled (new or preempted); a request arriving "
        "when that many wait gets RESOURCE_EXHAUSTED (default: 1024; 0 = unbounded)",
    )
    option(
        "--control-plane",
        type=target,
        help="HOST:PORT of the control plane to follow (default: none)",
    )
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
    option(
        "--api-token-file",
        help="bearer token file for this server's own port: Inference calls (gRPC) need "
        "`authorization: Bearer <token>`; health and reflection stay open (default: open)",
    )
    option("--tls-cert", help="PEM certificate chain: serve TLS on the gRPC port (with --tls-key)")
    option("--tls-key", help="PEM private key of --tls-cert")
    option("--report-interval", default="10", type=float, help="seconds between routing reports")
    option("--metrics-port", type=port, help="Prometheus /metrics port, 0 = any (default: off)")
    option(
        "--http-port",
        type=port,
        help="OpenAI-compatible HTTP API port (/v1/completions, /v1/chat/completions, "
        "/v1/models, /health, /metrics), 0 = any (default: off)",
    )
    option(
        "--http-max-body-bytes",
        default=str(4 * 1024 * 1024),
        type=positive_int,
        help="HTTP: a larger request body is refused with 413 before it is read "
        "(default: 4 MiB, gRPC's message limit)",
    )
    option(
        "--http-max-connections",
        default="4096",
        type=positive_int,
        help="HTTP: open connections past this are answered 503 and closed at once "
        "(default: 4096, and at most half the process's file-descriptor limit)",
    )
    option(
        "--http-receive-timeout",
        default="30",
        type=float,
        help="HTTP: seconds a request head, and then its body, may take to arrive (default: 30)",
    )
    option(
        "--http-keep-alive-timeout",
        default="5",
        type=float,
        help="HTTP: seconds an idle keep-alive connection stays open (default: 5)",
    )
    option("--drain-grace-seconds", default="30", type=float, help="SIGTERM: drain for this long")
    option("--threads", default="1", type=positive_int, help="torch CPU threads")
    option(
        "--log-level",
        default="INFO",
        type=log_level,
        help="DEBUG, INFO, WARNING, ERROR or CRITICAL",
    )


def run(args: argparse.Namespace) -> int:
    from rimuru.dataplane.engine.startup.config import check_device_available

    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(message)s")
    config = engine_config(args)  # a ValueError here is reported by rimuru.cli, exit 2
    # Here, not in engine_config (the operator reads a GPU pod's config on any machine), and
    # before the server starts: the engine would only fail in the background, after it.
    check_device_available(config.device)
    import torch

    from rimuru.dataplane.engine.startup.capacity import check_before_loading

    # What the engine would refuse only in the background, after the port is open and with
    # exit 1, refused here: exit 2.
    check_before_loading(config, torch.device(config.device))
    link = control_plane_link(args)
    api_token, tls = own_port_security(args)
    limits = http_limits(args)
    raise_descriptor_limit()

    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    return asyncio.run(_serve(args, config, link, api_token, tls, limits))


def engine_config(args: argparse.Namespace) -> EngineConfig:
    if args.max_waiting is not None and args.max_waiting < 0:
        raise ValueError(f"--max-waiting must be >= 0; got {args.max_waiting}")
    if args.drain_grace_seconds < 0:
        raise ValueError(f"--drain-grace-seconds must be >= 0; got {args.drain_grace_seconds}")
    return engine_config_from_args(args)


def control_plane_link(args: argparse.Namespace):
    from rimuru.dataplane.serve.grpc_front.control import ControlPlaneLink

    if not args.control_plane:
        return None
    if args.report_interval <= 0:
        raise ValueError(f"--report-interval must be > 0 seconds; got {args.report_interval}")
    token = None
    if args.token_file:
        from rimuru.rpc import read_token

        token = read_token(args.token_file)
    root_certificates = None
    if args.control_plane_ca:
        from rimuru.rpc import read_root_certificates

        root_certificates = read_root_certificates(args.control_plane_ca, "--control-plane-ca")
    return ControlPlaneLink(
        args.control_plane,
        args.deployment,
        args.node_id,
        report_interval_s=args.report_interval,
        token=token,
        root_certificates=root_certificates,
    )


def own_port_security(args: argparse.Namespace):
    """(api token or None, TlsFiles or None) of this server's own gRPC port."""
    from rimuru.rpc import TlsFiles, read_token

    if bool(args.tls_cert) != bool(args.tls_key):
        raise ValueError("--tls-cert and --tls-key go together: give both or neither")
    tls = TlsFiles.read(args.tls_cert, args.tls_key) if args.tls_cert else None
    return (read_token(args.api_token_file) if args.api_token_file else None), tls


def http_limits(args: argparse.Namespace):
    from rimuru.dataplane.serve.http_front.http_server import HttpLimits

    return HttpLimits(
        max_body_bytes=args.http_max_body_bytes,
        max_connections=args.http_max_connections,
        receive_timeout_s=args.http_receive_timeout,
        keep_alive_timeout_s=args.http_keep_alive_timeout,
    )


_TARGET_NOFILE = 65535  # vLLM's set_ulimit target


def raise_descriptor_limit() -> None:
    """The soft file-descriptor limit up to the hard one (at most 65535), as vLLM does: a
    container's default soft limit of 1024 is too few for a server's connections."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _TARGET_NOFILE if hard == resource.RLIM_INFINITY else min(hard, _TARGET_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("could not raise the file-descriptor limit from %d: %s", soft, exc)


async def _serve(args: argparse.Namespace, config, link, api_token, tls, limits) -> int:
    from rimuru.dataplane.serve.plane.plane import FAILED
    from rimuru.dataplane.serve.plane.telemetry import PrometheusEndpoint
    from rimuru.dataplane.serve.server import create_server

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
        http_address=(args.host, args.http_port) if args.http_port is not None else None,
        http_limits=limits,
        api_token=api_token,
        tls=tls,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # An engine that dies while serving ends the process: the pod restarts, clients retry.
    handle.plane.on_state_change(lambda state: stop.set() if state == FAILED else None)
    await server.start()
    log.info("data plane on port %d (health NOT_SERVING until the model is warm)", port)
    if handle.http is not None:
        log.info("OpenAI-compatible HTTP API on port %d", handle.http.port)
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
