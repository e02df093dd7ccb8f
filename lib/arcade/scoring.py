"""ARCADE evaluated as the official code does: the balanced sample of H-VLI posts, accuracy per
interaction type and difficulty (strict and corrected views), the report text and the cost summary.
"""
from __future__ import annotations

import random
from typing import Any, Sequence

from lib.arcade.court import LABELS, TYPES, SampleResult
from lib.evaluation.metrics import classification_report


# ----------------------------------------------------------------------------- sampling
def sampler_items(records: Sequence[Any]) -> list[tuple[str, str]]:
    """(id, type) pairs in file order, as the official sampler groups them: by the type the file
    stores ('unknown' where it stores none, as in the first release), not the type derived here."""
    return [(str(r.id), str(r.meta.get("sample_type", r.meta.get("type", "unknown")))) for r in records]


def balanced_sample(items: Sequence[tuple[str, str]], n: int, seed: int = 2024) -> list[str]:
    """The official balanced sampler (`--samples N --seed S`): ids in the order it returns them.

    `items` are (id, type) pairs in file order. n = 0 or n >= len: all, file order. Otherwise
    the types are grouped in first-appearance order, each group shuffled and cut to n // n_types,
    the remainder filled by `random.sample` from the leftovers, and the selection shuffled. A
    private `random.Random(seed)` draws the same sequence as the official `random.seed(seed)`
    followed by calls on the global generator.
    """
    if n <= 0 or n >= len(items):
        return [i for i, _ in items]
    rng = random.Random(seed)
    groups: dict[str, list[tuple[str, str]]] = {}
    for item in items:
        groups.setdefault(item[1], []).append(item)
    quota = n // len(groups)
    selected: list[tuple[str, str]] = []
    pool: list[tuple[str, str]] = []
    for members in groups.values():
        members = list(members)
        rng.shuffle(members)
        take = min(len(members), quota)
        selected += members[:take]
        pool += members[take:]
    needed = n - len(selected)
    if needed > 0:
        selected += rng.sample(pool, needed)
    rng.shuffle(selected)
    return [i for i, _ in selected]


# ----------------------------------------------------------------------------- evaluation
def _metrics_block(gts: list[int], preds: list[int], binary: bool, labels: Sequence[int] | None = None) -> dict[str, float]:
    """The F1 block of an evaluation (lib.evaluation.metrics; unanswered = -1 = wrong): binary gives the
    hateful class's F1 / precision / recall and macro-F1, multiclass macro- and weighted-F1."""
    if not gts:
        return {}
    if binary:
        rep = classification_report([int(x > 0) for x in gts], [-1 if p < 0 else int(p > 0) for p in preds],
                                    labels=[0, 1], positive=1)
        return {k: rep[k] for k in ("f1_positive", "precision_positive", "recall_positive", "macro_f1")}
    rep = classification_report(gts, preds, labels=labels)
    return {k: rep[k] for k in ("macro_f1", "weighted_f1")}


def _other_types(results: Sequence[SampleResult]) -> tuple[str, ...]:
    """Types outside the eight interaction types (`unknown` for a post with a null label), sorted."""
    return tuple(sorted({r.type for r in results} - set(TYPES)))


def evaluate(results: Sequence[SampleResult], class_mode: str = "multiclass", view: str = "corrected") -> dict[str, Any]:
    """Accuracy per difficulty and type, overall; F1s. `view`:
    - `official`: the official evaluator: refused samples leave every denominator; a label that is
      not an integer is -1 (wrong; inside F1 forced to the wrong class); binary mode maps > 0 to 1;
      multiclass F1 over the labels present; binary F1 is the positive class's.
    - `corrected`: every sample counts; refused, blocked, failed and unparseable are wrong (-1)
      and reported by cause; multiclass F1 over the six labels; binary reports macro-F1 too.
    Difficulty always comes from `type`, as the official evaluator derives it.
    """
    if view not in ("official", "corrected"):
        raise ValueError(f"view must be 'official' or 'corrected', got {view!r}")
    binary = class_mode == "binary"
    rows = []
    refused = {"all": 0}
    causes: dict[str, int] = {}
    for r in results:
        if view == "official" and r.official_refusal:
            refused["all"] += 1
            refused[r.type] = refused.get(r.type, 0) + 1
            refused[r.difficulty] = refused.get(r.difficulty, 0) + 1
            continue
        if view == "official":      # the official evaluator's int(label) reading, also of an unreadable answer
            pred = r.official_label if r.official_label is not None else r.label
            pred = -1 if pred < 0 else pred
        else:
            pred = r.label if r.status == "ok" else -1
        if view == "corrected" and r.status != "ok":
            causes[f"{r.status}:{r.cause}"] = causes.get(f"{r.status}:{r.cause}", 0) + 1
        gt = int(r.gt > 0) if binary else r.gt
        pr = (int(pred > 0) if pred >= 0 else -1) if binary else pred
        rows.append((r, gt, pr))

    def acc(sel):
        return sum(gt == pr for _, gt, pr in sel) / len(sel) if sel else float("nan")

    def bacc(sel):
        return sum((gt > 0) == (pr > 0) and pr >= 0 for _, gt, pr in sel) / len(sel) if sel else float("nan")
    out: dict[str, Any] = {"view": view, "class_mode": class_mode, "n": len(rows), "n_refused": refused["all"],
                           "acc": acc(rows)}
    for d in ("Easy", "Normal", "Hard"):
        sel = [x for x in rows if x[0].difficulty == d]
        out[f"acc_{d.lower()}"], out[f"n_{d.lower()}"] = acc(sel), len(sel)
    nh = [x for x in rows if x[0].difficulty in ("Normal", "Hard")]
    out["acc_normal_hard"], out["n_normal_hard"] = acc(nh), len(nh)
    for t in TYPES + _other_types(results):
        sel = [x for x in rows if x[0].type == t]
        out[f"acc_type_{t}"], out[f"n_type_{t}"] = acc(sel), len(sel)
    unknown = [x for x in rows if x[0].difficulty not in ("Easy", "Normal", "Hard")]
    if unknown or any(r.difficulty not in ("Easy", "Normal", "Hard") for r in results):
        # posts whose type the labels cannot give (a null label in the first release): kept, shown apart
        out["acc_unknown"], out["n_unknown"] = acc(unknown), len(unknown)
    if not binary:
        out["binary_acc"] = bacc(rows)
    gts = [gt for _, gt, _ in rows]
    prs = [pr for _, _, pr in rows]
    out.update(_metrics_block(gts, prs, binary, list(LABELS) if view == "corrected" and not binary else None))
    if binary and rows:
        out["confusion"] = classification_report(gts, prs, labels=[0, 1], positive=1)["confusion"]
    out["refused_by_group"] = refused
    out["not_ok_by_cause"] = causes
    total = len(rows) + refused["all"]
    out["refused_share"] = refused["all"] / total if total else 0.0
    return out


