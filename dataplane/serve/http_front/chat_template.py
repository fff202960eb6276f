"""Chat messages -> one prompt string, for /v1/chat/completions.

A local model directory's tokenizer_config.json `chat_template` (Jinja, rendered in a
sandbox as transformers does) when it has one and jinja2 is installed; ChatML otherwise,
which is what the Qwen presets (and `tiny`, which borrows their vocabulary) were trained on.

Only the template makes control tokens: a special token's text inside a message's content is
encoded as plain text (`encode_conversation`), so a user cannot close their own turn and
forge a system one. (vLLM renders and tokenizes the whole prompt, so there such text
becomes the special token; its roles are free strings, here they are OpenAI's.)
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from rimuru.dataplane.model.tokenizer import QWEN_SPECIALS_IN_TEXT, Tokenizer
from rimuru.dataplane.serve.plane.errors import InvalidArgument

log = logging.getLogger("rimuru.serve")

Message = dict[str, str]  # {"role": ..., "content": ...}
CHATML_END = "<|im_end|>"
# Stand-ins for message contents while the template renders: private-use characters that no
# tokenizer treats as special, so where each content lies in the prompt is known exactly.
_PLACEHOLDER = "\ue000{}\ue001"


def chatml(messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
    parts = [f"<|im_start|>{m['role']}\n{m['content']}{CHATML_END}\n" for m in messages]
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)


class ChatTemplate:
    """render(messages) -> prompt text; `name` says which template it is."""

    def __init__(self, name: str, render: Callable[[Sequence[Message]], str]) -> None:
        self.name = name
        self._render = render

    def render(self, messages: Sequence[Message]) -> str:
        """Raises ValueError when the template refuses the conversation."""
        try:
            return self._render(messages)
        except ValueError:
            raise
        except Exception as exc:  # a Jinja error or the template's raise_exception
            raise ValueError(f"the chat template cannot render these messages: {exc}") from exc

    @property
    def is_chatml(self) -> bool:
        return self.name == "chatml"


def load_chat_template(model: str) -> ChatTemplate:
    """The template of `model` (a preset name or a local directory)."""
    config_path = Path(model) / "tokenizer_config.json"
    if not config_path.is_file():
        return ChatTemplate("chatml", chatml)
    config = json.loads(config_path.read_text())
    source = config.get("chat_template")
    if isinstance(source, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in source}
        source = named.get("default")
    if not isinstance(source, str):
        return ChatTemplate("chatml", chatml)
    try:
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        log.warning("%s has a chat template but jinja2 is not installed: using ChatML", model)
        return ChatTemplate("chatml", chatml)

    def raise_exception(message: str):
        raise ValueError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    template = env.from_string(source)
    specials = {k: _token_text(config.get(k)) for k in ("bos_token", "eos_token")}

    def render(messages: Sequence[Message]) -> str:
        return template.render(messages=list(messages), add_generation_prompt=True, **specials)

    return ChatTemplate(str(config_path), render)


def _token_text(value) -> str:
    if isinstance(value, dict):  # {"content": "<s>", "lstrip": false, ...}
        return value.get("content", "")
    return value or ""


def encode_conversation(
    template: ChatTemplate, tokenizer: Tokenizer, messages: Sequence[Message]
) -> list[int]:
    """Token ids of the rendered conversation; special tokens only where the template put them.

    Raises ValueError when the template refuses the conversation; InvalidArgument when a
    content holds a special token's text and the template rewrites contents (so it cannot
    be kept apart)."""
    specials = QWEN_SPECIALS_IN_TEXT
    if not any(sp in m["content"] for m in messages for sp in specials):
        return tokenizer.encode(template.render(messages))
    marked = [{**m, "content": _PLACEHOLDER.format(i)} for i, m in enumerate(messages)]
    rendered = template.render(marked)
    text, spans = [], []  # the prompt in pieces; (start, end) of each content in it
    length = 0
    for i, m in enumerate(messages):
        before, placeholder, rendered = rendered.partition(_PLACEHOLDER.format(i))
        if not placeholder or _PLACEHOLDER.format(i) in rendered:
            raise InvalidArgument(
                f"messages[{i}].content",
                "holds a special token's text, and this model's chat template does not copy "
                "contents verbatim, so it cannot be kept plain text: leave the token out",
            )
        text += [before, m["content"]]
        spans.append((length + len(before), length + len(before) + len(m["content"])))
        length += len(before) + len(m["content"])
    prompt = "".join([*text, rendered])
    # A special token's text that overlaps a content is split after its first character:
    # neither piece is a special token, and the pieces decode to the same text.
    cuts = sorted(
        p + 1
        for sp in specials
        for p in _occurrences(prompt, sp)
        if any(p < end and p + len(sp) > start for start, end in spans)
    )
    ids, prev = [], 0
    for cut in cuts:
        ids += tokenizer.encode(prompt[prev:cut])
        prev = cut
    return ids + tokenizer.encode(prompt[prev:])


def _occurrences(text: str, sub: str) -> list[int]:
    found, p = [], text.find(sub)
    while p >= 0:
        found.append(p)
        p = text.find(sub, p + 1)
    return found
