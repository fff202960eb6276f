"""bench/gluon_gemms.py compiles for the H200 (sm_90) on a machine without a GPU: the loader
partition issues TMA loads and announces their bytes, the MMA partition issues wgmma and
releases each slot with one arrive. Whether it runs right is for the GPU (the probe itself)."""

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

SCALARS = {"y_ptr": "*bf16", "weights_ptr": "*fp32", "sorted_ptr": "*i32", "pages_ptr": "*i32",
           "page_stride": "i32", "rows_per_page": "i32", "num_padded_ptr": "*i32",
           "num_pairs": "i32", "N": "i32", "K": "i32", "stride_y": "i32"}  # fmt: skip


@pytest.mark.parametrize("page_column", [0, 2])  # contiguous (expert ids), paged (w2 pages)
@pytest.mark.parametrize("tile", gluon_gemms.DOWN_TILES)
def test_the_probe_compiles_for_sm90_with_its_partitions(tile, page_column):
    block_n, block_k, stages, in_flight, num_warps = tile
    act = torch.empty(1024, 768, dtype=torch.bfloat16)
    w2 = torch.empty(4, 2048, 768, dtype=torch.bfloat16)
    a_desc, w_desc, buf_desc = gluon_gemms.descriptors(act, [w2, w2[:1]], 128, tile)
    consts = dict(BLOCK_M=128, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8, STAGES=stages,
                  NUM_WARPS=num_warps, MMA_IN_FLIGHT=in_flight, PAGE_COLUMN=page_column)  # fmt: skip
    signature = {"a_desc": mangle_type(a_desc), "w_desc": mangle_type(w_desc),
                 "buf_desc": mangle_type(buf_desc), **SCALARS}  # fmt: skip
    signature.update({name: "constexpr" for name in consts})
    source = GluonASTSource(gluon_gemms.gluon_down_kernel, signature, consts)
    options = {"num_warps": num_warps}
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]
    assert "wgmma.mma_async" in ptx
    # act's tile, and w2's from the pool or from the loading buffer (one of the two runs)
    assert ptx.count("cp.async.bulk.tensor.2d") == 3
    # Each slot's two TMA loads are announced as one byte count on its ready barrier.
    expected = re.findall(r"mbarrier\.arrive\.expect_tx\.shared\.b64 _, \[%r\d+\], (\d+);", ptx)
    assert expected == [str((128 + block_n) * block_k * 2)]
    # The MMA partition frees slots with single-thread arrives after a partition barrier:
    # one in the k loop, and one after it when a wgmma is left in flight.
    lines = ptx.splitlines()
    arrives = [i for i, line in enumerate(lines) if "mbarrier.arrive.shared::cta.b64" in line]
    assert len(arrives) == 1 + in_flight
    for i in arrives:
        assert re.search(r"@%p\d+ mbarrier", lines[i])  # predicated on one thread
        barrier = rf"bar\.sync\s+\d+, {32 * num_warps};"
        assert any(re.search(barrier, line) for line in lines[i - 4 : i])
    assert ptx.count("wgmma.wait_group.sync.aligned 1;") == in_flight


UP_SCALARS = {"act_ptr": "*bf16", "pages_ptr": "*i32", "rows_per_page": "i32", "up_offset": "i32",
              "num_padded_ptr": "*i32", "N": "i32", "K": "i32", "stride_act": "i32"}  # fmt: skip


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("tile", gluon_gemms.UP_TILES)
def test_the_up_probe_compiles_for_sm90_with_its_partitions(tile, paged):
    block_n, block_k, stages, num_warps = tile
    xs = torch.empty(1024, 2048, dtype=torch.bfloat16)
    w13 = torch.empty(4, 2 * 768, 2048, dtype=torch.bfloat16)
    a_desc, w_desc, buf_desc = gluon_gemms.descriptors(xs, [w13, w13[:1]], 128, tile)
    consts = dict(BLOCK_M=128, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8, STAGES=stages,
                  NUM_WARPS=num_warps, PAGED=paged)  # fmt: skip
    signature = {"a_desc": mangle_type(a_desc), "w_desc": mangle_type(w_desc),
                 "buf_desc": mangle_type(buf_desc), **UP_SCALARS}  # fmt: skip
    signature.update({name: "constexpr" for name in consts})
    source = GluonASTSource(gluon_gemms.gluon_up_kernel, signature, consts)
    options = {"num_warps": num_warps}
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]
    assert "wgmma.mma_async" in ptx
    # x's tile, and w1's and w3's each from the pool or from the loading buffer
    assert ptx.count("cp.async.bulk.tensor.2d") == 5
    expected = re.findall(r"mbarrier\.arrive\.expect_tx\.shared\.b64 _, \[%r\d+\], (\d+);", ptx)
    assert expected == [str((128 + 2 * block_n) * block_k * 2)]
    lines = ptx.splitlines()
    arrives = [i for i, line in enumerate(lines) if "mbarrier.arrive.shared::cta.b64" in line]
    assert len(arrives) == 1
    assert re.search(
        rf"bar\.sync\s+\d+, {32 * num_warps};", "\n".join(lines[arrives[0] - 4 : arrives[0]])
    )
