"""TRACE's caption controls for notebook 02's claim "captions help": caption sources derived from notebook 01's
TRACE JSON, on which the default model trains exactly as on the real captions.

- `shuffled`, the ingredient check: each meme's caption columns are those of another meme of the same split (a
  seeded derangement). The candidates, the relevance scorer and Gumbel selection stay; what a caption says about
  its own meme goes. "captions help" against it isolates what the captions say from the machinery that reads
  them (the no-caption variant removes both).
- `cue`, the positive control: the first caption column of every meme says what MemeWorld's generator knows
  of it (its `final_reason`: the interplay of text and picture, which the image encoder cannot read). Captions
  then carry information by construction. The control is that whole arm of the pipeline (the default model
  trained on the cue source, on every seed), tested against each claim's B arm with the claim's own test on the
  claim's memes: it says whether this pipeline can carry what captions say at all. Nothing is substituted.

    src = derive_source(trace_json, out_dir / "trace_captions_cue.json", "cue", columns, accounts=accounts,
                        share=1.0)
    runs = derived_runs(stage, src, "cue")          # a TraceRuns on that source, its own runs folder
"""
from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Any, Sequence

from lib.compendium.artifacts import write_json
from lib.evaluation import plan as analysis
from lib.evaluation.claims import cold_runs_of, plan_rows, table
from lib.trace.report import TraceRuns, seed_replicates
from lib.trace.runs import load_trace_data, subsample

KINDS = ("shuffled", "cue")


class ControlError(ValueError):
    """A caption control that cannot be built; the message names the file, record and field."""


def _derangement(n: int, rng: random.Random) -> list[int]:
    """A permutation of range(n) with no fixed point (n >= 2), uniformly by rejection."""
    while True:
        p = list(range(n))
        rng.shuffle(p)
        if all(i != j for i, j in enumerate(p)):
            return p


def derive_source(src: str | Path, out: str | Path, kind: str, columns: Sequence[str], seed: int = 0,
                  accounts: dict[str, dict[str, Any]] | None = None, share: float | None = None) -> Path:
    """Write `out`, notebook 01's TRACE JSON `src` with its caption `columns` derived (`kind`: shuffled or cue,
    see the module's docstring); every other field as it was. `accounts` (meme id -> MemeWorld generator
    record) and `share` are the cue's. Written atomically; the same inputs give the same file."""
    if kind not in KINDS:
        raise ControlError(f"derive_source: kind {kind!r}; expected one of {', '.join(KINDS)}")
    if not columns:
        raise ControlError("derive_source: no caption column to derive")
    src = Path(src)
    recs = json.loads(src.read_text(encoding="utf-8"))
    if not isinstance(recs, list):
        raise ControlError(f"{src}: a TRACE JSON list of memes is expected")
    rng = random.Random(f"{seed}|{kind}")
    by_split: dict[str, list[int]] = {}
    for i, r in enumerate(recs):
        by_split.setdefault(str(r.get("split")), []).append(i)
    out_recs = [dict(r) for r in recs]
    for split in sorted(by_split):
        idx = by_split[split]
        if kind == "shuffled":
            if len(idx) < 2:
                continue
            for i, j in zip(idx, (idx[k] for k in _derangement(len(idx), rng))):
                for c in columns:
                    out_recs[i][c] = recs[j].get(c)
            continue
        if accounts is None or share is None or not 0 <= share <= 1:
            raise ControlError("derive_source: the cue needs the generator's accounts and a share in [0, 1]")
        chosen = sorted(rng.sample(idx, round(share * len(idx))))
        for i in chosen:
            rid = str(recs[i].get("id"))
            reason = (accounts.get(rid) or {}).get("final_reason")
            if not reason:
                raise ControlError(f"{src}: record {i} (id {rid!r}): MemeWorld's generator has no 'final_reason' "
                                   f"for it (the cue control needs MemeWorld)")
            out_recs[i][columns[0]] = str(reason)
    write_json(out, out_recs)
    return Path(out)


def derived_runs(stage: TraceRuns, source: str | Path, tag: str) -> TraceRuns:
    """`stage`'s runs on a derived caption source: the same section, columns, sizes and workers, the source's
    memes (subsampled as the stage's are) and a runs folder of their own (`runs_<tag>` beside `runs`)."""
    data = subsample(load_trace_data(source, stage.columns), stage.max_memes, stage.seed)
    return dataclasses.replace(stage, data=data, src=Path(source), runs_dir=stage.runs_dir.parent / f"runs_{tag}",
                               caches={})


