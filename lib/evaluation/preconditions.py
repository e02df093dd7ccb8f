"""Each method's precondition, measured on a run's results with an interval, against the value at which the
method could plausibly work: the table that says whether a null is about the method or about MemeWorld's
components. Read from the per-item files the notebooks write (results/<profile>/ or artifacts/<profile>/),
so it is generated wherever those exist.

| method | precondition | measured | threshold, and why |
|---|---|---|---|
| TRACE | captions carry what the image encoder cannot read | the label accuracy a linear probe on the frozen encoder gains when the captions join its image and meme-text embeddings (per caption source: the run's captions, each caption option's, the cue; the trained models' caption benefit where no probe ran) | its interval above 0: a caption that adds nothing the encoder lacks leaves selection nothing to find |
| See, Explain, Intervene | retrieved exemplars are informative neighbours | exemplar label agreement at n = 4 | at least 0.65 against the 0.50 base rate of a balanced set |
| few-shot moderator | the model reads a meme at all | zero-shot accuracy on the balanced set (as served; adapted to MemeWorld and its shuffled-label control where notebook 04 trained them) | at least the majority line + 0.10 |
| ARCADE | the judge's verdict varies with the post | the share of the judge's most common label (as run, and with oracle debaters; the judge adapted to MemeWorld as run, where notebook 05 trained it) | below 0.95 (claims.NEAR_CONSTANT): a constant judge cannot weigh a debate |
| ARCADE | the judge can tell the categories from a debate | its accuracy when the debaters state the true cue (as served; adapted to MemeWorld and its shuffled-verdict control where notebook 05 trained them), on the sampled posts and on the emergent-hate posts the Track II claims are decided on (each claim reads the row of its own posts: lib.arcade.report.judge_preconditions) | at least the majority line + 0.10 |
"""
from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np

from lib.evaluation.claims import NEAR_CONSTANT
from lib.evaluation.metrics import mean_ci, proportion_ci

#: the thresholds of the table above
LABEL_AGREEMENT_MIN = 0.65
READS_MEMES_MARGIN = 0.10


def _row(method: str, precondition: str, measured: str, value: float, lo: float, hi: float, threshold: str,
         met: bool | None, n: str) -> dict[str, Any]:
    return {"method": method, "precondition": precondition, "measured": measured, "value": round(value, 3),
            "95% CI": f"[{lo:.3f}, {hi:.3f}]", "n": n, "threshold": threshold,
            "status": "not measured" if met is None else ("met" if met else "not met")}


def _labels(root: Path) -> dict[str, int]:
    f = root / "00_data_prep" / "memes.csv"
    return {r["id"]: int(r["label"]) for r in csv.DictReader(f.open(encoding="utf-8"))} if f.exists() else {}


#: notebook 02's caption sources as the probe names them (lib.trace.probe): the real captions first
PROBE_SOURCES = (("captions", "the run's captions"), ("interplay", "the interplay captioner's captions (a caption option)"),
                 ("cue", "cue captions (the positive control's source)"))


def trace_rows(root: Path) -> list[dict[str, Any]]:
    """TRACE's rows: the captions' gain in a linear probe of the label on the frozen encoder (notebook 02's
    probe_captions_label_* metrics, one row per caption source), or, from a run before the probe, the caption
    benefit of the trained models."""
    f = root / "02_finetuning" / "metrics.json"
    m = json.loads(f.read_text()) if f.exists() else {}
    rows = []
    for source, what in PROBE_SOURCES:
        k = f"probe_{source}_label"
        if f"{k}_gain" in m:
            lo, hi = m[f"{k}_ci_low"], m[f"{k}_ci_high"]
            rows.append(_row("TRACE", "captions carry what the image encoder cannot read",
                             f"label accuracy a linear probe on the frozen encoder gains when {what} join the image "
                             f"and meme text (test_seen)", m[f"{k}_gain"], lo, hi, "interval above 0", lo > 0,
                             f"{m[f'{k}_n']} memes"))
    if rows or "caption_benefit_acc" not in m:
        return rows
    lo, hi = m["caption_benefit_ci_low"], m["caption_benefit_ci_high"]
    return [_row("TRACE", "captions carry what the image encoder cannot read",
                 "caption benefit: default - no-caption accuracy (test_seen)", m["caption_benefit_acc"], lo, hi,
                 "interval above 0", lo > 0, f"{m['caption_benefit_n']} memes")]


