import pytest
import torch

from rimuru.dataplane.memory.tables import NOT_PRESENT, BlockTable, ExpertPageTable, buffer_slot_id


def test_expert_page_table_rows():
    t = ExpertPageTable(num_layers=2, num_experts=3)
    assert t.pages(1, 2) is None and t.host.dtype == torch.int32
    t.set_pages(1, 2, (7, 8, 9))
    assert t.pages(1, 2) == (7, 8, 9)
    assert [buffer_slot_id(i) for i in range(3)] == [-1, -2, -3]  # slot s <-> id -s - 1
    t.clear(1, 2)
    assert t.pages(1, 2) is None and t.host[1, 2, 0].item() == NOT_PRESENT
    assert t.on_device() is t.host  # CPU: no copy


def test_block_table_is_per_block_one_page_per_layer():
    b = BlockTable(num_layers=3)
    b.append_block([10, 11, 12])
    b.append_block([20, 21, 22])
    assert len(b) == 2 and b.layer(1) == [11, 21]
    assert b.all_pages() == [10, 11, 12, 20, 21, 22]
    with pytest.raises(ValueError, match="a block needs 3 pages, got 2"):
        b.append_block([1, 2])
    assert b.pop_blocks() == [10, 11, 12, 20, 21, 22] and len(b) == 0


def test_device_table_keeps_its_address_and_updates_outside_inference_mode():
    """A captured CUDA graph reads the device table at a fixed address: the first copy may be
    made inside the forward (inference mode) and must still take in-place updates made by
    the engine between steps (outside it). 'meta' stands in for CUDA: same tensor rules."""
    import torch

    from rimuru.dataplane.memory.tables import ExpertPageTable

    table = ExpertPageTable(2, 4, device="meta")
    with torch.inference_mode():
        first = table.on_device()
    table.set_pages(1, 3, (7, 8, 9))
    again = table.on_device()  # outside inference mode: in place, no new tensor
    assert again is first
    assert again.data_ptr() == first.data_ptr() and again.shape == (2, 4, 3)