# ----------------------------------------------------------------------------- notebook 02's claims table
#: what each planned claim (params/analysis/plan.yaml, stage 02_finetuning) isolates
TRACE_WHAT = {
    "trace.captions_help": "the default model against the same model without captions (image and meme text: no "
                           "caption, no selection)",
    "trace.caption_content": "the default model on its captions against the same model on another meme's captions: "
                             "candidates, relevance scorer and Gumbel selection kept",
    "trace.relevance_loss": "the same model and captions, trained with the caption-relevance or the contrastive "
                            "auxiliary loss",
    "trace.interplay_captions": "the default model with the interplay captioner's candidates against the same model "
                                "without captions",
}
#: the claims whose mechanism is the captions themselves (lib.trace.probe's precondition applies to them)
CAPTION_CLAIMS = ("trace.captions_help", "trace.caption_content")


def run_correct(result: dict[str, Any], split: str = "test_seen") -> dict[str, bool]:
    """Meme id -> right or wrong of one run on `split` (its saved predictions)."""
    return {str(p["id"]): p["prediction"] == p["label"] for p in result["eval"]["predictions"] if p["split"] == split}


def option_variant(default: str, option: str) -> str:
    """The run name of the default model with a caption option's candidates ("cls+rel (interplay captions)")."""
    return f"{default} ({option} captions)"


def option_runs(stage: TraceRuns, options: dict[str, Sequence[str]], default: tuple[str, dict[str, Any], str],
                seeds: Sequence[int], types: dict[str, str] | None = None):
    """Notebook 02's caption options (name -> candidate columns): the `default` variant trained on the stage's
    source with each option's candidates instead of `caption_columns`, on this notebook's seed and every further
    seed, in a runs folder of its own (`runs_<name>`). A column only the option names must hold a caption for at
    least one meme (a column of the default's own that holds none, as the ci world's tags, is masked as the
    default masks it). Returns ({name: first-seed run}, {name: [further seeds' runs]}); finished runs are read back."""
    firsts, further = {}, {}
    for name, cols in options.items():
        if not cols or len(set(cols)) != len(cols):
            raise ControlError(f"caption_options: option {name!r} needs distinct caption columns, got {list(cols)!r}")
        data = subsample(load_trace_data(stage.src, cols), stage.max_memes, stage.seed)
        for j, c in enumerate(cols, 1):
            if c not in stage.columns and not (data.cap_index[:, j] >= 0).any():
                raise ControlError(f"{stage.src}: caption option {name!r} names column {c!r}, which no meme holds "
                                   f"(notebook 01 writes it when its captioner is configured)")
        runs = dataclasses.replace(stage, data=data, columns=list(cols), caches={},
                                   runs_dir=stage.runs_dir.parent / f"runs_{name}")
        firsts[name], further[name] = _default_and_seeds(runs, name, default, seeds, types)
    return firsts, further


