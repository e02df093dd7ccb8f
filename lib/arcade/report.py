"""Notebook 05's runs, tables and figures: one ARCADE variant per call, saved as the official code
saves a run (per-sample results + report.txt) plus both evaluator views and the cost summary.

    run = run_variant(chat, samples, cfg, out_dir, "arcade", model="smollm2")
    summary_frame({"arcade": run, ...})        # official and corrected views side by side
"""
from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from lib.compendium.artifacts import read_jsonl, require, write_json, write_jsonl, write_text
from lib.arcade.court import DIFFICULTY, LABELS, TYPES, CallTrace, Court, CourtConfig, SampleResult
from lib.arcade.oracle import OracleCourt, accounts_from_memeworld
from lib.arcade.scoring import balanced_sample, cost_summary, evaluate, report_text
from lib.evaluation.metrics import interval_keys, paired_accuracy_test
from lib.evaluation import plan as analysis
from lib.evaluation.claims import (PAPERS_NUMBER, as_planned, claim_metric_keys, cold_run_metric_keys, cold_runs_of,
                                   constant_arm, first_present, fisher_mdd, plan_rows, share_test, table)
from lib.evaluation.metrics import run_spread
from lib.evaluation.preconditions import judge_status
from lib.evaluation.verdicts import family_confidence


def run_variant(chat, samples: Sequence[Any], cfg: CourtConfig, out_dir: Path, name: str, model: str,
                progress: bool = True, accounts: dict[str, dict[str, Any]] | None = None,
                judge_chat=None) -> dict[str, Any]:
    """Run one court configuration over the samples; write results_<name>.jsonl, report_<name>.txt
    (official layout) and eval_<name>.json (both views, cost); return them with the results. `accounts`
    (post id -> MemeWorld's generator record): the debaters are oracles (lib.arcade.oracle), a variant
    with `oracle: true`. `judge_chat`: another model gives the verdicts (the adapted judge)."""
    chats = [chat] if judge_chat is None else [chat, judge_chat]
    before = sum(c.stats.requests for c in chats)
    t0 = time.perf_counter()
    court = (Court(chat, cfg, judge_chat) if accounts is None else OracleCourt(chat, cfg, accounts, judge_chat))
    results = court.run_many(samples, progress=progress, desc=name)
    run = {"name": name, "config": asdict(cfg), "results": results,
           "calls_made": sum(c.stats.requests for c in chats) - before,
           "wall_s": time.perf_counter() - t0,
           "official": evaluate(results, cfg.class_mode, "official"),
           "corrected": evaluate(results, cfg.class_mode, "corrected"),
           "cost": cost_summary(results, cfg.rounds)}
    out_dir = Path(out_dir)
    write_jsonl(out_dir / f"results_{name}.jsonl", [r.to_json() for r in results], default=str)
    write_text(out_dir / f"report_{name}.txt",
               report_text(results, cfg.class_mode, "ARCADE" if cfg.run_mode == "arcade" else "none", model))
    # the committed eval file leaves out the wall time: a replay from the cache would rewrite every variant's file
    # with a new time and nothing else (the stage's time is in timings.json; the notebook prints each variant's)
    write_json(out_dir / f"eval_{name}.json", {k: run[k] for k in ("name", "config", "official", "corrected", "cost",
                                                                   "calls_made")})
    return run


def summary_frame(runs: dict[str, dict[str, Any]]):
    """One row per variant and view: n, refused, accuracy overall / by difficulty, F1s."""
    import pandas as pd
    rows = []
    for name, run in runs.items():
        for view in ("official", "corrected"):
            ev = run[view]
            rows.append({"variant": name, "view": view, "n": ev["n"], "refused": ev["n_refused"],
                         "acc": ev["acc"], "easy": ev["acc_easy"], "normal": ev["acc_normal"], "hard": ev["acc_hard"],
                         "normal+hard": ev["acc_normal_hard"], "binary_acc": ev.get("binary_acc"),
                         "macro_f1": ev.get("macro_f1"), "weighted_f1": ev.get("weighted_f1")})
    return pd.DataFrame(rows).round(3)