def retrieval_rows(root: Path, n: int = 4) -> list[dict[str, Any]]:
    """One row per retriever notebook 04 ran (exemplars_fhm_<retriever>.json), the image-only one first."""
    labels = _labels(root)
    files = sorted((root / "04_few_shot").glob("exemplars_fhm_*.json"), key=lambda f: ("+" in f.stem, f.stem))
    out = []
    for f in files if labels else []:
        ex = json.loads(f.read_text())
        per_query = [np.mean([labels[p] == labels[q] for p, _ in shots[:n]]) for q, shots in ex.items()
                     if q in labels and all(p in labels for p, _ in shots[:n])]
        if not per_query:
            continue
        mean, lo, hi, _ = mean_ci(per_query)
        retriever = f.stem.removeprefix("exemplars_fhm_")
        out.append({**_row("See, Explain, Intervene", "retrieved exemplars are informative neighbours",
                           f"exemplars sharing the query's label ({retriever}, n = {n}; base rate 0.50)", mean, lo, hi,
                           f">= {LABEL_AGREEMENT_MIN:.2f}", lo >= LABEL_AGREEMENT_MIN, f"{len(per_query)} queries"),
                    "component": retriever})
    return out


def retrieval_status(root: str | Path, n: int = 4) -> dict[str, bool]:
    """Retriever -> whether its exemplars meet the See-Explain-Intervene precondition (retrieval_rows), for
    notebook 04's claims table."""
    return {r["component"]: r["status"] == "met" for r in retrieval_rows(Path(root), n)}


def moderator_row(root: Path, setting: str = "zero_shot", file: str = "predictions_fhm.jsonl",
                  where: dict[str, Any] | None = None, method: str = "few-shot moderator") -> dict[str, Any] | None:
    """The moderator's precondition from notebook 04's per-meme answers (`file`, rows matching `where`):
    zero-shot accuracy with its Wilson interval, met when the interval's lower end reaches the majority line
    + READS_MEMES_MARGIN."""
    f = root / "04_few_shot" / file
    if not f.exists():
        return None
    rows = [json.loads(x) for x in f.read_text(encoding="utf-8").splitlines() if x.strip()]
    rows = [r for r in rows if r["setting"] == setting and all(r.get(k) == v for k, v in (where or {}).items())]
    if not rows:
        return None
    right = sum(r["status"] == "ok" and r["label"] == r["gold"] for r in rows)
    acc, lo, hi = proportion_ci(right, len(rows))
    share = float(np.mean([r["gold"] for r in rows]))
    line = max(share, 1 - share) + READS_MEMES_MARGIN
    return _row(method, "the model reads a meme at all", "zero-shot accuracy (balanced FHM test set)",
                acc, lo, hi, f">= majority line + {READS_MEMES_MARGIN:.2f} ({line:.2f})", lo >= line, f"{len(rows)} memes")


#: notebook 04's adapted moderator (lib.sei.adapt) and its shuffled-label control, where the run trained them
ADAPTED_MODERATORS = (("model", "few-shot moderator, adapted to MemeWorld (LoRA)"),
                      ("control", "few-shot moderator, adapter trained on shuffled labels (control)"))


def adapted_moderator_rows(root: Path) -> list[dict[str, Any]]:
    return [r for r in (moderator_row(root, file="predictions_adapted.jsonl", where={"role": role}, method=method)
                        for role, method in ADAPTED_MODERATORS) if r]


#: the judge rows: (variant, how the measured quantity reads): the court as run, and with oracle debaters
JUDGE_VARIANTS = (("arcade", "share of the judge's most common label"),
                  ("oracle", "the same, with debaters that state the post's true cue (oracle)"))


#: the adapted judge's rows (lib.arcade.adapt; notebook 05's `adapted_judge` option): (method, variant)
ADAPTED_JUDGES = (("ARCADE, judge adapted to MemeWorld (LoRA)", "_adapted"),
                  ("ARCADE, judge adapter trained on shuffled verdicts (control)", "_shuffled"))


