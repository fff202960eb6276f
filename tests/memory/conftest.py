import pytest

from rimuru.dataplane.memory.geometry import MemoryShape, PageGeometry


def small_shape(**overrides) -> MemoryShape:
    # expert page = 16*16*4 = 1024 B; KV page = 2*16*1*2*4 = 256 B -> 4 KV pages per expert page
    fields = dict(
        num_layers=2,
        num_experts=4,
        hidden_size=16,
        moe_intermediate_size=16,
        num_kv_heads=1,
        head_dim=2,
        dtype_bytes=4,
    )
    fields.update(overrides)
    return MemoryShape(**fields)


@pytest.fixture
def geometry() -> PageGeometry:
    return PageGeometry.from_shape(small_shape())