def type_frame(runs: dict[str, dict[str, Any]], view: str = "corrected"):
    """Accuracy per SMI interaction type (rows) and variant (columns), with n."""
    import pandas as pd
    first = next(iter(runs.values()))[view]
    data = {"difficulty": [DIFFICULTY[t] for t in TYPES], "n": [first[f"n_type_{t}"] for t in TYPES]}
    for name, run in runs.items():
        data[name] = [run[view][f"acc_type_{t}"] for t in TYPES]
    return pd.DataFrame(data, index=list(TYPES)).round(3)


def cost_frame(runs: dict[str, dict[str, Any]]):
    import pandas as pd
    rows = []
    for name, run in runs.items():
        c = run["cost"]
        rows.append({"variant": name, "calls/sample": c["calls_per_sample"], "tokens/sample": c["tokens_per_sample"],
                     "track I share": c["share_track1"], "track II share": c["share_track2"],
                     "dismissal share": c["share_dismissal"], "error share": c["share_error"],
                     "calls/sample track I": c["calls_per_sample_track1"],
                     "calls/sample track II": c["calls_per_sample_track2"],
                     "calls saved vs all track II": c["gate_call_saving"]})
    return pd.DataFrame(rows).round(3)


def prediction_frame(runs: dict[str, dict[str, Any]], samples_gt: Sequence[int]):
    """How often each label is predicted per variant, beside the ground truth's distribution."""
    import pandas as pd
    cols = {"ground truth": Counter(samples_gt)}
    for name, run in runs.items():
        cols[name] = Counter(r.label for r in run["results"])
    idx = [-1] + list(LABELS)
    df = pd.DataFrame({k: [v.get(i, 0) for i in idx] for k, v in cols.items()},
                      index=["-1 (no verdict)"] + [f"{i} {LABELS[i]}" for i in LABELS])
    return df


def hate_benign_frame(runs: dict[str, dict[str, Any]]):
    """Per variant, where its right and wrong verdicts fall: benign posts called NotHate, hateful posts called
    hateful (any category) and hateful posts given their own category, each as a count of its posts."""
    import pandas as pd
    rows = {}
    for name, run in runs.items():
        res = run["results"]
        benign, hateful = [r for r in res if r.gt == 0], [r for r in res if r.gt > 0]
        rows[name] = {"benign posts": len(benign),
                      "benign called NotHate": sum(r.label == 0 for r in benign),
                      "hateful posts": len(hateful),
                      "hateful called hateful": sum(r.label is not None and r.label > 0 for r in hateful),
                      "hateful, own category": sum(r.label == r.gt for r in hateful)}
    return pd.DataFrame(rows).T


#: the adapted judge's runs (`<variant><suffix>`): drawn in their variant's colour, hatched
ADAPTED_HATCHES = {"_adapted": "////", "_shuffled": ".."}


def bar_styles(names: Sequence[str]) -> list[dict[str, Any]]:
    """A bar style per variant: the colour cycle's next colour for each variant, and for `<variant>_adapted` /
    `<variant>_shuffled` its variant's colour, hatched (more variants than colours would otherwise repeat one
    colour for two unrelated variants)."""
    import matplotlib.pyplot as plt
    cycle = plt.rcParams["axes.prop_cycle"].by_key().get("color") or ["C0"]
    own: dict[str, str] = {}
    styles = []
    for name in names:
        suffix = next((s for s in ADAPTED_HATCHES if name.endswith(s)), None)
        base = name[: -len(suffix)] if suffix else name
        if base not in own:
            own[base] = cycle[len(own) % len(cycle)]
        styles.append({"color": own[base], **({"hatch": ADAPTED_HATCHES[suffix], "edgecolor": "white", "linewidth": 0}
                                               if suffix else {})})
    return styles