def judge_row(root: Path, variant: str = "arcade", measured: str = JUDGE_VARIANTS[0][1],
              method: str = "ARCADE") -> dict[str, Any] | None:
    f = root / "05_debate" / f"results_{variant}.jsonl"
    if not f.exists():
        return None
    labels = [json.loads(x)["label"] for x in f.read_text(encoding="utf-8").splitlines() if x.strip()]
    if not labels:
        return None
    top = max(labels.count(v) for v in set(labels))
    share, lo, hi = proportion_ci(top, len(labels))
    return _row(method, "the judge's verdict varies with the post", measured, share, lo, hi, f"< {NEAR_CONSTANT:.2f}", hi < NEAR_CONSTANT, f"{len(labels)} posts")


#: the oracle runs on the emergent-hate posts alone (the Track II claims' posts): variant stem -> what it adds to
#: the measured quantity's name
TYPE001_ORACLE = ("oracle_type001", ", on the emergent-hate posts (type 001) the Track II claims are decided on")


def oracle_judge_row(root: Path, variant: str = "oracle", method: str = "ARCADE") -> dict[str, Any] | None:
    """The judge given the right arguments: its accuracy when the debaters state each post's true cue (the
    `oracle` variant, or `oracle_type001` on the emergent-hate posts alone), against those posts' majority
    line + READS_MEMES_MARGIN."""
    f = root / "05_debate" / f"results_{variant}.jsonl"
    if not f.exists():
        return None
    rows = [json.loads(x) for x in f.read_text(encoding="utf-8").splitlines() if x.strip()]
    rows = [r for r in rows if r.get("gt") is not None]
    if not rows:
        return None
    right = sum(r.get("status") == "ok" and r.get("label") == r["gt"] for r in rows)
    acc, lo, hi = proportion_ci(right, len(rows))
    gts = [r["gt"] for r in rows]
    line = max(gts.count(g) for g in set(gts)) / len(gts) + READS_MEMES_MARGIN
    return _row(method, "the judge can tell the categories from a debate",
                "judge accuracy when the debaters state the true cue (oracle)"
                + (TYPE001_ORACLE[1] if variant.startswith(TYPE001_ORACLE[0]) else ""), acc, lo, hi,
                f">= majority line + {READS_MEMES_MARGIN:.2f} ({line:.2f})", lo >= line, f"{len(rows)} posts")


def adapted_judge_rows(root: Path) -> list[dict[str, Any]]:
    """The adapted judge's rows where its runs exist: its verdicts' spread on the court as run, and its
    accuracy with oracle debaters; the control's (shuffled verdicts) accuracy with oracle debaters."""
    rows = []
    for method, suffix in ADAPTED_JUDGES:
        if suffix == "_adapted":
            rows.append(judge_row(root, "arcade" + suffix, JUDGE_VARIANTS[0][1], method))
        rows.append(oracle_judge_row(root, "oracle" + suffix, method))
        rows.append(oracle_judge_row(root, TYPE001_ORACLE[0] + suffix, method))
    return [r for r in rows if r]


def judge_status(root: str | Path, variant: str = "oracle") -> bool | None:
    """Whether ARCADE's judge meets its precondition (oracle_judge_row: it tells the categories when the
    debaters state each post's true cue), for notebook 05's claims table: every claim there is decided by
    that judge. `variant`: the oracle run of the judge in question (`oracle_adapted`: the adapted judge's).
    None where that oracle variant did not run."""
    row = oracle_judge_row(Path(root), variant)
    return None if row is None else row["status"] == "met"


def precondition_rows(root: str | Path) -> list[dict[str, Any]]:
    """The table's rows that `root` (a folder of stage folders) has the files for, in the order above."""
    root = Path(root)
    rows = [*trace_rows(root), *retrieval_rows(root), moderator_row(root), *adapted_moderator_rows(root),
            *(judge_row(root, v, m) for v, m in JUDGE_VARIANTS),
            oracle_judge_row(root), oracle_judge_row(root, TYPE001_ORACLE[0]), *adapted_judge_rows(root)]
    return [{k: v for k, v in r.items() if k != "component"} for r in rows if r]


def precondition_block(root: str | Path) -> str:
    """The table as markdown (the README's block; each method's notebook reads its own row)."""
    rows = precondition_rows(root)
    if not rows:
        return "_No committed results yet: run `make reproduce`._"
    out = ["| method | precondition | measured | value [95% CI] | n | threshold | status |", "|---|---|---|---|---|---|---|"]
    out += [f"| {r['method']} | {r['precondition']} | {r['measured']} | {r['value']:.3f} {r['95% CI']} | {r['n']} | "
            f"{r['threshold']} | {r['status']} |" for r in rows]
    return "\n".join(out)
