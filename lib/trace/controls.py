"""TRACE's caption controls for notebook 02's claim "captions help": caption sources derived from notebook 01's
TRACE JSON, on which the default model trains exactly as on the real captions.

- `shuffled`, the ingredient check: each meme's caption columns are those of another meme of the same split (a
  seeded derangement). The candidates, the relevance scorer and Gumbel selection stay; what a caption says about
  its own meme goes. "captions help" against it isolates what the captions say from the machinery that reads
  them (the no-caption variant removes both).
- `cue`, the positive control: the first caption column of every meme says what MemeWorld's generator knows
  of it (its `final_reason`: the interplay of text and picture, which the image encoder cannot read). Captions
  then carry information by construction. The control's arm is sized where 04's and 05's oracle controls are,
  on the test's own arms (lib.evaluation.claims.control_at_effect: the base arm with the cue model's answers
  on the fewest memes that give the paper's effect), so its effect is the paper's, not a larger one. (A cue on
  only a share of the memes, sized from validation accuracy, failed twice: the model leaned on the cue and
  lost the memes without it, and the share could not buy the effect where test accuracy exceeds validation.)

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
from lib.evaluation.claims import claim_tests, positive_controls
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
#: (claim, A, B, what it isolates): TRACE's claims on FHM's test_seen, the default model against the run that
#: removes one ingredient. The TRACE paper reports no such ablation on FHM: each is held to the default effect
TRACE_CLAIMS = (
    ("captions help", "cls+rel", "image_text_only",
     "the default model against the same model without captions (image and meme text: no caption, no selection)"),
    ("what the captions say helps (selection kept)", "cls+rel", "shuffled",
     "the default model on its captions against the same model on another meme's captions: candidates, "
     "relevance scorer and Gumbel selection kept"),
    ("the relevance loss beats the contrastive one", "cls+rel", "cls+con",
     "the same model and captions, trained with the caption-relevance or the contrastive auxiliary loss"),
)
#: each claim's positive control: the default model on the cue source (captions that state the true cue), its
#: answers on the fewest memes that give the paper's effect against the claim's base arm. The loss claim's
#: control shows that the same test, on the same memes against the contrastive arm, detects that effect
TRACE_CONTROLS = (("captions help", "cue", "image_text_only"),
                  ("what the captions say helps (selection kept)", "cue", "shuffled"),
                  ("the relevance loss beats the contrastive one", "cue", "cls+con"))
#: the claims whose mechanism is the captions themselves (lib.trace.probe's precondition applies to them)
CAPTION_CLAIMS = ("captions help", "what the captions say helps (selection kept)")


def run_correct(result: dict[str, Any], split: str = "test_seen") -> dict[str, bool]:
    """Meme id -> right or wrong of one run on `split` (its saved predictions)."""
    return {str(p["id"]): p["prediction"] == p["label"] for p in result["eval"]["predictions"] if p["split"] == split}


def option_variant(default: str, option: str) -> str:
    """The run name of the default model with a caption option's candidates ("cls+rel (interplay captions)")."""
    return f"{default} ({option} captions)"


def option_claims(options: Sequence[str], default: str = "cls+rel") -> tuple[tuple, tuple]:
    """(claims, controls) of the caption options: each option's captions against the model without captions,
    the claim "captions help" with the option's candidates; its positive control is the caption claim's."""
    claims = tuple((f"{o} captions help", option_variant(default, o), "image_text_only",
                    f"the default model with the {o} option's candidates against the same model without captions")
                   for o in options)
    return claims, tuple((c[0], "cue", "image_text_only") for c in claims)


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
                split: str = "test_seen", confidence: float = 0.95, captions_precondition: bool | None = None,
                options: dict[str, bool | None] | None = None):
    """Notebook 02's claims table (the columns of 04's and 05's): each claim of TRACE_CLAIMS whose two runs exist,
    on the memes of `split`, exact McNemar on the first seed and, where both arms have further seeds (`seeds`:
    variant -> its replicate runs, in seed order), a row pooled over the seeds both have, clustered by meme;
    the positive controls' rows first (TRACE_CONTROLS); `captions_precondition`: whether the run's captions carry
    what the encoder cannot read (lib.trace.probe; None: not measured), for the caption claims. Returns (claims,
    per-seed rows). `options`: caption option -> whether its captions carry what the encoder cannot read (the
    option's runs are in `runs` and `seeds` under option_variant's name; each adds option_claims' claim)."""
    import pandas as pd
    options = options or {}
    opt_claims, opt_controls = option_claims(list(options))
    correct = {name: run_correct(r, split) for name, r in runs.items()}
    for variant, reps in (seeds or {}).items():
        correct.update({f"{variant}_run{k}": run_correct(r, split) for k, r in enumerate(reps, 1)})
    truth = {str(p["id"]): int(p["label"]) for r in runs.values() for p in r["eval"]["predictions"] if p["split"] == split}
    control_rows, detected = positive_controls(TRACE_CONTROLS + opt_controls, correct, truth, confidence, items="memes")
    pre = {claim: captions_precondition for claim in CAPTION_CLAIMS}
    pre.update({c[0]: met for c, met in zip(opt_claims, options.values())})
    rows, per_seed = claim_tests(TRACE_CLAIMS + opt_claims, correct, truth, confidence, controls=detected,
                                 preconditions=pre)
    for r in rows:                                   # the replicates here are training seeds, not cold runs
        r["claim"] = r["claim"].replace("cold runs pooled", "seeds pooled")
    return pd.DataFrame(control_rows + rows), pd.DataFrame(per_seed)


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