def plot_accuracy(runs: dict[str, dict[str, Any]], view: str = "corrected", chance: float | None = None):
    """Accuracy by difficulty (left) and by interaction type (right), one bar per variant, n under the ticks."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.8), gridspec_kw={"width_ratios": [1, 2]})
    names = [n for n in runs if not is_repeat(n, runs)]       # seed repeats and cold runs: tables of their own
    width = 0.8 / len(names)
    first = runs[names[0]][view]
    groups = [("Easy", "easy"), ("Normal", "normal"), ("Hard", "hard"), ("All", None)]
    for k, (name, style) in enumerate(zip(names, bar_styles(names))):
        ev = runs[name][view]
        vals = [ev[f"acc_{g}"] if g else ev["acc"] for _, g in groups]
        axes[0].bar(np.arange(4) + k * width - 0.4 + width / 2, np.nan_to_num(vals), width, label=name, **style)
        tv = [ev[f"acc_type_{t}"] for t in TYPES]
        axes[1].bar(np.arange(len(TYPES)) + k * width - 0.4 + width / 2, np.nan_to_num(tv), width, label=name, **style)
    axes[0].set_xticks(range(4), [f"{g}\nn={first[f'n_{k}'] if k else first['n']}" for g, k in groups])
    axes[1].set_xticks(range(len(TYPES)), [f"{t}\n{DIFFICULTY[t]}\nn={first[f'n_type_{t}']}" for t in TYPES])
    for ax in axes:
        ax.set_ylim(0, 1.05)
        ax.set_ylabel(f"accuracy ({view} view)")
        if chance is not None:
            ax.axhline(chance, color="grey", ls="--", lw=1)
    axes[0].set_title("by difficulty", fontsize=11)
    axes[1].set_title("by SMI interaction type (text, image, final)", fontsize=11)
    axes[1].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def plot_cost(runs: dict[str, dict[str, Any]]):
    """Where samples go (route shares) and what each route costs (calls per sample)."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.4))
    names = [n for n, r in runs.items() if r["config"]["run_mode"] == "arcade" and not is_repeat(n, runs)]
    routes = ["track1", "track2", "dismissal", "error"]
    left = np.zeros(len(names))
    for route in routes:
        vals = np.array([runs[n]["cost"][f"share_{route}"] for n in names])
        axes[0].barh(names, vals, left=left, label=route)
        left += vals
    axes[0].set_xlim(0, 1)
    axes[0].set_xlabel("share of samples")
    axes[0].set_title("route taken after the rapid scan", fontsize=11)
    axes[0].legend(fontsize=8, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.25), frameon=False)
    allnames = list(runs)
    width = 0.27
    x = np.arange(len(allnames))
    for k, (key, label) in enumerate((("calls_per_sample", "all samples"), ("calls_per_sample_track1", "track I samples"),
                                      ("calls_per_sample_track2", "track II samples"))):
        axes[1].bar(x + (k - 1) * width, [runs[n]["cost"][key] for n in allnames], width, label=label)
    full = next(iter(runs.values()))["cost"]["calls_all_track2"]
    axes[1].axhline(full, color="grey", ls="--", lw=1, label="no gate: every sample through track II")
    axes[1].set_xticks(x, allnames, rotation=15, fontsize=8)
    axes[1].set_ylabel("calls per sample")
    axes[1].set_ylim(0, full * 1.15)
    axes[1].set_title("cost", fontsize=11)
    axes[1].legend(fontsize=8, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.3), frameon=False)
    fig.tight_layout()
    return fig


def results_from_jsonl(path: Path) -> list[SampleResult]:
    """Read a results_<name>.jsonl back (notebook 07 redraws figures from artifacts alone)."""
    return [SampleResult(**{**d, "calls": [CallTrace(**c) for c in d["calls"]]}) for d in read_jsonl(path)]


def court_config(section: dict[str, Any], variant: str) -> CourtConfig:
    """The CourtConfig of one of notebook 05's variants from the profile's `05_debate` section
    (the base settings, then the variant's overrides; a variant's `samples` and `types` choose its posts
    and are not court settings)."""
    if variant not in section["variants"]:
        raise KeyError(f"no debate variant {variant!r}; the profile's variants: {', '.join(section['variants'])}")
    base = {k: section[k] for k in ("class_mode", "rounds", "temperatures", "max_new_tokens", "prompt_dir",
                                    "official_prompts_repo", "workers", "seed")}
    base["world_knowledge"] = section.get("world_knowledge")
    over = {k: v for k, v in section["variants"][variant].items() if k not in VARIANT_SAMPLE_KEYS}
    return CourtConfig(**{**base, **over})


#: a variant's keys that choose its posts or its debaters rather than configure the court (`oracle: true`:
#: the debaters state MemeWorld's generator account, lib.arcade.oracle; only the judge is asked)
VARIANT_SAMPLE_KEYS = ("samples", "types", "oracle")


