"""`rimuru generate "prompt"`: one completion, streamed to stdout.

In-process by default (builds the engine here, CPU `tiny` preset unless told otherwise);
with `--target host:port` it asks a running data plane over gRPC instead. Text prompts
need the model's tokenizer (Qwen vocabularies); `--token-ids 1,2,3` always works and
prints token ids back. Usage and timing go to stderr.
"""

from __future__ import annotations

import argparse
import sys
import time

from rimuru.cli_args import positive_int, target
from rimuru.dataplane.engine.flags import add_engine_arguments, engine_config_from_args
from rimuru.dataplane.engine.sched.request import raise_if_failed
from rimuru.dataplane.model.tokenizer import format_token_ids, parse_token_ids


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompt", nargs="?", default=None, help="prompt text")
    p.add_argument("--token-ids", default=None, help="prompt as token ids, e.g. 1,2,3")
    p.add_argument(
        "--target",
        type=target,
        default=None,
        help="host:port of a data plane (default: in-process)",
    )
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop-token-ids", default="", help="comma-separated")
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--timeout", type=float, default=300.0, help="--target: deadline in seconds")
    p.add_argument(
        "--token-file", default=None, help="--target: bearer token file (serve --api-token-file)"
    )
    p.add_argument("--tls-ca", default=None, help="--target: PEM root certificate: talk TLS")
    engine = p.add_argument_group("in-process engine")
    # --seed above is the sampling seed (as vLLM's); presets' weights keep the default seed.
    add_engine_arguments(engine, skip=("seed",))
    engine.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads")


def run(args: argparse.Namespace) -> int:
    from rimuru.dataplane.engine.sched.request import SamplingParams

    if args.prompt is None and args.token_ids is None:
        raise ValueError('give a prompt: as text (rimuru generate "...") or as --token-ids 1,2,3')
    if args.prompt is not None and args.token_ids is not None:
        raise ValueError('give the prompt as text ("...") or as --token-ids 1,2,3, not both')
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        stop_token_ids=tuple(parse_token_ids(args.stop_token_ids)) if args.stop_token_ids else (),
        ignore_eos=args.ignore_eos,
    )
    token_ids = parse_token_ids(args.token_ids) if args.token_ids is not None else None
    if args.target:
        return _remote(args, token_ids, params)
    return _in_process(args, token_ids, params)


def _in_process(args: argparse.Namespace, token_ids: list[int] | None, params) -> int:
    import torch

    from rimuru.dataplane.parallel.launch import engine_builder

    config = engine_config_from_args(args)
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    with engine_builder(config, threads=args.threads) as build:
        return _generate(build(config, log_plan=False), args, token_ids, params)


def _generate(engine, args: argparse.Namespace, token_ids: list[int] | None, params) -> int:
    from rimuru.dataplane.model.tokenizer import load_tokenizer

    mc = engine.model_config
    tokenizer = load_tokenizer(mc.family, mc.vocab_size)
    if token_ids is None:
        if tokenizer is None:
            raise ValueError(f"model {args.model!r} has no tokenizer here: use --token-ids")
        token_ids = tokenizer.encode(args.prompt)
    detok = tokenizer.detokenizer() if tokenizer is not None and args.prompt is not None else None
    started = time.monotonic()
    request_id = engine.add_request(token_ids, params)
    out = _Printer(detok)
    while engine.has_unfinished_requests():
        for delta in engine.step():
            out.tokens(delta.new_token_ids)
    out.end()
    r = engine.requests[request_id]
    raise_if_failed(r)
    _summary(
        r.status.value.removeprefix("finished_"),
        len(token_ids),
        len(r.output_token_ids),
        (r.first_token_time or started) - started,
        time.monotonic() - started,
    )
    return 0


def _remote(args: argparse.Namespace, token_ids: list[int] | None, params) -> int:
    import grpc

    from rimuru.dataplane.serve.grpc_front.convert import sampling_to_proto
    from rimuru.rpc import read_root_certificates, read_token
    from rimuru.v1 import inference_pb2 as pb
    from rimuru.v1 import inference_pb2_grpc as pb_grpc

    request = pb.GenerateRequest(sampling=sampling_to_proto(params))
    if token_ids is not None:
        request.token_ids.ids.extend(token_ids)
    else:
        request.text = args.prompt
    show_text = args.prompt is not None
    out = _Printer()
    if not args.timeout > 0:
        raise ValueError(f"--timeout must be > 0 seconds; got {args.timeout}")
    metadata = None
    if args.token_file:
        metadata = [("authorization", f"Bearer {read_token(args.token_file)}")]
    if args.tls_ca:
        credentials = grpc.ssl_channel_credentials(read_root_certificates(args.tls_ca, "--tls-ca"))
        channel = grpc.secure_channel(args.target, credentials)
    else:
        channel = grpc.insecure_channel(args.target)
    with channel:
        try:
            stub = pb_grpc.InferenceStub(channel)
            for response in stub.Generate(request, timeout=args.timeout, metadata=metadata):
                if response.HasField("delta"):
                    if show_text:
                        out.text(response.delta.text)
                    else:
                        out.tokens(response.delta.token_ids)
                else:
                    final = response.final
                    out.end()
                    reason = pb.FinishReason.Name(final.finish_reason)
                    _summary(
                        reason.removeprefix("FINISH_REASON_").lower(),
                        final.usage.prompt_tokens,
                        final.usage.completion_tokens,
                        final.timing.time_to_first_token_seconds,
                        final.timing.e2e_seconds,
                    )
        except grpc.RpcError as exc:
            if out.started:
                out.end()
            hint = ""
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                hint = f" (is a data plane listening at {args.target}? `rimuru serve` starts one)"
            print(f"rimuru generate: {exc.code().name}: {exc.details()}{hint}", file=sys.stderr)
            # The server refused the request's values: bad input, as a bad flag is.
            return 2 if exc.code() == grpc.StatusCode.INVALID_ARGUMENT else 1
    return 0


class _Printer:
    """Streams text deltas (text prompt and a tokenizer), else comma-separated token ids."""

    def __init__(self, detok=None) -> None:
        self._detok = detok
        self._first = True
        self.started = False  # something printed: an error starts on a new line

    def tokens(self, ids) -> None:
        if self._detok is not None:
            self.text(self._detok.add(ids))
        elif ids:
            print(("" if self._first else ",") + format_token_ids(ids), end="", flush=True)
            self._first = False
            self.started = True

    def text(self, text: str) -> None:
        print(text, end="", flush=True)
        self.started = self.started or bool(text)

    def end(self) -> None:
        print(self._detok.flush() if self._detok is not None else "")


def _summary(reason: str, prompt: int, completion: int, ttft_s: float, e2e_s: float) -> None:
    print(
        f"[{reason}] prompt {prompt} tokens, completion {completion} tokens, "
        f"TTFT {ttft_s * 1000:.0f} ms, total {e2e_s * 1000:.0f} ms",
        file=sys.stderr,
    )