def _default_and_seeds(runs: TraceRuns, name: str, default: tuple[str, dict[str, Any], str], seeds: Sequence[int],
                       types: dict[str, str] | None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """`runs`' `default` variant on its own seed and on every further seed in `seeds`, trained (finished runs read
    back) and collected: (the first seed's run, [the further seeds' runs])."""
    first = runs.job(*default)
    reps = seed_replicates(runs, {name: default}, [name], seeds)
    runs.train([first] + [j for _, j in reps])
    return runs.collect(first, types), [runs.collect(j, types) for _, j in reps]


def claim_frame(runs: dict[str, dict[str, Any]], seeds: dict[str, Sequence[dict[str, Any]]] | None = None,
                split: str = "test_seen", confidence: float = 0.95, captions_precondition: str | None = None,
                options: dict[str, str | None] | None = None, components: dict[str, str] | None = None,
                plan=None):
    """Notebook 02's claims table: each claim the analysis plan (params/analysis/plan.yaml) gives notebook 02, on
    the memes of `split` (lib.evaluation.claims.plan_rows): decided on the seeds (a paired t over the per-seed
    accuracy differences: the trained models are the unit), the first seed's McNemar and the items pooled over the
    seeds beside it; its control is the cue arm (the default model on captions that state the true cue, every seed)
    against the claim's B arm, its baseline the caption-only model (a classifier on the captions alone).
    `seeds`: variant -> its replicate runs, in seed order. `captions_precondition`, `options` (caption option ->
    its precondition) and `components` (claim id -> the component check): text for their columns. Returns
    (claims, per-seed rows)."""
    import pandas as pd
    plan = plan or analysis.load()
    correct = {name: run_correct(r, split) for name, r in runs.items()}
    for variant, reps in (seeds or {}).items():
        correct.update({f"{variant}_run{k}": run_correct(r, split) for k, r in enumerate(reps, 1)})
    truth = {str(p["id"]): int(p["label"]) for r in runs.values() for p in r["eval"]["predictions"] if p["split"] == split}
    pre = {cid: captions_precondition for cid in CAPTION_CLAIMS if captions_precondition}
    for name, status in (options or {}).items():
        if status:
            pre[f"trace.{name}_captions"] = status
    rows = plan_rows(plan.of("02_finetuning", "claims.csv"), correct, truth, plan_digest=plan.digest, alpha=plan.alpha,
                     family_sizes=plan.family_sizes(),
                     power=plan.power, confidence=confidence, preconditions=pre, components=components or {},
                     what=TRACE_WHAT)
    per_seed = [{"claim": r["claim"], "A": r["A"], "B": r["B"], "seed": k, "difference": d}
                for r, t in _per_seed(rows, correct) for k, d in enumerate(t)]
    return table(rows), pd.DataFrame(per_seed)


def precondition_text(probe_m: dict[str, Any], name: str = "captions") -> str | None:
    """A caption claim's precondition column: whether the source's captions carry what the frozen encoder cannot
    read (lib.trace.probe: the label accuracy a linear probe gains from them, with its interval; "met" needs the
    whole interval above 0). None where the probe did not run."""
    k = f"probe_{name}_label"
    if f"{k}_ci_low" not in probe_m:
        return None
    met = probe_m[f"{k}_ci_low"] > 0
    return (f"{'met' if met else 'not met'}: a linear probe gains {probe_m[f'{k}_gain']:+.3f} "
            f"[{probe_m[f'{k}_ci_low']:+.3f}, {probe_m[f'{k}_ci_high']:+.3f}] from them")


def component_checks(captioning_metrics: dict[str, Any]) -> dict[str, str]:
    """Claim id -> its component check: the interplay captioner's caption states the meme's label (notebook 01's
    isolated check), so its claim reads the captioner's capacity, not TRACE's mechanism."""
    m = captioning_metrics
    if "interplay_label_acc" not in m:
        return {}
    return {"trace.interplay_captions": f"capacity check: the captioner's caption implies the label on "
                                        f"{m['interplay_label_acc']:.3f} of {int(m['interplay_check_n'])} memes "
                                        f"(notebook 01): the caption states the answer"}


def _per_seed(rows, correct):
    """(primary row, its per-seed accuracy differences) for the seed-level rows (the spread a single seed draws from)."""
    out = []
    for r in rows:
        if r["role"] != "primary" or not str(r["test"]).startswith("paired t over"):
            continue
        names = list(correct)
        ra, rb = cold_runs_of(r["A"], names), cold_runs_of(r["B"], names)
        k = min(len(ra), len(rb))
        ids = [i for i in correct[r["A"]] if all(i in correct[x] for x in (*ra[:k], *rb[:k]))]
        out.append((r, [sum(correct[x][i] for i in ids) / len(ids) - sum(correct[y][i] for i in ids) / len(ids)
                        for x, y in zip(ra[:k], rb[:k])]))
    return out


def control_runs(stage: TraceRuns, src: str | Path, out_dir: str | Path, default: tuple[str, dict[str, Any], str],
                 seeds: Sequence[int], seed: int, accounts: dict[str, dict[str, Any]],
                 types: dict[str, str] | None = None, share: float = 1.0):
    """Notebook 02's two derived sources (KINDS), each trained as the `default` variant (ablation_variants'
    (backbone, overrides, tag)) on this notebook's seed and on every further seed in `seeds`: returns
    ({kind: first-seed run}, {kind: [the further seeds' runs]}). Sources are written to `out_dir`
    (trace_captions_<kind>.json); the cue is on `share` of each split's memes (every meme by default: see the
    module's docstring). Finished runs are read back, never retrained."""
    if not 0 < share <= 1:
        raise ControlError(f"control_runs: the cue's share of memes must be in (0, 1], got {share!r}")
    firsts, further = {}, {}
    for kind in KINDS:
        derived = derive_source(src, Path(out_dir) / f"trace_captions_{kind}.json", kind, stage.columns, seed=seed,
                                accounts=accounts if kind == "cue" else None, share=share if kind == "cue" else None)
        runs = derived_runs(stage, derived, kind)
        firsts[kind], further[kind] = _default_and_seeds(runs, kind, default, seeds, types)
    return firsts, further

