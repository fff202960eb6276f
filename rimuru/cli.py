"""The `rimuru` command line: one dispatcher, each subcommand owned by its subpackage.

Subcommands are imported lazily so that `rimuru controlplane` on the operator's slim
image never imports torch, and `rimuru --help` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module that defines `add_arguments(parser)` and `run(args) -> int`, help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "bench": (
        "rimuru.dataplane.bench.cli",
        "run the serving benchmark (default: CPU, tiny preset)",
    ),
    "generate": ("rimuru.dataplane.cli.generate", "generate text for one prompt"),
    "profile-hotness": (
        "rimuru.dataplane.cli.hotness",
        "write the offline hotness ranking of experts from sample prompts",
    ),
    "plan": (
        "rimuru.dataplane.cli.plan",
        "how a memory budget splits and how much KV cache each policy gets (no weights loaded)",
    ),
    "serve": ("rimuru.dataplane.serve.cli", "serve inference over gRPC (data plane)"),
    "controlplane": ("rimuru.controlplane.cli", "run the control-plane gRPC service"),
    "policy": ("rimuru.controlplane.cli_policy", "get/set/watch policies on a control plane"),
    "operator": ("rimuru.operator.cli", "run the Kubernetes operator"),
}


def _load(name: str):
    module_name, _ = SUBCOMMANDS[name]
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or "a dependency"
        raise SystemExit(
            f"rimuru {name}: cannot import {missing!r}. Install the extra that provides it, "
            f"e.g. `pip install 'rimuru[all]'`."
        ) from exc


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="rimuru", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in SUBCOMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in SUBCOMMANDS:
        parser.parse_args(argv or ["--help"])
        return 2
    name = argv[0]
    module = _load(name)
    sub_parser = argparse.ArgumentParser(prog=f"rimuru {name}", description=SUBCOMMANDS[name][1])
    module.add_arguments(sub_parser)
    args = sub_parser.parse_args(argv[1:])
    try:
        return int(module.run(args) or 0)
    # Bad input, named by the code that refused it: no traceback. OSError is the backstop
    # for a path the code did not check first (a missing file, a directory not readable).
    except (ValueError, OSError) as exc:
        print(f"rimuru {name}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
