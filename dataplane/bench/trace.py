"""Request traces: pre-tokenized prompts with the number of tokens to generate for each.

A trace is what the benchmark replays: the same requests, in the same order, for every
policy. Traces are derived once from ShareGPT (bench/derive_sharegpt_trace.py) and committed
as compact .npz files, so loading one needs neither a tokenizer nor the network.

File format (numpy .npz, no pickled objects; N = requests, T = total prompt tokens):

    prompt_token_ids  uint32 [T]      every prompt's token ids, concatenated in request order
    prompt_offsets    int64  [N + 1]  request i's prompt is prompt_token_ids[off[i]:off[i + 1]]
    output_lens       uint32 [N]      tokens to generate for request i
    metadata          str    []       one JSON object: source, rules, tokenizer, seed, caps, ...
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

TRACE_SUFFIX = ".npz"
_MAX_TOKEN_ID = np.iinfo(np.uint32).max


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace: the prompt's token ids and how many tokens to generate."""

    prompt_token_ids: tuple[int, ...]
    output_len: int

    def __post_init__(self) -> None:
        if len(self.prompt_token_ids) == 0:
            raise ValueError("a trace request needs at least one prompt token")
        if self.output_len < 1:
            raise ValueError(f"output_len must be >= 1, got {self.output_len}")

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


@dataclass(frozen=True)
class Trace:
    """An ordered list of requests plus the metadata that says how it was derived.

    `metadata` is read-only (a mapping proxy); copy it with dict() to change it.
    """

    name: str
    requests: tuple[TraceRequest, ...]
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "requests", tuple(self.requests))
        object.__setattr__(self, "metadata", MappingProxyType(dict(self.metadata)))

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def prompt_lens(self) -> list[int]:
        return [r.prompt_len for r in self.requests]

    @property
    def output_lens(self) -> list[int]:
        return [r.output_len for r in self.requests]

    @property
    def num_prompt_tokens(self) -> int:
        return sum(self.prompt_lens)

    @property
    def num_output_tokens(self) -> int:
        return sum(self.output_lens)

    @property
    def max_token_id(self) -> int:
        """The largest prompt token id; -1 for a trace without requests."""
        return max((max(r.prompt_token_ids) for r in self.requests), default=-1)

    def head(self, num_requests: int) -> Trace:
        """The first `num_requests` requests, in trace order (the order is already shuffled)."""
        if not 0 <= num_requests <= len(self.requests):
            raise ValueError(
                f"trace {self.name!r} has {len(self.requests)} requests; ask for at most "
                f"{len(self.requests)}, not {num_requests}"
            )
        return Trace(self.name, self.requests[:num_requests], self.metadata)

    def with_system_prompt(self, num_tokens: int) -> Trace:
        """Every prompt behind the same `num_tokens`-token prefix, the shared system prompt
        of a deployment: the trace's own first prompt tokens, concatenated in trace order, so
        the prefix is real text and the same for every --num-prompts that holds that many
        tokens. 0 leaves the trace as it is."""
        if num_tokens < 0:
            raise ValueError(f"a system prompt of {num_tokens} tokens: give 0 or more")
        if num_tokens == 0:
            return self
        stream = [t for r in self.requests for t in r.prompt_token_ids][:num_tokens]
        if len(stream) < num_tokens:
            raise ValueError(
                f"trace {self.name!r} holds {len(stream)} prompt tokens, fewer than the "
                f"{num_tokens} the system prompt asks for"
            )
        prefix = tuple(stream)
        requests = [TraceRequest(prefix + r.prompt_token_ids, r.output_len) for r in self.requests]
        return Trace(self.name, requests, {**self.metadata, "system_prompt_tokens": num_tokens})


def save_trace(trace: Trace, path: str | Path) -> Path:
    """Write `trace` in the compact .npz format above; returns the path written."""
    path = Path(path)
    if path.suffix != TRACE_SUFFIX:
        raise ValueError(f"trace files end in {TRACE_SUFFIX}; got {path}")
    ids = [t for r in trace.requests for t in r.prompt_token_ids]
    if ids and (min(ids) < 0 or max(ids) > _MAX_TOKEN_ID):
        raise ValueError("token ids must fit in uint32")
    offsets = np.zeros(len(trace.requests) + 1, dtype=np.int64)
    np.cumsum(trace.prompt_lens, out=offsets[1:])
    np.savez_compressed(
        path,
        prompt_token_ids=np.asarray(ids, dtype=np.uint32),
        prompt_offsets=offsets,
        output_lens=np.asarray(trace.output_lens, dtype=np.uint32),
        metadata=np.asarray(json.dumps(dict(trace.metadata), sort_keys=True)),
    )
    return path


