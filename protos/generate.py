"""Regenerate the committed Python stubs of rimuru/v1/*.proto.

    python protos/generate.py            # rewrite protos/rimuru/v1/*_pb2*.py(i)
    python protos/generate.py --out DIR  # write them under DIR/rimuru/v1/ instead

The stubs depend on the grpcio-tools release that made them: its gencode checks
at import time that protobuf and grpcio are at least the versions it was built
for. pyproject.toml pins grpcio-tools and floors protobuf/grpcio to match; bump
all three together and rerun this script.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent
PROTO_PACKAGE = "rimuru/v1"


def proto_files() -> list[str]:
    """Proto paths relative to PROTO_ROOT, sorted so the output is reproducible."""
    return sorted(
        p.relative_to(PROTO_ROOT).as_posix() for p in (PROTO_ROOT / PROTO_PACKAGE).glob("*.proto")
    )


def protoc_args(out_dir: Path) -> list[str]:
    out = str(out_dir)
    return [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *(str(PROTO_ROOT / name) for name in proto_files()),
    ]


def generate(out_dir: Path) -> None:
    from grpc_tools import protoc  # test extra; imported here so --help works without it

    (out_dir / PROTO_PACKAGE).mkdir(parents=True, exist_ok=True)
    status = protoc.main(protoc_args(out_dir))
    if status != 0:
        raise SystemExit(f"protoc failed with status {status}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=PROTO_ROOT, help="output root (default: protos/)"
    )
    args = parser.parse_args(argv)
    generate(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
