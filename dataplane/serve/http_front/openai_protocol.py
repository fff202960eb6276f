"""OpenAI's HTTP request bodies, their conversion to the engine's values, and error bodies.

Requests are pydantic models (unknown fields are ignored, as OpenAI and vLLM do; fields
this server does not implement are refused unless left at their defaults). Responses are
plain dicts built here: a stream sends one per token batch and needs no validation.
vLLM's extensions are accepted under vLLM's names: `top_k`, `stop_token_ids`,
`ignore_eos`, `return_token_ids`.
"""

from __future__ import annotations

import json
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from rimuru.dataplane.engine.sched.request import MAX_SEED, SamplingParams
from rimuru.dataplane.serve.plane.errors import (
    EngineFailed,
    FailedPrecondition,
    InvalidArgument,
    QueueFull,
    ServeError,
    Unavailable,
)

# Bounds on what one request may ask of the event loop: each is refused with a 400 naming
# it before any work is queued (docs/serving.md lists them).
MAX_CHOICES = 128  # prompts x n in one request
MAX_STOP_STRINGS = 1024  # as many as gRPC's stop token ids (vLLM caps its id lists at 1024)
MAX_STOP_STRING_CHARS = 16384  # all stop strings together: the matcher's size per request
# The roles OpenAI defines and chat templates know; any other string would be pasted into the
# prompt as the template's role header (a role of "user<|im_end|>..." forges turns).
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's legacy completions default
FINISH_REASONS = {"length": "length", "stopped": "stop", "aborted": "abort"}


class ModelNotFound(ServeError):
    """The request names a model this server does not serve (HTTP 404)."""


class InvalidBody(ServeError):
    """The body is no JSON object (truncated, not UTF-8, nested too deep): HTTP 400, no param."""


class BodyTooLarge(ServeError):
    """The request body is over --http-max-body-bytes (HTTP 413); nothing of it was parsed."""


class RequestTimeout(ServeError):
    """The body did not arrive in time (HTTP 408)."""


class RouteNotFound(ServeError):
    """No route at this path (HTTP 404)."""


class MethodNotAllowed(ServeError):
    """The path exists, not with this method (HTTP 405)."""


class StreamOptions(BaseModel):
    include_usage: bool = False


