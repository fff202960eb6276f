"""The engine's command-line flags: one table, one set of defaults, one builder.

Every command that builds an engine (`rimuru serve`, `bench`, `generate`, `plan`,
`profile-hotness`) adds these flags with `add_engine_arguments` and builds its
EngineConfig with `engine_config_from_args`, so the same flags mean the same engine
everywhere: `rimuru plan` predicts the server that `rimuru serve` starts with the same
flags. The defaults are EngineConfig's and Tunables' own, never written again here.

No torch: the operator's tests and `--help` import this (config.py imports no torch).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from rimuru.dataplane.engine.startup.config import CUDAGRAPH_MODES, EXPERT_COPY_MODES, EngineConfig
from rimuru.dataplane.memory.geometry import BLOCK_SIZE
from rimuru.policy import ELASTIC_RULES, EXPERT_MATRICES, MODES, Tunables
from rimuru.sizes import parse_bytes

ON, OFF = ("on", "true", "1", "yes"), ("off", "false", "0", "no")


@dataclass(frozen=True)
class EngineFlag:
    dest: str  # the EngineConfig field, or the Tunables field where `tunable`
    help: str
    type: Any = None  # argparse type; None = the string as given
    choices: tuple[str, ...] | None = None
    tunable: bool = False
    switch: bool = False  # on/off (a bare flag means on)
    bytes: bool = False  # a size such as 28.8GiB, parsed by the builder
    env_aliases: tuple[str, ...] = ()  # the operator's ConfigMap names, read after RIMURU_<FLAG>
    field: str = ""  # the field's name where it is not dest
    short: str = ""  # another spelling, such as vLLM's -tp
    negated: bool = False  # a switch that also takes --no-<flag> for off (vLLM's spelling)
    # Retired: a knob that had this one valid value. Old scripts and older operators'
    # ConfigMaps still give it, so it is taken (and sets nothing), hidden from --help; any
    # other value is refused. `help` says why the value is fixed.
    only: int | None = None

    @property
    def field_name(self) -> str:
        return self.field or self.dest

    @property
    def flag(self) -> str:
        return "--" + self.dest.replace("_", "-")

    @property
    def env(self) -> tuple[str, ...]:
        return ("RIMURU_" + self.dest.upper(), *self.env_aliases)

    @property
    def default(self) -> Any:
        if self.only is not None:
            return None
        owner = Tunables if self.tunable else EngineConfig
        value = {f.name: f.default for f in dataclasses.fields(owner)}[self.field_name]
        if self.switch:
            return "auto" if value is None else "on" if value else "off"
        return value

    @property
    def has_auto(self) -> bool:
        """A switch whose default (None) lets the engine choose: it also takes "auto"."""
        return self.switch and self.default == "auto"


ENGINE_FLAGS: tuple[EngineFlag, ...] = (
    EngineFlag("model", "preset name or local Hugging Face directory",
               env_aliases=("RIMURU_MODEL_PATH", "RIMURU_PRESET")),
    EngineFlag("dtype", "float32, bfloat16 or float16; default (or auto): the model's"),
    EngineFlag("device", "cpu or cuda[:N]"),
    EngineFlag("seed", "weights seed of presets", type=int),
    EngineFlag("router_skew", "presets: Zipf exponent of expert popularity (0 = none)",
               type=float),
    EngineFlag("memory_budget", "bytes the engine may use on the device, e.g. 28.8GiB",
               bytes=True, env_aliases=("RIMURU_MEMORY_BUDGET_BYTES",)),
    EngineFlag("gpu_memory_utilization", "or a share of the GPU's memory", type=float),
    EngineFlag("max_num_seqs", "requests in one batch, at most", type=int),
    EngineFlag("max_num_batched_tokens", "tokens per step, at most", type=int),
    EngineFlag("max_model_len", "context length, at most the model's; default: the model's", type=int),
    EngineFlag("block_size", "the kernels' page layout", type=int, only=BLOCK_SIZE),
    EngineFlag("activation_reserve", "bytes kept for activations; default: measured (CUDA) "
               "or estimated from the shapes", bytes=True),
    EngineFlag("mode", "memory policy", choices=MODES, tunable=True,
               env_aliases=("RIMURU_POLICY_MODE",)),
    EngineFlag("expert_offload_limit", "experts per layer off the device", type=int,
               tunable=True),
    EngineFlag("shrink_threshold", "adjuster: evict below this many free expert pages",
               type=int, tunable=True),
    EngineFlag("grow_threshold", "adjuster: load above this many free expert pages", type=int,
               tunable=True),
    EngineFlag("max_grow_per_round", "adjuster: loads per round", type=int, tunable=True),
    EngineFlag("pages_per_expert", "an expert takes one page for each of w1, w3, w2",
               type=int, only=EXPERT_MATRICES),
    EngineFlag("copy_budget", "elastic: expert copies per decode step the offloaded experts "
               "may cost (expected from the ranking or measured, the larger); evictions stop "
               "and admission is capped there (0 = no budget)", type=float, tunable=True),
    EngineFlag("elastic_rule", "elastic: cost evicts only where the KV pages buy more output "
               "than the copies cost (measured); paper evicts whenever pages run short",
               choices=ELASTIC_RULES, tunable=True),
    EngineFlag("tpot_slo_ms", "elastic, cost rule: evictions may not push a decode step's "
               "estimated time past this many ms (0 = no SLO)", type=float, tunable=True),
    EngineFlag("fixed_expert_share", "fixed policy: the pool's share for experts", type=float),
    EngineFlag("loading_buffer_slots", "experts per loading buffer; caps the live "
               "expert_offload_limit (default: enough for the start-up policy)", type=int),
    EngineFlag("hotness", "offline hotness ranking file (rimuru profile-hotness); default: "
               "uniform", field="hotness_path"),
    EngineFlag("evict_to_admit", "on or off: elastic evicts experts inside a scheduling round "
               "before preempting a running request short of KV pages (off: preempt, move "
               "the boundary between rounds)", switch=True),
    EngineFlag("expert_copy", "host: host-driven expert copies with prefetch; device: a "
               "kernel copies routed offloaded experts into fixed slots (graph-safe)",
               choices=EXPERT_COPY_MODES),
    EngineFlag("enforce_eager", "on or off: on = never replay CUDA graphs, decode or "
               "piecewise (vLLM's --enforce-eager)", switch=True),
    EngineFlag("cudagraph_mode", "full_and_piecewise: decode steps as whole graphs, the "
               "others as piecewise graphs with eager attention; full_decode_only: the "
               "others eager", choices=CUDAGRAPH_MODES),
    EngineFlag("moe_path", "paged: read experts in place; gather: copy them to contiguous "
               "stacks first (ablation; needs --expert-copy host)", choices=("paged", "gather")),
    EngineFlag("tensor_parallel_size", "ranks splitting every layer, one process per GPU of "
               "this host (the budget flags are per GPU)", type=int, short="-tp"),
    EngineFlag("async_scheduling", "on, off or auto: schedule and launch the next step "
               "before reading this one's tokens back, overlapping host and device (one "
               "GPU; fixed and elastic need --expert-copy device); auto = on where it "
               "overlaps anything (CUDA, one rank)", switch=True),
    EngineFlag("enable_prefix_caching", "on, off or auto: reuse the KV pages of a prompt's "
               "longest cached prefix of full 16-token blocks; auto = on for attention-only "
               "models (hybrids: off, not built yet); --no-enable-prefix-caching = off",
               switch=True, negated=True),
)  # fmt: skip

ENGINE_DESTS = frozenset(f.dest for f in ENGINE_FLAGS)


def add_engine_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    *,
    environ: Mapping[str, str] | None = None,
    skip: Collection[str] = (),
    required: Collection[str] = (),
    defaults: Mapping[str, Any] | None = None,
) -> None:
    """Add the engine's flags. environ: read RIMURU_<FLAG> (and the operator's names) as
    defaults, flags winning (`rimuru serve` in a pod). skip: flags the command replaces
    with its own (say why there). required: flags without a default for this command.
    defaults: a command's own default for a flag (say why there)."""
    defaults = dict(defaults or {})
    unknown = (set(skip) | set(required) | set(defaults)) - ENGINE_DESTS
    if unknown:
        raise ValueError(f"not engine flags: {sorted(unknown)}")
    added = tuple(f.dest for f in ENGINE_FLAGS if f.dest not in skip)
    # The builder reads exactly these: a skipped flag's dest may be the command's own
    # (generate's --seed is the sampling seed).
    parser.set_defaults(engine_flags=added)
    for flag in ENGINE_FLAGS:
        if flag.dest not in added:
            continue
        default = defaults.get(flag.dest, flag.default)
        env_note = ""
        if environ is not None:
            # A string default goes through `type` like a flag, so a bad value in the
            # environment is a usage error too (exit 2), naming the flag.
            default = next((environ[n] for n in flag.env if environ.get(n)), default)
            env_note = f" (env {', '.join(flag.env)})"
        kwargs: dict[str, Any] = {"type": flag.type, "choices": flag.choices}
        if flag.switch:
            # on/off is checked by the builder: argparse does not check an environment
            # default against choices. A bare switch means on.
            metavar = "on|off|auto" if flag.has_auto else "on|off"
            kwargs = {"nargs": "?", "const": "on", "metavar": metavar}
        if flag.dest in required:
            kwargs["required"] = True
        else:
            kwargs["default"] = default
        shown = "" if flag.dest in required else f" (default: {default})"
        names = (flag.flag, flag.short) if flag.short else (flag.flag,)
        text = argparse.SUPPRESS if flag.only is not None else flag.help + shown + env_note
        parser.add_argument(*names, dest=flag.dest, help=text, **kwargs)
        if flag.negated:
            parser.add_argument(
                "--no-" + flag.flag[2:], dest=flag.dest, action="store_const", const="off",
                help=f"the same as {flag.flag} off",
            )  # fmt: skip