def oracle_accounts(variant: dict[str, Any], profile: str) -> dict[str, dict[str, Any]] | None:
    """The generator's accounts for a variant with `oracle: true` (run_variant's `accounts`), read from the
    profile's MemeWorld (memeworld.jsonl); None for any other variant. A profile without MemeWorld (the paper
    profile's real H-VLI) has no account of its posts: such a variant is an error naming the file."""
    if not variant.get("oracle"):
        return None
    return accounts_from_memeworld(require(profile, "memeworld", "an oracle debate variant") / "memeworld.jsonl")


def variant_posts(variant: dict[str, Any], chosen: Sequence[Any], records_by_id: dict[str, Any],
                  items: Sequence[tuple[str, str]], samples: int, sample_seed: int) -> list[Any]:
    """The posts one variant of notebook 05 judges: the main sample, or the official sampler's
    balanced N (`samples`; with the same seed a smaller N that divides by the types is a subset of
    the main sample), then only the posts of the interaction types named in `types` (e.g. the
    emergent-hate type 001 for a Track II ablation), in sample order."""
    n = variant.get("samples", samples)
    posts = list(chosen) if n == samples else [records_by_id[i] for i in balanced_sample(items, n, sample_seed)]
    types = variant.get("types")
    if types:
        wanted = {str(t) for t in types}
        posts = [r for r in posts if str(r.meta["type"]) in wanted]
        if not posts:
            raise ValueError(f"variant types={list(types)}: no post of those interaction types among its "
                             f"{n or 'all'} sampled posts")
    return posts


def stage_metrics(runs: dict[str, dict[str, Any]], majority_acc: float, rerun_calls: int,
                  claims: "pd.DataFrame | None" = None, spread: "pd.DataFrame | None" = None,
                  cold: "pd.DataFrame | None" = None, adapted_claims: "pd.DataFrame | None" = None) -> dict[str, Any]:
    """Notebook 05's metrics.json: the main run's (arcade, else the first) corrected accuracies by
    difficulty and F1, its official-view accuracy, the direct judge's, the majority-class line,
    the gate's cost figures, the accuracy of every other variant, the seed spread (`spread`), the
    cold runs' spread of each claim (`cold`: claim_frame's per-run rows) and the claims on the adapted
    judge (`adapted_claims`: their variants' names end in _adapted, so their keys differ)."""
    main = runs["arcade"] if "arcade" in runs else next(iter(runs.values()))
    direct = runs.get("direct")
    c, o, cost = main["corrected"], main["official"], main["cost"]
    m: dict[str, Any] = {k: c[k] for k in ("acc", "acc_easy", "acc_normal", "acc_hard", "acc_normal_hard")}
    m.update({"macro_f1": c.get("macro_f1", float("nan")), "weighted_f1": c.get("weighted_f1", float("nan")),
              "acc_official": o["acc"], "macro_f1_official": o.get("macro_f1", float("nan")),
              "direct_acc": direct["corrected"]["acc"] if direct else float("nan"),
              "direct_acc_official": direct["official"]["acc"] if direct else float("nan"),
              "majority_acc": majority_acc})
    m.update(interval_keys("acc", c["acc"], c["n"]))                  # Wilson: n is tens of posts
    if direct:
        m.update(interval_keys("direct_acc", direct["corrected"]["acc"], direct["corrected"]["n"]))
    m.update({k: cost[k] for k in ("calls_per_sample", "calls_per_sample_track1", "calls_per_sample_track2",
                                   "share_track1", "share_track2", "share_dismissal", "gate_call_saving",
                                   "tokens_per_sample")})
    m.update({"n_eval": c["n"], "n_refused": o["n_refused"],
              "n_unparseable": sum(r.status == "unparseable" for r in main["results"]), "rerun_calls": rerun_calls})
    for name, run in runs.items():
        if run is not main:
            m[f"acc_{name}"] = run["corrected"]["acc"]
            m[f"n_{name}"] = run["corrected"]["n"]
    m.update(claim_metric_keys([] if claims is None else claims.to_dict("records")))   # not the gate's row (no test)
    for row in ([] if spread is None else spread.to_dict("records")):  # seed_spread: accuracy over seeds
        v = row["variant"]
        m.update({f"{v}_n_seeds": len(row["seeds"]), f"{v}_seed_mean": row["mean"], f"{v}_seed_sd": row["sd"],
                  f"{v}_seed_min": row["min"], f"{v}_seed_max": row["max"]})
    m.update(cold_run_metric_keys([] if cold is None or not len(cold) else cold.to_dict("records")))
    m.update(claim_metric_keys([] if adapted_claims is None else adapted_claims.to_dict("records")))
    return m