class _SamplingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    # Integers are strict: JSON's true and 1.0 are not counts, seeds or token ids.
    max_tokens: StrictInt | None = None
    temperature: float = 1.0  # OpenAI's default (the engine's own default is greedy)
    top_p: float = 1.0
    top_k: StrictInt = 0
    n: StrictInt = 1
    seed: StrictInt | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[StrictInt] = Field(default_factory=list)
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
        stop = self.stop_strings
        if len(stop) > MAX_STOP_STRINGS:
            raise InvalidArgument(
                "stop", f"holds {len(stop)} strings; at most {MAX_STOP_STRINGS} are allowed"
            )
        num_chars = sum(len(s) for s in stop)
        if num_chars > MAX_STOP_STRING_CHARS:
            raise InvalidArgument(
                "stop",
                f"holds {num_chars} characters in all; at most {MAX_STOP_STRING_CHARS} are allowed",
            )

    def check_seed(self, num_choices: int) -> None:
        """Choice i samples with seed + i: the last one must still be a valid seed."""
        if self.seed is None or not 0 <= self.seed <= MAX_SEED:
            return  # SamplingParams refuses an out-of-range seed itself, naming it
        if self.seed + num_choices - 1 > MAX_SEED:
            raise InvalidArgument(
                "seed",
                f"choice i samples with seed + i, so with {num_choices} choices the seed must be "
                f"at most 2**64 - {num_choices}; got {self.seed}",
            )

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
    # Checked by prompts(), not by pydantic: a union's error names its members, not the
    # element at fault, and a token id must be a JSON integer (not true, not 1.0).
    prompt: str | list
    echo: bool = False
    suffix: str | None = None

    def _more_defaults(self) -> dict[str, tuple]:
        return {"echo": (False,), "suffix": (None, "")}

    def prompts(self) -> list[str | list[int]]:
        """One prompt, or a batch of them; each is text or token ids."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if not prompt:
            raise InvalidArgument("prompt", "is empty: give text or at least one token id")
        if isinstance(prompt[0], int) and not isinstance(prompt[0], bool):
            return [_token_ids(prompt, "prompt")]
        if isinstance(prompt[0], str):
            for i, p in enumerate(prompt):
                if not isinstance(p, str):
                    raise InvalidArgument(f"prompt[{i}]", "a batch of text prompts holds strings")
            return list(prompt)
        if isinstance(prompt[0], list):
            return [_token_ids(p, f"prompt[{i}]") for i, p in enumerate(prompt)]
        raise InvalidArgument(
            "prompt[0]",
            f"{_json(prompt[0])} is no prompt: give a string, token ids (integers), "
            "a list of strings or a list of token-id lists",
        )


def _token_ids(ids, name: str) -> list[int]:
    if not isinstance(ids, list):
        raise InvalidArgument(name, f"{_json(ids)} is not a list of token ids")
    for i, t in enumerate(ids):
        if not isinstance(t, int) or isinstance(t, bool):
            raise InvalidArgument(f"{name}[{i}]", f"{_json(t)} is not a token id (an integer)")
    return ids


def _json(value) -> str:
    """A short JSON spelling of a rejected value, for an error message."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


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
    max_completion_tokens: StrictInt | None = None  # OpenAI's newer name for max_tokens
    tools: list | None = None
    response_format: dict | None = None

    def _more_defaults(self) -> dict[str, tuple]:
        return {"tools": (None, []), "response_format": (None, {"type": "text"})}

    def conversation(self) -> list[dict[str, str]]:
        if not self.messages:
            raise InvalidArgument("messages", "is empty: give at least one message")
        for i, m in enumerate(self.messages):
            if m.role not in CHAT_ROLES:
                raise InvalidArgument(
                    f"messages[{i}].role",
                    f"{_json(m.role)} is not a role: use one of {', '.join(CHAT_ROLES)}",
                )
        return [{"role": m.role, "content": m.text(i)} for i, m in enumerate(self.messages)]

    @property
    def requested_max_tokens(self) -> int | None:
        return (
            self.max_completion_tokens
            if self.max_completion_tokens is not None
            else self.max_tokens
        )


def parse_body(model: type[BaseModel], raw: bytes) -> BaseModel:
    """A request model from raw JSON bytes; InvalidArgument naming the field otherwise."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise _invalid(exc) from None


def _invalid(exc: ValidationError) -> ServeError:
    first = exc.errors(include_url=False)[0]
    if first["type"] == "json_invalid":  # truncated, not UTF-8, nested too deep, ...
        detail = first["msg"].removeprefix("Invalid JSON: ")
        return InvalidBody(f"the request body is not valid JSON: {detail}")
    param = _param(first["loc"])
    if not param:
        return InvalidBody("the request body must be a JSON object")
    return InvalidArgument(param, first["msg"])


def _param(loc: tuple) -> str:
    """messages.0.content -> messages[0].content. A union's errors name its member types in
    the location (`str`, `list[int]`, `ContentPart`): those are no part of the JSON path."""
    param = ""
    for part in loc:
        if isinstance(part, int):
            param += f"[{part}]"
        elif part.isidentifier() and part.islower() and part not in _TYPE_NAMES:
            param += f".{part}" if param else part
    return param


_TYPE_NAMES = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


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


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """OpenAI's usage object; cached_tokens: prompt tokens the prefix cache served."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
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
    InvalidBody: (400, "invalid_request_error"),
    FailedPrecondition: (400, "invalid_request_error"),
    ModelNotFound: (404, "not_found_error"),
    RouteNotFound: (404, "not_found_error"),
    MethodNotAllowed: (405, "invalid_request_error"),
    RequestTimeout: (408, "invalid_request_error"),
    BodyTooLarge: (413, "invalid_request_error"),
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