def report_text(results: Sequence[SampleResult], class_mode: str, run_mode: str, model: str) -> str:
    """`report.txt` in the official layout (official view)."""
    ev = evaluate(results, class_mode, "official")
    binary = class_mode == "binary"
    lines = [f"Report: [{run_mode}] - Model: {model} (Mode: {class_mode})",
             f"Safety Refused: {ev['n_refused']} samples (Excluded from stats)", "",
             f"[Global Performance] (N={ev['n']})", f"  Strict Accuracy: {100 * ev['acc']:.2f}%"]
    if binary:
        lines += [f"  F1 Score: {ev.get('f1_positive', 0):.4f}", f"  Precision: {ev.get('precision_positive', 0):.4f}",
                  f"  Recall: {ev.get('recall_positive', 0):.4f}", f"  Confusion Matrix: {ev.get('confusion')}"]
    else:
        lines += [f"  Binary Accuracy: {100 * ev['binary_acc']:.2f}%", f"  F1 Macro: {ev.get('macro_f1', 0):.4f}",
                  f"  F1 Weighted: {ev.get('weighted_f1', 0):.4f}"]
    lines += ["", "[Breakdown by Difficulty]"]
    ok = [r for r in results if not r.official_refusal]
    groups = [("Easy", ("Easy",)), ("Normal", ("Normal",)), ("Hard", ("Hard",)), ("Normal + Hard", ("Normal", "Hard"))]
    if any(r.difficulty == "Unknown" for r in results):
        groups.append(("Unknown", ("Unknown",)))
    for name, diffs in groups:
        sel = [r for r in ok if r.difficulty in diffs]
        ref = sum(1 for r in results if r.official_refusal and r.difficulty in diffs)
        sub = evaluate(sel, class_mode, "official") if sel else None
        strict = f"{100 * sub['acc']:.2f}%" if sub else "n/a"
        extra = "" if binary or not sub else f", Binary={100 * sub['binary_acc']:.2f}%"
        lines.append(f"  {name}: Strict={strict}{extra}, N={len(sel)}, Refused={ref}")
    lines += ["", "[Breakdown by Type]"]
    for t in TYPES + _other_types(results):
        n = ev[f"n_type_{t}"]
        lines.append(f"  {t}: Acc={100 * ev[f'acc_type_{t}']:.1f}% (N={n})" if n else f"  {t}: (N=0)")
    ref_pct = 100 * ev["refused_share"]
    if binary:
        row = [ev["acc_easy"], ev["acc_normal"], ev["acc_hard"], ev["acc"], ev.get("recall_positive", 0),
               ev.get("f1_positive", 0)]
    else:
        row = [ev["acc_easy"], ev["acc_normal"], ev["acc_hard"], ev["acc"], ev.get("macro_f1", 0),
               ev.get("weighted_f1", 0)]
    vals = [round(100 * v, 2) if v == v else float("nan") for v in row] + [ev["n_refused"], round(ref_pct, 2)]
    lines += ["", "[COPY DATA SOURCE]", str(vals)]
    return "\n".join(lines) + "\n"


def cost_summary(results: Sequence[SampleResult], rounds: int) -> dict[str, float]:
    """Calls and tokens per sample by route, the share of each route, and what the gate saves
    against sending every sample through Track II with no gate (K rounds of two + the judge)."""
    out: dict[str, float] = {}
    n = len(results) or 1
    calls = [len(r.calls) for r in results]
    out["calls_per_sample"] = sum(calls) / n
    out["tokens_per_sample"] = sum(c.prompt_tokens + c.completion_tokens for r in results for c in r.calls) / n
    for route in ("track1", "track2", "dismissal", "error"):
        sel = [r for r in results if r.route == route]
        out[f"share_{route}"] = len(sel) / n
        out[f"calls_per_sample_{route}"] = sum(len(r.calls) for r in sel) / len(sel) if sel else 0.0
    full_track2 = 2 * rounds + 1
    out["calls_all_track2"] = float(full_track2)
    out["gate_call_saving"] = 1 - out["calls_per_sample"] / full_track2
    return out