def engine_config_from_args(args: argparse.Namespace, mode: str | None = None) -> EngineConfig:
    """The EngineConfig the engine flags in `args` (parsed by a parser that
    add_engine_arguments set up) mean; a flag the command skipped keeps the default.
    `mode`: the memory policy, where the command chooses it (bench's --policies).
    ValueError names the flag or field that is wrong."""
    config: dict[str, Any] = {}
    tunables: dict[str, Any] = {} if mode is None else {"mode": mode}
    for flag in ENGINE_FLAGS:
        if flag.dest not in args.engine_flags:
            continue
        value = getattr(args, flag.dest)
        if flag.only is not None:
            if value is not None and value != flag.only:
                raise ValueError(f"{flag.flag} must be {flag.only} ({flag.help}); got {value}")
            continue
        if flag.switch:
            value = on_off(flag.flag, value, auto=flag.has_auto)
        elif flag.bytes and value is not None:
            value = parse_bytes(str(value))
        elif flag.dest == "dtype" and value in ("", "auto"):
            value = None
        (tunables if flag.tunable else config)[flag.field_name] = value
    return EngineConfig(**config, tunables=Tunables(**tunables))


def on_off(flag: str, value: object, auto: bool = False) -> bool | None:
    """A switch from the command line or the environment; None for "auto" where the
    switch takes it (`auto`: the engine chooses)."""
    text = str(value).strip().lower()
    if text in ON or text in OFF:
        return text in ON
    if auto and text == "auto":
        return None
    choices = "on, off or auto" if auto else "on or off"
    raise ValueError(f"{flag} must be {choices} (or true/false, 1/0, yes/no); got {value!r}")
