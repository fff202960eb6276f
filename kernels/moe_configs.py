"""Block configurations of the fused MoE GEMMs, per (E, I, D, dtype, token bucket) and device.

Tables live in ``configs/fused_moe_<device name>.json`` (spaces -> '_'), written by
``bench/tune_moe.py``:

    {"device": "<torch.cuda.get_device_name()>", "tuned": "<date>", "command": "...",
     "shapes": {"E=60,I=1408,D=2048,dtype=bfloat16": {"1": <config>, "2": ..., "4096": ...}}}

    <config> = {"block_m": 16,
                "gemm1": {"block_n": 64, "block_k": 128, "group_m": 1, "num_warps": 4, "num_stages": 4,
                          "tma": false, "tail": 0, "schedule": "grid", "presort": false},
                          # tma, tail, schedule, presort may be left out (false, 0, grid, false)
                "gemm2": {...}}

The two GEMMs share block_m (it is the alignment of the sorted pairs) and are tuned apart
otherwise. A lookup takes the bucket nearest to the token count; a shape without an entry
gets ``default_moe_config``.
"""

import functools
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

CONFIG_DIR = Path(__file__).parent / "configs"


# grid:             one program per output tile; the hardware schedules the programs.
# persistent:       one program per SM walks the tiles (grouped order, stride = programs).
# flattened:        persistent, with the tile loop and the k loop fused into one loop that
#                   Triton pipelines: the next tile's first loads are issued before this
#                   tile's epilogue. With tail tiles it compiles to the same code as
#                   persistent (identical sm_90 PTX): their branch keeps the loops apart.
# Triton 3.6's Hopper warp specialization of the tile loop is not offered: it faulted or hung
# when tried; offer it only once a GPU run of the tuner passes with it.
SCHEDULES = ("grid", "persistent", "flattened")


@dataclass(frozen=True)
class GemmTile:
    block_n: int
    block_k: int
    group_m: int = 1
    num_warps: int = 4
    num_stages: int = 3
    tma: bool = False  # weights (and the down GEMM's intermediate) through TMA descriptors
    # Halvings of block_m an expert's last, partly filled block may take (0, 1 or 2;
    # block_m >> tail >= 16): its tile then computes only that many rows (moe_gemm.py).
    tail: int = 0
    # How programs map to output tiles (SCHEDULES; may be left out of a table entry: "grid").
    schedule: str = "grid"
    # Up GEMM only: copy x's rows into the alignment's sorted order first (moe_sort_rows.py)
    # and read A as a plain block, through TMA where tma is set, instead of gathering x's
    # rows by token with pointer loads (Hopper's TMA has no gather).
    presort: bool = False

    def __post_init__(self) -> None:
        if self.tail not in (0, 1, 2):
            raise ValueError(f"tail must be 0, 1 or 2 (halvings of block_m); got {self.tail}")
        for name in ("tma", "presort"):
            if not isinstance(getattr(self, name), bool):  # "false" in a table is truthy
                raise ValueError(f"{name} must be true or false; got {getattr(self, name)!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {list(SCHEDULES)}; got {self.schedule!r}")


@dataclass(frozen=True)
class MoeConfig:
    block_m: int
    gemm1: GemmTile
    gemm2: GemmTile

    def __post_init__(self) -> None:
        if self.gemm2.presort:
            raise ValueError("presort is for gemm1 (the up GEMM); gemm2 reads sorted rows anyway")
        for name, tile in (("gemm1", self.gemm1), ("gemm2", self.gemm2)):
            if tile.tail and self.block_m >> tile.tail < 16:
                raise ValueError(
                    f"{name} tail={tile.tail} halves block_m={self.block_m} below 16 rows, "
                    "the smallest dot tile"
                )

    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(entry: dict) -> "MoeConfig":
        return MoeConfig(entry["block_m"], GemmTile(**entry["gemm1"]), GemmTile(**entry["gemm2"]))


def shape_key(num_experts: int, inter_size: int, hidden_size: int, dtype: torch.dtype) -> str:
    return (
        f"E={num_experts},I={inter_size},D={hidden_size},dtype={str(dtype).removeprefix('torch.')}"
    )


def config_file_name(device_name: str) -> str:
    return f"fused_moe_{device_name.replace(' ', '_')}.json"


@functools.cache
def load_table(file_name: str) -> dict[str, dict[int, MoeConfig]]:
    path = CONFIG_DIR / file_name
    if not path.exists():
        return {}
    shapes = json.loads(path.read_text())["shapes"]
    return {
        key: {int(t): MoeConfig.from_json(c) for t, c in buckets.items()}
        for key, buckets in shapes.items()
    }


def default_moe_config(num_tokens: int, top_k: int, num_experts: int) -> MoeConfig:
    """A safe choice when no tuned entry exists: block_m follows the rows per expert."""
    rows_per_expert = max(1, num_tokens * top_k // num_experts)
    if rows_per_expert <= 16:
        return MoeConfig(16, GemmTile(64, 128, 1, 4, 4), GemmTile(64, 128, 1, 4, 4))
    if rows_per_expert <= 64:
        return MoeConfig(32, GemmTile(64, 64, 8, 4, 4), GemmTile(64, 64, 8, 4, 4))
    return MoeConfig(64, GemmTile(128, 64, 8, 4, 3), GemmTile(128, 64, 8, 4, 3))


def get_moe_config(
    num_experts: int,
    inter_size: int,
    hidden_size: int,
    num_tokens: int,
    top_k: int,
    dtype: torch.dtype,
    device: torch.device,
) -> MoeConfig:
    if device.type == "cuda":
        table = load_table(config_file_name(torch.cuda.get_device_name(device)))
        buckets = table.get(shape_key(num_experts, inter_size, hidden_size, dtype))
        if buckets:
            return nearest_bucket(buckets, num_tokens)
    return default_moe_config(num_tokens, top_k, num_experts)


def nearest_bucket(buckets: dict[int, MoeConfig], num_tokens: int) -> MoeConfig:
    """The entry tuned for the token count nearest to num_tokens (ties: the smaller)."""
    return buckets[min(sorted(buckets), key=lambda t: abs(t - num_tokens))]
