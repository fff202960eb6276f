"""`rimuru controlplane`: run the control-plane gRPC service until SIGTERM/SIGINT.

Every flag also reads an environment variable (RIMURU_CP_<FLAG>, e.g. RIMURU_CP_PORT,
RIMURU_CP_DATA_DIR, RIMURU_CP_TOKEN_FILE) so the operator's pods need no arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from pathlib import Path

from rimuru.cli_args import port
from rimuru.controlplane.hotness import HotnessConfig
from rimuru.controlplane.plane import ControlPlane
from rimuru.controlplane.server import create_server
from rimuru.rpc import TlsFiles, read_token

log = logging.getLogger("rimuru.controlplane")
ENV_PREFIX = "RIMURU_CP_"
SHUTDOWN_GRACE_S = 5.0


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(ENV_PREFIX + name, default)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # String defaults from the environment go through `type` too: a bad value is a usage error.
    parser.add_argument(
        "--host", default=_env("HOST", "[::]"), help="bind address (RIMURU_CP_HOST)"
    )
    parser.add_argument(
        "--port",
        type=port,
        default=_env("PORT", "50051"),
        help="port, 0 = any (RIMURU_CP_PORT)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=_env("DATA_DIR"),
        help="directory of the SQLite store (a volume); unset = in memory, lost on exit "
        "(RIMURU_CP_DATA_DIR)",
    )
    parser.add_argument(
        "--token-file",
        default=_env("TOKEN_FILE"),
        help="file holding the operator's bearer token, which SetPolicy and UploadRanking "
        "need; required unless --insecure (RIMURU_CP_TOKEN_FILE)",
    )
    parser.add_argument(
        "--dataplane-token-file",
        default=_env("DATAPLANE_TOKEN_FILE"),
        help="file holding the data planes' bearer token, which WatchPolicy and ReportRouting "
        "need (and which allows nothing else); unset = both take the operator token "
        "(RIMURU_CP_DATAPLANE_TOKEN_FILE)",
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        default=_env("INSECURE", "") in ("1", "true"),
        help="start without --token-file: anyone who reaches the port may set policy "
        "(RIMURU_CP_INSECURE=1)",
    )
    parser.add_argument(
        "--tls-cert", default=_env("TLS_CERT"), help="PEM certificate chain (RIMURU_CP_TLS_CERT)"
    )
    parser.add_argument(
        "--tls-key", default=_env("TLS_KEY"), help="PEM private key (RIMURU_CP_TLS_KEY)"
    )
    defaults = HotnessConfig()
    parser.add_argument(
        "--hotness-half-life-s",
        type=float,
        default=_env("HOTNESS_HALF_LIFE_S", str(defaults.half_life_s)),
        help="online hotness: routing counts halve every this many seconds",
    )
    parser.add_argument(
        "--hotness-drift-threshold",
        type=float,
        default=_env("HOTNESS_DRIFT_THRESHOLD", str(defaults.drift_threshold)),
        help="online hotness: push a new ranking when some layer's total-variation "
        "distance to the current one exceeds this",
    )
    parser.add_argument(
        "--hotness-min-interval-s",
        type=float,
        default=_env("HOTNESS_MIN_INTERVAL_S", str(defaults.min_interval_s)),
        help="online hotness: at most one new ranking per deployment this often",
    )
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        default=_env("LOG_LEVEL", "INFO"),
        help="(RIMURU_CP_LOG_LEVEL)",
    )


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(message)s")
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ValueError("--tls-cert and --tls-key go together: give both or neither")
    hotness = HotnessConfig(  # a ValueError is reported by rimuru.cli, exit 2
        half_life_s=args.hotness_half_life_s,
        drift_threshold=args.hotness_drift_threshold,
        min_interval_s=args.hotness_min_interval_s,
    )
    if not args.token_file and not args.insecure:
        log.error(
            "rimuru controlplane: no --token-file: anyone who reaches the port could set "
            "policy; give --token-file PATH, or --insecure to run open on purpose"
        )
        return 2
    if args.dataplane_token_file and not args.token_file:
        log.error("rimuru controlplane: --dataplane-token-file needs --token-file as well")
        return 2
    token = read_token(args.token_file) if args.token_file else None
    dataplane_token = read_token(args.dataplane_token_file) if args.dataplane_token_file else None
    if token is not None and token == dataplane_token:
        log.error("rimuru controlplane: the data-plane token must differ from the operator's")
        return 2
    if token is not None and dataplane_token is None:
        log.warning(
            "no --dataplane-token-file: data planes watch policy and report routing with the "
            "operator token, so every pod holding it can also set policy"
        )
    tls = TlsFiles.read(args.tls_cert, args.tls_key) if args.tls_cert else None
    asyncio.run(_serve(args, hotness, token, dataplane_token, tls))
    return 0


async def _serve(
    args: argparse.Namespace,
    hotness: HotnessConfig,
    token: str | None,
    dataplane_token: str | None,
    tls: TlsFiles | None,
) -> None:
    plane = ControlPlane.open(args.data_dir, hotness)
    try:
        server, port = await create_server(
            f"{args.host}:{args.port}",
            plane,
            token=token,
            dataplane_token=dataplane_token,
            tls=tls,
        )
        await server.start()
        log.info(
            "control plane on port %d (store: %s, writes: %s, data planes: %s, tls: %s)",
            port,
            plane.store.path or "memory",
            "token" if token else "open (--insecure)",
            "own token" if dataplane_token else "operator token" if token else "open",
            "on" if tls else "off",
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("stopping (grace %.0f s)", SHUTDOWN_GRACE_S)
        await server.stop(SHUTDOWN_GRACE_S)
    finally:
        plane.close()
