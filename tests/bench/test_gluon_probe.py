"""bench/gluon_gemms.py compiles for the H200 (sm_90) on a machine without a GPU: the loader
partition issues TMA loads and announces their bytes, the MMA partition issues wgmma and
releases each slot with single-thread arrives. Whether it runs right is for the GPU (the
probe itself)."""

import re
import sys
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402
from triton.runtime.jit import mangle_type  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import gluon_gemms  # noqa: E402

DOWN_SCALARS = {"y_ptr": "*bf16", "weights_ptr": "*fp32", "sorted_ptr": "*i32",
                "pages_ptr": "*i32", "page_stride": "i32", "rows_per_page": "i32",
                "num_padded_ptr": "*i32", "num_pairs": "i32", "N": "i32", "K": "i32",
                "stride_y": "i32"}  # fmt: skip
UP_SCALARS = {"act_ptr": "*bf16", "pages_ptr": "*i32", "rows_per_page": "i32", "up_offset": "i32",
              "num_padded_ptr": "*i32", "N": "i32", "K": "i32", "stride_act": "i32"}  # fmt: skip


def _sm90_ptx(kernel, a, weights, tile, scalars: dict, consts: dict, num_warps: int) -> str:
    """The kernel's PTX for sm_90, its descriptors made over `a` and `weights` (stack, buffer)."""
    a_desc, w_desc, buf_desc = gluon_gemms.descriptors(a, weights, 128, tile)
    signature = {"a_desc": mangle_type(a_desc), "w_desc": mangle_type(w_desc),
                 "buf_desc": mangle_type(buf_desc), **scalars}  # fmt: skip
    signature.update({name: "constexpr" for name in consts})
    source = GluonASTSource(kernel, signature, consts)
    options = {"num_warps": num_warps}
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]


def _check_partitions(ptx: str, *, loads: int, slot_bytes: int, releases: int, num_warps: int):
    assert "wgmma.mma_async" in ptx
    assert ptx.count("cp.async.bulk.tensor.2d") == loads
    # Each slot's TMA loads are announced as one byte count on its ready barrier.
    expected = re.findall(r"mbarrier\.arrive\.expect_tx\.shared\.b64 _, \[%r\d+\], (\d+);", ptx)
    assert expected == [str(slot_bytes)]
    # The MMA partition frees slots with single-thread arrives after a partition barrier.
    lines = ptx.splitlines()
    arrives = [i for i, line in enumerate(lines) if "mbarrier.arrive.shared::cta.b64" in line]
    assert len(arrives) == releases
    for i in arrives:
        assert re.search(r"@%p\d+ mbarrier", lines[i])  # predicated on one thread
        barrier = rf"bar\.sync\s+\d+, {32 * num_warps};"
        assert any(re.search(barrier, line) for line in lines[i - 4 : i])


@pytest.mark.parametrize("page_column", [0, 2])  # contiguous (expert ids), paged (w2 pages)
@pytest.mark.parametrize("tile", gluon_gemms.DOWN_TILES)
def test_the_down_probe_compiles_for_sm90_with_its_partitions(tile, page_column):
    block_n, block_k, stages, in_flight, num_warps = tile
    act = torch.empty(1024, 768, dtype=torch.bfloat16)
    w2 = torch.empty(4, 2048, 768, dtype=torch.bfloat16)
    consts = dict(BLOCK_M=128, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8, STAGES=stages,
                  NUM_WARPS=num_warps, MMA_IN_FLIGHT=in_flight, PAGE_COLUMN=page_column)  # fmt: skip
    ptx = _sm90_ptx(gluon_gemms.gluon_down_kernel, act, [w2, w2[:1]], tile, DOWN_SCALARS,
                    consts, num_warps)  # fmt: skip
    # act's tile, and w2's from the pool or from the loading buffer (one of the two runs);
    # a slot is freed in the k loop, and once more after it when a wgmma stays in flight.
    _check_partitions(ptx, loads=3, slot_bytes=(128 + block_n) * block_k * 2,
                      releases=1 + in_flight, num_warps=num_warps)  # fmt: skip
    assert ptx.count("wgmma.wait_group.sync.aligned 1;") == in_flight


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("tile", gluon_gemms.UP_TILES)
def test_the_up_probe_compiles_for_sm90_with_its_partitions(tile, paged):
    block_n, block_k, stages, num_warps = tile
    xs = torch.empty(1024, 2048, dtype=torch.bfloat16)
    w13 = torch.empty(4, 2 * 768, 2048, dtype=torch.bfloat16)
    consts = dict(BLOCK_M=128, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8, STAGES=stages,
                  NUM_WARPS=num_warps, PAGED=paged)  # fmt: skip
    ptx = _sm90_ptx(gluon_gemms.gluon_up_kernel, xs, [w13, w13[:1]], tile, UP_SCALARS, consts,
                    num_warps)  # fmt: skip
    # x's tile, and w1's and w3's each from the pool or from the loading buffer
    _check_partitions(ptx, loads=5, slot_bytes=(128 + 2 * block_n) * block_k * 2, releases=1,
                      num_warps=num_warps)  # fmt: skip
