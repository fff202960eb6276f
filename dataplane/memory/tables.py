"""Integer tables the kernels read: expert page tables, per-request block tables and a
hybrid request's state pages.

Expert page table, per layer: int32 [E, 3] = page ids of (w1, w3, w2).
    id >= 0        the matrix lies in pool expert page `id`
    id <  0        it lies in loading-buffer slot `-id - 1` (just copied for this step)
    NOT_PRESENT    neither: the expert must be copied before any kernel reads it
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

NOT_PRESENT = -(2**31)


def buffer_slot_id(slot: int) -> int:
    return -slot - 1


class DeviceMirror:
    """A host tensor the engine edits between forwards, and its copy on the engine's device:
    one tensor for the engine's life, rewritten in place when the host side changed, so a
    captured CUDA graph keeps reading it at the same address. On the CPU, the host tensor."""

    def __init__(self, host: torch.Tensor, device: torch.device | str = "cpu"):
        self.host = host
        self.device = torch.device(device)
        self._device_copy: torch.Tensor | None = None
        self._dirty = True

    def mark_dirty(self) -> None:
        self._dirty = True

    def on_device(self) -> torch.Tensor:
        if self.device.type == "cpu":
            return self.host
        # Made and rewritten under inference mode: the forward (inference mode) may make it,
        # and torch refuses in-place updates of an inference tensor outside that mode.
        with torch.inference_mode():
            if self._device_copy is None:
                self._device_copy = self.host.to(self.device)
            elif self._dirty:
                # queued after every kernel that read it; from a pinned snapshot, so the host
                # neither waits for the device (a pageable copy would) nor races the copy
                cuda = self.device.type == "cuda"
                snapshot = self.host.pin_memory() if cuda else self.host
                self._device_copy.copy_(snapshot, non_blocking=cuda)
        self._dirty = False
        return self._device_copy


class ExpertPageTable(DeviceMirror):
    """[L, E, 3] int32 on the engine's device; rows change only between forwards."""

    def __init__(self, num_layers: int, num_experts: int, device: torch.device | str = "cpu"):
        host = torch.full((num_layers, num_experts, 3), NOT_PRESENT, dtype=torch.int32)
        super().__init__(host, device)

    def set_pages(self, layer: int, expert: int, pages: tuple[int, int, int]) -> None:
        self.host[layer, expert] = torch.tensor(pages, dtype=torch.int32)
        self._dirty = True

    def clear(self, layer: int, expert: int) -> None:
        self.host[layer, expert] = NOT_PRESENT
        self._dirty = True

    def pages(self, layer: int, expert: int) -> tuple[int, int, int] | None:
        row = self.host[layer, expert].tolist()
        return None if row[0] == NOT_PRESENT else tuple(row)

    def replace_layer(self, layer: int, rows: torch.Tensor) -> None:
        """All of one layer's rows at once ([E, 3] int32)."""
        self.host[layer] = rows
        self._dirty = True


class BlockTable:
    """One request's KV pages: per logical 16-token block, one page per layer.

    Stored as a growing int64 array [num_blocks, num_layers] so that a step can hand every
    request's new blocks to the device with one array copy, not a Python loop per layer.
    It only grows until `pop_blocks` empties it whole, which bumps `epoch`: a copy of the
    table elsewhere (the device's, block_table_store.py) is current while it holds the same
    epoch and length."""

    def __init__(self, num_layers: int):
        self.num_layers = num_layers
        self._pages = np.empty((4, num_layers), dtype=np.int64)
        self._num_blocks = 0
        self.epoch = 0  # times emptied

    def __len__(self) -> int:
        return self._num_blocks

    def append_block(self, layer_pages: list[int]) -> None:
        if len(layer_pages) != self.num_layers:
            raise ValueError(f"a block needs {self.num_layers} pages, got {len(layer_pages)}")
        if self._num_blocks == len(self._pages):
            grown = np.empty((2 * len(self._pages), self.num_layers), dtype=np.int64)
            grown[: self._num_blocks] = self._pages[: self._num_blocks]
            self._pages = grown
        self._pages[self._num_blocks] = layer_pages
        self._num_blocks += 1

    def array(self) -> np.ndarray:
        """[num_blocks, num_layers] page ids (a view: valid until the table changes)."""
        return self._pages[: self._num_blocks]

    def pop_blocks(self) -> list[int]:
        pages = self.all_pages()
        self._num_blocks = 0
        self.epoch += 1
        return pages

    def all_pages(self) -> list[int]:
        return self.array().ravel().tolist()

    def layer(self, layer: int) -> list[int]:
        return self.array()[:, layer].tolist()


@dataclass(frozen=True)
class StatePages:
    """A hybrid request's Gated DeltaNet states: per GDN layer, one SSM page (the recurrent
    state) and one conv page (the conv's last inputs). Fixed for the request's life: held
    from admission to finish (or preemption), whatever its length."""

    ssm: tuple[int, ...]  # [G] SSM page of each GDN layer
    conv: tuple[int, ...]  # [G] conv page of each GDN layer