def adapted_runs(runs: dict[str, dict[str, Any]], suffix: str = "_adapted") -> dict[str, dict[str, Any]]:
    """The runs of the adapted judge (`<variant><suffix>`), the arms of claim_frame(..., suffix=suffix)."""
    return {k: v for k, v in runs.items() if k.endswith(suffix)}


#: the parameters of notebook 05 that rebuild its court (written to its settings.json; notebook 06 reads them)
SETTINGS_KEYS = ("dataset", "chat_preset", "serve_preset", "variants", "class_mode", "rounds", "temperatures",
                 "max_new_tokens", "prompt_dir", "official_prompts_repo", "world_knowledge", "workers", "seed")


def post_correct(results: Sequence[SampleResult], class_mode: str = "multiclass") -> dict[str, bool]:
    """Post id -> right or wrong, as `evaluate`'s corrected view counts it (a refused, failed or
    unreadable verdict is wrong)."""
    out = {}
    for r in results:
        gt, pred = (int(r.gt > 0), int(r.label > 0)) if class_mode == "binary" else (r.gt, r.label)
        out[r.id] = r.status == "ok" and r.label >= 0 and pred == gt
    return out


paired_test = paired_accuracy_test          # the claim tests' name for it


#: notebook 05's claims (params/analysis/plan.yaml holds their arms, units, n, controls and baselines), by statement:
#: what each comparison isolates. The ARCADE paper's result tables were not available: no claim has a published
#: effect, so each is held to the plan's default effect
CLAIMS = (
    ("debate beats a direct judge", "arcade", "direct",
     "the court (gate, prosecutor, defender, judge) against one judge call on the same posts"),
    ("Track II's debate reads emergent hate (type 001)", "track2_transcript", "direct_type001|direct",
     "every post through Track II against one judge call, on the emergent-hate posts"),
    ("Track II with the transcript vs blind debaters", "track2_transcript", "track2_blind",
     "the compendium's debaters see the debate so far; the official code's do not"),
    ("the compendium's settings vs the official code's", "arcade", "arcade_official",
     "structured answers, a stopped trial on a failed debater, the two cost options, against the official code"),
)


#: the gate's claim is about where the gate sends a post, not about accuracy: the share of emergent-hate posts
#: (type EMERGENT: text and image benign alone, hateful together) it sends to Track II against the share of the
#: posts of every other type it sends there (A: the gated court's run on the emergent-hate posts, else the main
#: sample's; B: the main sample's posts of the other types; a summary dismissal is Track II's first round finding
#: nothing, so the gate sent that post there; a post whose gate call failed went to no track).
#: Two shares on different posts: Fisher's exact test (claims.share_test), its power by enumeration. No run of the
#: pipeline routes by a post's true type, so the claim has no control.
GATE_CLAIM = ("the gate sends emergent hate to the right track", "arcade_type001|arcade", "arcade",
              "the share of emergent-hate posts the gated court sends to Track II against the share of the other "
              "posts it sends there")
#: the type Track II is for (ARCADE's emergent hate)
EMERGENT = "001"
#: the routes of a post the gate sent to Track II (its debate, or its summary dismissal)
TRACK2_ROUTES = ("track2", "dismissal")
#: what the gate's routing costs in accuracy on emergent hate: the gated court against the same posts forced
#: through Track II. A row to read beside the gate's claim, not a claim (a gate that routes right makes the
#: two arms the same court), so it has no verdict
GATE_COST = ("what the gate's routing costs on emergent hate", "arcade_type001|arcade", "track2_transcript",
             "the gated court against the same posts forced through Track II (no claim: read beside the gate's)")


