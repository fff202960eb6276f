"""Chat messages -> one prompt string, for /v1/chat/completions.

A local model directory's tokenizer_config.json `chat_template` (Jinja, rendered in a
sandbox as transformers does) when it has one and jinja2 is installed; ChatML otherwise,
which is what the Qwen presets (and `tiny`, which borrows their vocabulary) were trained on.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

log = logging.getLogger("rimuru.serve")

Message = dict[str, str]  # {"role": ..., "content": ...}
CHATML_END = "<|im_end|>"


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