def check_trace_fits_model(trace: Trace, model: str) -> None:
    """Refuse to replay `trace` on a model whose vocabulary lacks some of its token ids (ids
    mean something only under the tokenizer that made them). Reads the model's config, no
    weights, so the mismatch is refused before an engine's start-up, not at its first prompt."""
    from rimuru.dataplane.model.checkpoint import PRESETS, model_config  # torch: only when checking

    top, vocab_size = trace.max_token_id, model_config(model).vocab_size
    if top < vocab_size:
        return
    tokenizer = trace.metadata.get("tokenizer")
    made_with = tokenizer.get("vocabulary") if isinstance(tokenizer, Mapping) else None
    fits = [name for name, c in PRESETS.items() if c.vocab_size > top]
    raise ValueError(
        f"trace {trace.name!r} holds token ids up to {top}"
        + (f" (tokenized with {made_with})" if made_with else "")
        + f", but model {model!r} has a vocabulary of {vocab_size}: use a model whose "
        f"vocabulary has more than {top} ids"
        + (f" (presets: {', '.join(fits)})" if fits else "")
        + ", or give --trace a .npz tokenized for this model (save_trace in "
        "rimuru.dataplane.bench.trace writes one)"
    )


def available_traces() -> list[str]:
    """Names of the traces bundled with the package (dataplane/data/*.npz)."""
    data = resources.files("rimuru.dataplane") / "data"
    return sorted(
        p.name.removesuffix(TRACE_SUFFIX) for p in data.iterdir() if p.name.endswith(TRACE_SUFFIX)
    )


def load_trace(name_or_path: str | Path) -> Trace:
    """Load a bundled trace by name (e.g. "sharegpt_qwen_cpu") or any trace file by path."""
    path = Path(name_or_path)
    if path.is_file():
        return _read(path, name=path.name.removesuffix(TRACE_SUFFIX))
    name = str(name_or_path)
    if name in available_traces():
        resource = resources.files("rimuru.dataplane") / "data" / f"{name}{TRACE_SUFFIX}"
        with resources.as_file(resource) as bundled:
            return _read(bundled, name=name)
    raise ValueError(
        f"no trace file {str(name_or_path)!r} and no bundled trace of that name; bundled traces: "
        f"{', '.join(available_traces()) or 'none'}"
    )


def _read(path: Path, name: str) -> Trace:
    # np.load reads anything that is not a zip as a pickle, and refuses it with advice to
    # allow pickles: the wrong advice for a file that is simply not a trace.
    with open(path, "rb") as f:  # an unreadable file says why (is_zipfile would say False)
        is_zip = zipfile.is_zipfile(f)
    if not is_zip:
        raise ValueError(
            f"{path} is not a trace file (a .npz of prompt_token_ids, prompt_offsets, "
            f"output_lens and metadata, as bench/derive_sharegpt_trace.py writes)"
        )
    with np.load(path, allow_pickle=False) as npz:
        missing = {"prompt_token_ids", "prompt_offsets", "output_lens", "metadata"} - set(npz.files)
        if missing:
            raise ValueError(f"{path} is not a trace file: it lacks {sorted(missing)}")
        ids = npz["prompt_token_ids"]
        offsets = npz["prompt_offsets"]
        output_lens = npz["output_lens"]
        metadata = json.loads(str(npz["metadata"][()]))
    _check_layout(path, ids, offsets, output_lens)
    bounds = offsets.tolist()
    requests = [
        TraceRequest(tuple(ids[start:end].tolist()), int(out))
        for start, end, out in zip(bounds[:-1], bounds[1:], output_lens.tolist(), strict=True)
    ]
    return Trace(name, requests, metadata)


def _check_layout(
    path: Path, ids: np.ndarray, offsets: np.ndarray, output_lens: Sequence[int]
) -> None:
    if (
        offsets.ndim != 1
        or len(offsets) != len(output_lens) + 1
        or offsets[0] != 0
        or offsets[-1] != len(ids)
        or np.any(np.diff(offsets) <= 0)
    ):
        raise ValueError(
            f"{path} is corrupt: prompt_offsets must start at 0, rise strictly and end at "
            f"len(prompt_token_ids); re-derive it with bench/derive_sharegpt_trace.py"
        )
