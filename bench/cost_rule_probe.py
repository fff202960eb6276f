"""Probe (deleted once its answer is in docs/benchmarks.md): does the cost rule's model of an
eviction match what the steps then do?

Runs `rimuru bench` with its arguments (after the first: a name for this run) and records,
for elastic, every eviction the cost rule priced (batch, dB, copies, dc, fixed, per_copy) and
per step the copies made against the copies the rule's independence model expects for that
step's tokens (live routing shares, the experts offloaded in it). Prints a table and writes
<output-dir>/probe_<name>.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from rimuru.cli import main
from rimuru.dataplane.adjust import adjuster
from rimuru.dataplane.engine import boundary
from rimuru.dataplane.engine.copy_budget import CopyControl
from rimuru.dataplane.engine.engine import Engine

PRICED: list[tuple] = []
ADMIT: list[tuple] = []
STEPS: list[tuple] = []
_last_copies = [0]
_shares: dict[int, np.ndarray] = {}


def _logged(into, pays):
    def wrapper(view, done, extra, dc):
        ok = pays(view, done, extra, dc)
        c, db = view.cost, view.batch_per_eviction
        into.append(
            (ok, view.batch + done * db, db, view.copies + extra, dc, c.fixed, c.per_seq,
             c.per_copy, view.mix.mixed_share, view.mix.extra_tokens, view.demand)
        )  # fmt: skip
        return ok

    return wrapper


adjuster.eviction_pays = _logged(PRICED, adjuster.eviction_pays)
boundary.eviction_pays = _logged(ADMIT, boundary.eviction_pays)

_end_step = CopyControl.end_step


def end_step(self, *args, **kwargs):
    _last_copies[0] = _end_step(self, *args, **kwargs)
    return _last_copies[0]


CopyControl.end_step = end_step

_record = Engine._record


def record(self, out, step, running, seconds):
    _record(self, out, step, running, seconds)
    if self.tunables.mode != "elastic" or not out.scheduled:
        return
    seqs, tokens = len(out.scheduled), out.num_tokens
    resident = self.experts.resident_sets()
    num_experts = self.ranking.num_experts
    num_off = sum(num_experts - len(r) for r in resident)
    expect_tok = expect_seq = 0.0
    if num_off and step % 4 == 0:
        ranking = self.boundary.live.ranking_now or self.ranking
        shares = _shares.get(id(ranking))
        if shares is None:
            shares = np.array(
                [[ranking.share(l, e) for e in range(num_experts)] for l in range(len(resident))]
            )
            _shares.clear()
            _shares[id(ranking)] = shares
        off = np.ones_like(shares, dtype=bool)
        for layer, here in enumerate(resident):
            off[layer, list(here)] = False
        keep = 1.0 - np.minimum(1.0, self.model_config.top_k * shares[off])
        expect_tok = float(np.sum(1.0 - keep**tokens))
        expect_seq = float(np.sum(1.0 - keep**seqs))
    STEPS.append((step, seqs, tokens, _last_copies[0], seconds, num_off, expect_tok, expect_seq))


Engine._record = record


def summarize(name: str, out_dir: Path) -> None:
    if not STEPS:
        return
    s = np.array(STEPS, dtype=float)
    seqs, tokens, copies, secs, off, etok, eseq = (s[:, i] for i in range(1, 8))
    decode = tokens == seqs
    sampled = etok > 0
    print(f"\n== probe {name}: {len(s)} elastic steps, {int(decode.sum())} decode-only")
    print("| steps | n | mean seqs | mean tokens | mean offloaded | copies/step | model copies/step | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    summary = {"steps": len(s)}
    for label, mask in (("decode-only", decode & sampled), ("mixed", ~decode & sampled)):
        if mask.sum():
            a, m = copies[mask].mean(), etok[mask].mean()
            summary[label] = dict(n=int(mask.sum()), copies=a, model=m, seqs=seqs[mask].mean(),
                                  tokens=tokens[mask].mean(), offloaded=off[mask].mean())  # fmt: skip
            print(
                f"| {label} | {int(mask.sum())} | {seqs[mask].mean():.1f} | {tokens[mask].mean():.0f} "
                f"| {off[mask].mean():.0f} | {a:.2f} | {m:.2f} | {a / m if m else float('nan'):.3f} |"
            )
    # what a copy adds to a decode step's time, fitted: T = a + b*seqs + c*copies
    d = decode & (secs > 0)
    if d.sum() > 20:
        x = np.stack([np.ones(d.sum()), seqs[d], copies[d]], axis=1)
        coef, *_ = np.linalg.lstsq(x, secs[d], rcond=None)
        summary["fit_ms"] = dict(fixed=coef[0] * 1e3, per_seq=coef[1] * 1e3, per_copy=coef[2] * 1e3)
        print(f"decode step fit: fixed {coef[0]*1e3:.2f} ms, per seq {coef[1]*1e3:.4f} ms, "
              f"per copy {coef[2]*1e3:.4f} ms")  # fmt: skip
    for label, rows in (("evictions priced", PRICED), ("admission checks", ADMIT)):
        if not rows:
            continue
        p = np.array(rows, dtype=float)
        ok = p[:, 0] > 0
        print(f"{label}: {len(p)} priced, {int(ok.sum())} paid")
        for tag, mask in (("paid", ok), ("refused", ~ok)):
            if mask.sum():
                q = np.median(p[mask], axis=0)
                lhs = q[2] * (q[5] + q[7] * q[3])
                rhs = max(q[1], 1) * q[7] * q[4]
                line = (f"  {tag} medians: B {q[1]:.1f} dB {q[2]:.3f} c {q[3]:.1f} dc {q[4]:.3f} "
                        f"fixed {q[5]*1e3:.2f} ms per_seq {q[6]*1e3:.4f} ms per_copy {q[7]*1e3:.3f} ms "
                        f"w {q[8]:.2f} X {q[9]:.0f} demand {p[mask][:, 10].mean():.2f} | lhs {lhs*1e3:.3f} rhs {rhs*1e3:.3f} ms")  # fmt: skip
                print(line)
                summary[f"{label} {tag}"] = line
    (out_dir / f"probe_{name}.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    name, argv = sys.argv[1], sys.argv[2:]
    rc = main(["bench", *argv])
    out = Path(argv[argv.index("--output-dir") + 1])
    summarize(name, out)
    sys.exit(rc)
