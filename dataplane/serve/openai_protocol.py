"""OpenAI's HTTP request bodies, their conversion to the engine's values, and error bodies.

Requests are pydantic models (unknown fields are ignored, as OpenAI and vLLM do; fields
this server does not implement are refused unless left at their defaults). Responses are
plain dicts built here: a stream sends one per token batch and needs no validation.
vLLM's extensions are accepted under vLLM's names: `top_k`, `stop_token_ids`,
`ignore_eos`, `return_token_ids`.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rimuru.dataplane.engine.sched.request import SamplingParams
from rimuru.dataplane.serve.errors import (
    EngineFailed,
    FailedPrecondition,
    InvalidArgument,
    QueueFull,
    ServeError,
    Unavailable,
)

MAX_CHOICES = 128  # prompts x n in one request
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's legacy completions default
FINISH_REASONS = {"length": "length", "stopped": "stop", "aborted": "abort"}


class ModelNotFound(ServeError):
    """The request names a model this server does not serve (HTTP 404)."""


class StreamOptions(BaseModel):
    include_usage: bool = False


class _SamplingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = None
    temperature: float = 1.0  # OpenAI's default (the engine's own default is greedy)
    top_p: float = 1.0
    top_k: int = 0
    n: int = 1
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] = Field(default_factory=list)
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool = False
    # OpenAI fields not implemented here: accepted only at their defaults.
    logprobs: Any = None
    best_of: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict | None = None

    def check_supported(self) -> None:
        defaults = {"logprobs": (None, False), "best_of": (None, 1), "logit_bias": (None, {})}
        defaults |= {"presence_penalty": (0.0,), "frequency_penalty": (0.0,)}
        defaults |= self._more_defaults()
        for name, allowed in defaults.items():
            if getattr(self, name) not in allowed:
                raise InvalidArgument(name, "is not supported by this server")
        if not 1 <= self.n <= MAX_CHOICES:
            raise InvalidArgument("n", f"must lie in [1, {MAX_CHOICES}], got {self.n}")

    def _more_defaults(self) -> dict[str, tuple]:
        return {}

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def sampling_params(
        self, max_tokens: int, choice: int, extra_stop_token_ids: tuple[int, ...] = ()
    ) -> SamplingParams:
        """Engine params of choice number `choice` (n > 1: seed + choice, as vLLM does)."""
        seed = self.seed + choice if self.seed is not None else None
        fields = {
            "max_tokens": max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": seed,
            "stop_token_ids": (*self.stop_token_ids, *extra_stop_token_ids),
            "ignore_eos": self.ignore_eos,
        }
        try:
            return SamplingParams(**fields)
        except ValueError as exc:
            # SamplingParams names its field first ("top_p must lie in ...").
            name = str(exc).split(" ", 1)[0]
            raise InvalidArgument(name if name in fields else "sampling", str(exc)) from None


class CompletionRequest(_SamplingRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
    suffix: str | None = None

    def _more_defaults(self) -> dict[str, tuple]:
        return {"echo": (False,), "suffix": (None, "")}

    def prompts(self) -> list[str | list[int]]:
        """One prompt, or a batch of them; each is text or token ids."""
        if isinstance(self.prompt, str) or (self.prompt and isinstance(self.prompt[0], int)):
            return [self.prompt]
        if not self.prompt:
            raise InvalidArgument("prompt", "is empty: give text or at least one token id")
        return list(self.prompt)


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: str
    content: str | list[ContentPart] | None = None

    def text(self, index: int) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise InvalidArgument(
                    f"messages[{index}].content",
                    f"only text parts are supported, got {part.type!r}",
                )
        return "\n".join(part.text for part in self.content)


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None  # OpenAI's newer name for max_tokens
    tools: list | None = None
    response_format: dict | None = None

    def _more_defaults(self) -> dict[str, tuple]:
        return {"tools": (None, []), "response_format": (None, {"type": "text"})}

    def conversation(self) -> list[dict[str, str]]:
        if not self.messages:
            raise InvalidArgument("messages", "is empty: give at least one message")
        return [{"role": m.role, "content": m.text(i)} for i, m in enumerate(self.messages)]

    @property
    def requested_max_tokens(self) -> int | None:
        return (
            self.max_completion_tokens
            if self.max_completion_tokens is not None
            else self.max_tokens
        )


# ---------------------------------------------------------------------------- responses
def chunk(
    kind: str, request_id: str, model: str, created: int, choices: list[dict], usage=None
) -> dict:
    """A response or a stream chunk; kind: text_completion, chat.completion(.chunk)."""
    return {
        "id": request_id,
        "object": kind,
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage,
    }


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def model_list(model: str, max_model_len: int, created: int) -> dict:
    card = {
        "id": model,
        "object": "model",
        "created": created,
        "owned_by": "rimuru",
        "max_model_len": max_model_len,
    }
    return {"object": "list", "data": [card]}


def now() -> int:
    return int(time.time())


# ---------------------------------------------------------------------------- errors
# HTTP status and OpenAI error type of each domain error: the HTTP twin of errors._CODES.
_HTTP: dict[type[ServeError], tuple[int, str]] = {
    InvalidArgument: (400, "invalid_request_error"),
    FailedPrecondition: (400, "invalid_request_error"),
    ModelNotFound: (404, "not_found_error"),
    QueueFull: (429, "rate_limit_error"),
    Unavailable: (503, "service_unavailable_error"),
    EngineFailed: (500, "internal_error"),
}


def http_error(exc: ServeError) -> tuple[int, dict]:
    """(status, OpenAI error body) of a domain error."""
    status, kind = next(
        (_HTTP[cls] for cls in type(exc).__mro__ if cls in _HTTP), (500, "internal_error")
    )
    param = exc.field if isinstance(exc, InvalidArgument) else None
    code = "model_not_found" if isinstance(exc, ModelNotFound) else None
    return status, error_body(str(exc), kind, param, code)


def error_body(
    message: str, kind: str, param: str | None = None, code: str | int | None = None
) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