#: where each claim's judge precondition is read: the oracle court on the claim's own posts ("a|b": the first that
#: ran). The emergent-hate claims are decided on type-001 posts alone, all hateful, so a judge that reads a truthful
#: debate there meets its precondition for them even where it misreads benign posts of the main sample
PRECONDITION_ORACLE = {"debate beats a direct judge": "oracle",
                       "Track II's debate reads emergent hate (type 001)": "oracle_type001|oracle",
                       "Track II with the transcript vs blind debaters": "oracle_type001|oracle",
                       "the compendium's settings vs the official code's": "oracle"}


def judge_preconditions(root: str | Path, suffix: str = "") -> dict[str, bool | None]:
    """Claim -> whether the judge that decides it meets its precondition on the claim's posts
    (lib.evaluation.preconditions.judge_status on PRECONDITION_ORACLE's run, `<variant><suffix>`: `_adapted`
    for the adapted judge); None where no such oracle run exists."""
    out: dict[str, bool | None] = {}
    for claim, *_ in CLAIMS:
        status = None
        for v in PRECONDITION_ORACLE[claim].split("|"):
            status = judge_status(root, v + suffix)
            if status is not None:
                break
        out[claim] = status
    return out


def claim_frame(runs: dict[str, dict[str, Any]], class_mode: str = "multiclass",
                confidence: float = 0.95, spread: bool = False,
                precondition: bool | None | dict[str, bool | None] = None, suffix: str = "", tag: str = "", plan=None):
    """Notebook 05's claims table: each claim the analysis plan (params/analysis/plan.yaml) gives this table (the
    adapted judge's when `suffix` is "_adapted"), tested with its unit's test by lib.evaluation.claims.plan_rows
    (cold runs: the per-item means over the runs; its control the oracle court, debaters that state the post's true
    cue, against the claim's B arm; its baseline the majority label), the gate's claim as two shares (`gate_rows`),
    then two rows to read beside them, never claims: what the gate's routing costs on emergent hate, and the calls
    it saves. `spread`: also return the per-run rows (cold_runs.csv). `precondition`: whether the
    judge meets its precondition (lib.evaluation.preconditions.judge_status; None: not measured), read by
    every claim, since the judge decides each of them; or claim -> that, measured on each claim's own posts
    (`judge_preconditions`). `suffix`: the claims on the variants named
    `<variant><suffix>` (the adapted judge's runs, `_adapted`), each claim's name followed by `tag`."""
    import pandas as pd
    plan = plan or analysis.load()

    def arms(spec: str) -> str:
        return "|".join(v + suffix for v in spec.split("|"))
    correct = {k: post_correct(v["results"], class_mode) for k, v in runs.items()}
    truth = {r.id: (int(r.gt > 0) if class_mode == "binary" else r.gt) for v in runs.values() for r in v["results"]}
    answers = {k: {r.id: (r.label if r.label is not None and r.label >= 0 else None) for r in v["results"]}
               for k, v in runs.items()}
    table_name = "claims_adapted.csv" if suffix else "claims.csv"
    planned = plan.of("05_debate", table_name)
    by_statement = {c + tag: (a, b, why) for c, a, b, why in CLAIMS}
    pre: dict[str, str] = {}
    if isinstance(precondition, dict):
        pre = {p.id: ("met" if precondition[c] else "not met") for p in planned for c in precondition
               if p.statement == c + tag and precondition[c] is not None}
    elif precondition is not None:
        pre = {p.id: "met" if precondition else "not met" for p in planned}
    rows = []
    for c in planned:
        if c.unit == "two shares":
            rows += gate_rows(runs, c, plan, suffix, confidence)
            continue
        a_spec, b_spec, why = by_statement.get(c.statement, (c.a, c.b, ""))
        names = {c.a: first_present(c.a, correct) or c.a,
                 c.b: first_present(arms(b_spec), correct) or c.b}
        rows += plan_rows([c], correct, truth, plan_digest=plan.digest, alpha=plan.alpha, power=plan.power,
                          family_sizes=plan.family_sizes(),
                          confidence=confidence, answers=answers, preconditions=pre, arm_names=names,
                          what={c.id: why})
    per_run = []
    for r in rows:
        if r["role"] == "primary" and r["runs"] and int(r["runs"]) > 1:
            ra, rb = cold_runs_of(r["A"], list(correct)), cold_runs_of(r["B"], list(correct))
            k = min(len(ra), len(rb))
            per_run += [{"claim": r["claim"], "A": r["A"], "B": r["B"], **x}
                        for x in run_spread([correct[x] for x in ra[:k]], [correct[x] for x in rb[:k]], truth,
                                            confidence)]
    cost_claim, a, b, why = GATE_COST
    a_run, b_run = first_present(arms(a), correct), first_present(arms(b), correct)
    if a_run and b_run and a_run != b_run:
        t = paired_accuracy_test(correct[a_run], correct[b_run], truth, confidence)
        rows.append({"id": "—", "claim": cost_claim + tag, "role": "descriptive", "family": "—", "A": a_run, "B": b_run,
                     "unit": "items", "n": t["n"], "runs": 1, "acc A": round(t["acc_a"], 3), "acc B": round(t["acc_b"], 3),
                     "A-B": round(t["difference"], 3), "test": t["test"], "p": float(f"{t['p']:.3g}"),
                     "plan": plan.digest, "what it isolates": why})
    if "arcade" in runs and not suffix:
        cost = runs["arcade"]["cost"]
        rows.append({"id": "—", "claim": "the gate saves calls", "role": "descriptive", "A": "arcade",
                     "B": "every post through Track II", "n": runs["arcade"]["corrected"]["n"],
                     "A-B": round(cost["gate_call_saving"], 3), "plan": plan.digest,
                     "what it isolates": (f"{cost['calls_per_sample']:.2f} calls per post against "
                                          f"{cost['calls_all_track2']:.0f} for Track II on every post")})
    frame = table(rows)
    return (frame, pd.DataFrame(per_run)) if spread else frame


