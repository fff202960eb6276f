"""`rimuru operator`: run the RimuruDeployment operator (kopf) in or out of a cluster."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import logging
import os

import kopf

from rimuru.operator.config import OperatorConfig

# flag dest -> OperatorConfig field (each also RIMURU_OPERATOR_<FIELD> in the environment)
_CONFIG_FLAGS = {
    "dataplane_image": "dataplane_image",
    "controlplane_image": "controlplane_image",
    "controlplane_target": "controlplane_target",
    "status_interval": "status_interval_seconds",
    "retry_delay": "retry_delay_seconds",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        help="watch RimuruDeployments in this namespace (repeatable)",
    )
    scope.add_argument(
        "--all-namespaces",
        "-A",
        action="store_true",
        help="watch RimuruDeployments in every namespace (the default without --namespace)",
    )
    parser.add_argument(
        "--liveness-port",
        type=int,
        default=8080,
        help="serve GET /healthz on this port for the pod's liveness probe (0 = off)",
    )
    parser.add_argument("--dataplane-image", help="default data-plane image")
    parser.add_argument("--controlplane-image", help="default control-plane image")
    parser.add_argument(
        "--controlplane-target",
        help="address template of control planes, e.g. '{name}-controlplane.{namespace}.svc:{port}'",
    )
    parser.add_argument("--status-interval", type=float, help="seconds between status refreshes")
    parser.add_argument("--retry-delay", type=float, help="seconds before retrying a blocked step")
    parser.add_argument("--verbose", "-v", action="store_true", help="debug logging")


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.liveness_port <= 65535:
        raise ValueError(f"--liveness-port must be in [0, 65535]; got {args.liveness_port}")
    overrides = {
        field: getattr(args, dest)
        for dest, field in _CONFIG_FLAGS.items()
        if getattr(args, dest) is not None
    }
    # Flags win over RIMURU_OPERATOR_* variables, which win over the defaults; a ValueError
    # is reported by rimuru.cli, exit 2.
    config = dataclasses.replace(OperatorConfig.from_env(os.environ), **overrides)

    _check_credentials()
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO)
    # Importing the module registers its handlers with kopf's default registry.
    importlib.import_module("rimuru.operator.handlers")
    liveness = None
    if args.liveness_port:
        liveness = f"http://0.0.0.0:{args.liveness_port}/healthz"
    kopf.run(
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        standalone=True,  # one replica; no peering objects (and no RBAC for them)
        liveness_endpoint=liveness,
        memo=kopf.Memo(config=config),
    )
    return 0


def _check_credentials() -> None:
    """Find the credentials the login handler will use, once, before kopf starts: without
    any, kopf logs the handler's LoginError and retries every minute for ever."""
    import yaml

    from rimuru.operator.kube import CREDENTIALS_HINT, connection_info

    try:
        connection_info(kopf.OperatorSettings())
    except kopf.LoginError as exc:  # none found, or a kubeconfig without a usable context
        message = str(exc)
        if CREDENTIALS_HINT not in message:
            message = f"{message.rstrip('.')}: {CREDENTIALS_HINT}"
        raise ValueError(message) from exc
    except (OSError, yaml.YAMLError, LookupError, TypeError, AttributeError) as exc:
        # kopf reads KUBECONFIG's files as given: an absent or malformed one fails here
        where = os.environ.get("KUBECONFIG") or "~/.kube/config"
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise ValueError(
            f"cannot read the Kubernetes credentials in {where} ({reason}): {CREDENTIALS_HINT}"
        ) from exc