def gate_rows(runs: dict[str, dict[str, Any]], c, plan, suffix: str = "", confidence: float = 0.95) -> list[dict[str, Any]]:
    """The gate's claim (`c`, the plan's; GATE_CLAIM says which posts), as a claims-table row: the share of
    emergent-hate posts the gated court sends to Track II against the share of the other posts it sends there,
    Fisher's exact test, the MDD by enumeration at the claim's sizes and B's share; none when its arms did not run."""
    claim, a_spec, b_spec, why = GATE_CLAIM
    a_name = first_present("|".join(v + suffix for v in a_spec.split("|")), runs)
    b_name = b_spec + suffix
    if a_name is None or b_name not in runs:
        return []
    a = [r.route in TRACK2_ROUTES for r in runs[a_name]["results"] if r.type == EMERGENT]
    b = [r.route in TRACK2_ROUTES for r in runs[b_name]["results"] if r.type != EMERGENT]
    if not a or not b:
        return []
    t = share_test(a, b, confidence)
    # a gate that routes (nearly) every post one way, whatever its type, is flagged as the answers' arms are: a
    # difference between two near-constant shares says little about what the gate detects
    routes = a + b                                     # every post of the claim: emergent hate and the others
    flag = constant_arm("the gate", dict(enumerate(routes)), list(range(len(routes))))
    flag = flag.replace("label True", "Track II").replace("label False", "Track I")
    m = plan.family_sizes().get(c.family, 1) if c.role == "primary" else 1
    level = family_confidence(plan.alpha, m)
    fam = share_test(a, b, level)["ci_difference"]
    mdd = fisher_mdd(t["n_a"], t["n_b"], t["share_b"], plan.power, plan.alpha / m)
    ci = t["ci_difference"]
    return [{"id": c.id, "claim": c.statement, "role": c.role, "family": c.family, "A": a_name, "B": b_name,
             "unit": c.unit, "n": t["n_a"] + t["n_b"], "runs": 1, "as planned": as_planned(c, t["n_a"] + t["n_b"], 1),
             "acc A": round(t["share_a"], 3),
             "95% CI A": f"[{t['ci_a'][0]:.3f}, {t['ci_a'][1]:.3f}]", "acc B": round(t["share_b"], 3),
             "95% CI B": f"[{t['ci_b'][0]:.3f}, {t['ci_b'][1]:.3f}]", "A-B": round(t["difference"], 3),
             "95% CI A-B": f"[{ci[0]:.3f}, {ci[1]:.3f}]", "family-wise CI A-B": f"[{fam[0]:.3f}, {fam[1]:.3f}] ({level:.2%})",
             "only A right": None, "only B right": None,
             "test": "Fisher exact (shares sent to Track II)", "p": float(f"{t['p']:.3g}"),
             "design MDD": round(mdd, 3) if mdd == mdd else float("nan"),
             "MDD rule": f"Fisher exact by enumeration at {t['n_a']} and {t['n_b']} posts, B's share {t['share_b']:.2f}, "
                         f"alpha {plan.alpha / m:.2g}",
             "majority line": None, "flag": flag or "none", "paper A-B": round(c.effect, 3), PAPERS_NUMBER: c.effect_said,
             "control": "none in the pipeline (no run routes by a post's true type)", "control test": "—",
             "control n": None, "control status": "none ran",
             "baseline": "—", "precondition": "not measured", "component check": "none", "plan": plan.digest,
             "what it isolates": why}]


def with_cold_runs(variants: dict[str, dict[str, Any]], cold_runs: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The profile's variants plus cold runs: `cold_runs` {runs: k, variants: [names]} adds
    `<name>_run1` ... `<name>_run<k-1>` for each named variant, the same settings and posts with
    `replicate` r (the same requests asked afresh, each run's answers cached apart)."""
    out = dict(variants)
    if not cold_runs:
        return out
    runs = cold_runs.get("runs")
    if set(cold_runs) - {"runs", "variants"} or isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise ValueError(f"cold_runs: expected {{runs: k >= 1, variants: [names]}}, got {cold_runs!r}")
    missing = [v for v in cold_runs.get("variants") or [] if v not in variants]
    if missing:
        raise ValueError(f"cold_runs.variants names no variant: {missing} (variants: {', '.join(variants)})")
    for v in cold_runs.get("variants") or []:
        for r in range(1, runs):
            if f"{v}_run{r}" in variants:
                raise ValueError(f"variant {v}_run{r} is both named in the profile and a cold run of {v}")
            out[f"{v}_run{r}"] = {**variants[v], "replicate": r}
    return out


def _repeat_of(name: str) -> str | None:
    """`<variant>` for a name `<variant>_seed<k>`, else None."""
    m = re.fullmatch(r"(.+)_seed\d+", name)
    return m.group(1) if m else None


def is_seed_repeat(name: str, runs: dict[str, Any]) -> bool:
    """`<variant>_seed<k>` where `<variant>` also ran: a repeat of it at another seed."""
    return _repeat_of(name) in runs


def is_repeat(name: str, runs: dict[str, Any]) -> bool:
    """A seed repeat (`<variant>_seed<k>`) or a cold run (`<variant>_run<k>`) of a variant that also ran:
    tables and figures of variants show the variant once (the repeats have their own tables)."""
    m = re.fullmatch(r"(.+)_run\d+", name)
    return is_seed_repeat(name, runs) or (m is not None and m.group(1) in runs)


def seed_spread(runs: dict[str, dict[str, Any]]) -> "pd.DataFrame":
    """Variants that repeat another at other seeds (named `<variant>_seed<k>`, same posts): one row
    per repeated variant with each seed's corrected accuracy, their mean, sd (ddof 1), min and max.
    The variant itself is its court's own seed."""
    import pandas as pd
    rows = []
    for name, run in runs.items():
        reps = {name: run, **{k: v for k, v in runs.items() if _repeat_of(k) == name}}
        if len(reps) < 2:
            continue
        ids = [sorted(r.id for r in v["results"]) for v in reps.values()]
        if any(i != ids[0] for i in ids):
            raise ValueError(f"seed repeats of {name} judged different posts; they must share the sample")
        accs = {int(v["config"]["seed"]) if isinstance(v.get("config"), dict) and "seed" in v["config"] else k:
                v["corrected"]["acc"] for k, v in reps.items()}
        a = np.array(list(accs.values()), float)
        rows.append({"variant": name, "n posts": len(ids[0]), "seeds": list(accs), "accuracy by seed":
                     [round(x, 3) for x in a], "mean": a.mean(), "sd": a.std(ddof=1), "min": a.min(), "max": a.max()})
    return pd.DataFrame(rows)
