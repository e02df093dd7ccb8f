"""Checks of the committed results (results/embedded/), without rerunning the experiment.

`make reproduce` (the embedded profile at full size, hours on 2 cores) copies each stage's
metrics and the per-item files behind them to results/embedded/, the model answers it used to
results/embedded/cache/, and its stage timings to results/embedded/timings.json. These tests check
that everything a reader sees comes from those files: every metric recomputes from the per-item
files, every figure redraws from them byte for byte, the saved notebooks are the run that wrote them,
the README's tables are generated from them, and the levels the notebooks' readings rest on hold.
"""
from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pandas as pd
import pytest

from lib import ROOT
from lib.compendium.artifacts import RESULTS_ROOT, figures_dir, read_json
from lib.compendium.params import load_profile, stages
from lib.evaluation.recompute import RECOMPUTE, coverage, is_machine, mismatches, recompute, recorded_reason
from lib.compendium.results import BUDGET_S, SIZE_CAP_MB, cache_export_path, fresh_clone_times, notebook_digests, timings_block, timings_path

pytestmark = pytest.mark.results
PROFILE = "embedded"
RES = RESULTS_ROOT / PROFILE
P = load_profile(PROFILE)
STAGES = [s.name for s in stages()]


def _metrics(stage):
    p = RES / stage / "metrics.json"
    assert p.exists(), f"{p} is missing: `make reproduce` publishes it"
    return read_json(p)


def test_every_stage_has_committed_results_within_the_size_cap():
    for st in STAGES:
        if st != "07_figures":
            _metrics(st)
    size = sum(f.stat().st_size for f in RES.rglob("*") if f.is_file()) / 2 ** 20
    assert size <= SIZE_CAP_MB, f"results/{PROFILE}/ holds {size:.1f} MB"
    assert not any(str(ROOT) in f.read_text(errors="ignore") for f in RES.rglob("*.json")), "a machine path"


@pytest.mark.parametrize("stage", sorted(RECOMPUTE))
def test_committed_metrics_recompute_from_the_per_item_files(stage):
    committed = _metrics(stage)
    again = recompute(stage, RES / stage, RES)
    assert not mismatches(committed, again), mismatches(committed, again)[:10]
    uncovered = coverage(stage, committed, again)
    assert not uncovered, f"{stage}: metrics neither recomputed, nor timings/counts, nor recorded: {uncovered[:10]}"
    assert len([k for k in again if k in committed and not is_machine(k)]) >= 5


def test_every_metric_is_accounted_for():
    """Each stage's metrics: recomputed from per-item files (RECOMPUTE), a timing or count, or read from
    the run's own record with the reason written in lib/evaluation/recompute.py's RECORDED. A stage without a
    recompute function lists what is left to do here."""
    missing = {st: sorted(k for k in _metrics(st) if not is_machine(k) and recorded_reason(st, k) is None)
               for st in STAGES if st != "07_figures" and st not in RECOMPUTE}
    missing = {k: v for k, v in missing.items() if v}
    assert not missing, {k: (len(v), v[:5]) for k, v in missing.items()}


def test_timings_of_the_run_fit_the_budget():
    """Every stage has a time in the latest run; the stages timed from nothing (every model trained and
    asked afresh) fit the 4-hour budget together, and the README names the ones not timed so."""
    t = read_json(timings_path(PROFILE))
    timed = set(t["stages"]) | set(t.get("replayed", {}))          # a run commits only what it measured
    assert set(STAGES) <= timed, sorted(set(STAGES) - timed)
    assert all(v["cold"] for v in t["stages"].values())
    total = sum(v["wall_s"] for v in t["stages"].values())
    assert total <= BUDGET_S, f"make reproduce took {total / 3600:.2f} h on {t['machine']}"
    assert "CPU cores" in t["machine"]
    unmeasured = [s for s in STAGES if s not in t["stages"]]
    block = timings_block(PROFILE)
    assert all(s in block for s in unmeasured) and (not unmeasured or "not measured" in block)


def test_a_fresh_clone_reproduces_inside_the_budget():
    """A fresh clone's time per stage (replayed where the stage uses model answers, else from nothing): where
    every stage has one, together they fit the budget and the README says so; where some have none, the
    README names them."""
    t = read_json(timings_path(PROFILE))
    fresh = fresh_clone_times(t, STAGES)
    assert fresh, "results/embedded/timings.json holds no stage timed from a fresh clone (no `replayed` row)"
    block = timings_block(PROFILE)
    missing = [s for s, v in fresh.items() if v is None]
    if missing:
        assert f"({', '.join(missing)} not yet)" in block
    else:
        total = sum(fresh.values())
        assert total <= BUDGET_S, f"a fresh clone's make reproduce took {total / 3600:.2f} h on {t['machine']}"
        assert "every stage measured: inside the budget" in block


def test_saved_notebooks_are_the_run_behind_the_results():
    """The code cells and outputs of notebooks/*.ipynb are those of the run that wrote results/ (its
    digests: results/embedded/notebooks.json); the markdown, readings included, may be edited after."""
    assert read_json(RES / "notebooks.json") == notebook_digests(PROFILE)


def test_committed_answers_hold_every_model_answer_the_results_quote():
    """A fresh clone's `make reproduce` replays the committed answers: every few-shot answer and every
    debate call's raw output in results/ is one of them."""
    texts = set()
    with gzip.open(cache_export_path(PROFILE), "rt", encoding="ascii") as f:
        for line in f:
            texts.add(json.loads(line)["payload"]["text"])
    fs = [json.loads(x) for x in (RES / "04_few_shot" / "predictions_fhm.jsonl").read_text().splitlines()]
    assert fs and all(r["raw"] in texts for r in fs)
    from lib.arcade.report import results_from_jsonl
    res = results_from_jsonl(RES / "05_debate" / "results_arcade.jsonl")
    raws = [c.raw for r in res for c in r.calls if getattr(c, "raw", None)]
    assert all(x in texts for x in raws)


def _redraw(tmp_path, with_images: bool):
    script = r'''
import sys
from pathlib import Path
from lib.evaluation import figures
with figures.reading_from(Path(sys.argv[2])):
    for f in figures.REGISTRY.values():
        if f.images and sys.argv[3] != "1":
            continue
        if not f.missing("embedded"):
            fig = f.draw("embedded")
            from lib.evaluation import plotting
            plotting.save_figure(fig, f.name, "embedded", sys.argv[1])
            print("DRAWN", f.name)
'''
    r = subprocess.run([sys.executable, "-c", "from lib.evaluation import plotting; plotting.setup()\n" + script, str(tmp_path),
                        str(RESULTS_ROOT), "1" if with_images else "0"], capture_output=True, text=True, timeout=600,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    return [x.split()[1] for x in r.stdout.splitlines() if x.startswith("DRAWN")]


def test_committed_figures_redraw_from_the_committed_results(tmp_path):
    """Every figure of figures/embedded/ is drawn again from results/embedded/ alone, byte for byte (the
    four that also show MemeWorld images need `make reproduce NB=00` first and are checked then)."""
    from lib.evaluation import figures
    with_images = (ROOT / "artifacts" / PROFILE / "00_data_prep" / "memeworld").exists()
    drawn = _redraw(tmp_path, with_images)
    expected = {f.name for f in figures.REGISTRY.values() if with_images or not f.images}
    committed = {p.stem for p in figures_dir(PROFILE).glob("*.png")}
    assert expected <= committed
    assert set(drawn) == expected & committed
    differ = [n for n in drawn if (tmp_path / PROFILE / f"{n}.png").read_bytes()
              != (figures_dir(PROFILE) / f"{n}.png").read_bytes()]
    assert not differ, f"figures that the committed results no longer give: {differ}"


def test_readme_blocks_and_results_page_are_generated_from_the_committed_results():
    from lib.compendium.results import BLOCKS, DOCS_RESULTS, results_page
    for path, blocks in BLOCKS.items():
        text = path.read_text()
        for name, fn in blocks.items():
            start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
            assert start in text and end in text, (path.name, name)
            assert text[text.index(start) + len(start):text.index(end)].strip() == fn(PROFILE).strip(), \
                f"{path.name} block {name}: run `make results`"
    assert DOCS_RESULTS.read_text() == results_page(), "docs/results.md: run `make results`"
    from lib.compendium.results import DOCS_PAGES
    for path, make in DOCS_PAGES.items():
        assert path.read_text(encoding="utf-8") == make(), f"{path.relative_to(ROOT)}: run `make results`"
    import nbformat
    from lib.compendium.results import notebook_cost
    for st in stages():
        if st.notebook is not None:
            head = nbformat.read(str(st.notebook), as_version=4).cells[0].source
            assert f"<!-- cost:start --> {notebook_cost(st.name, PROFILE)} <!-- cost:end -->" in head, \
                f"{st.notebook.name}: its cost cell is not the committed timings' (run `make results`)"


def test_committed_findings_were_computed_under_the_current_analysis_plan():
    """Every planned claims table records the digest of the plan it was computed under: a plan changed since the
    results (a claim, its n, its test, its family) fails here until the stages that read it rerun."""
    from lib.compendium.findings import plans_used
    from lib.evaluation import plan as analysis
    plan = analysis.load()
    used = plans_used(PROFILE)
    assert used, "no planned claims table is committed"
    wrong = {table: digests for table, digests in used.items() if digests != {plan.digest}}
    assert not wrong, f"claims tables computed under another plan than {plan.digest}: {wrong}"
    tables = {f"{c.stage}/{c.table}" for c in plan.claims}
    assert tables == set(used), f"planned tables with no committed rows: {sorted(tables - set(used))}"


# ----------------------------------------------------------------------------- what the readings rest on
def test_models_meet_their_held_out_figures():
    m = _metrics("models")
    assert m["clip_foil_pair_acc"] >= 0.9                 # 0.945 and 0.957 on two machines: a level, not a digit
    assert m["clip_retrieval_r1"] > 50 * m["clip_retrieval_chance"]
    assert m["vlm_rouge_l"] >= 0.6 and m["vlm_rouge_l"] > m["vlm_rouge_l_baseline"] + 0.2
    assert m["clip_train_pairs_with_test_caption"] > 0
    for tag in ("leak_free", "leak_free_no_hard_negatives"):
        assert m[f"clip_train_pairs_with_test_caption_{tag}"] == 0
        assert m[f"clip_retrieval_r1_{tag}"] > 50 * m["clip_retrieval_chance"]
    assert m["nli_heldout_acc"] > m["nli_heldout_majority"] + 0.3


def test_captioning_levels():
    m = _metrics("01_captioning")
    assert m["n_unreadable"] == 0 and m["rouge_l_vlm_caption"] >= 0.6
    assert m["n_boxes_scored"] > 1000 and m["box_position_accuracy"] > 1 / 3 + 0.05
    # the interplay captioner (TRACE's component, a named option): checked alone on held-out memes, far above
    # the majority lines, on at least 500 memes
    if P["01_captioning"].get("interplay_captioner"):
        assert m["interplay_check_n"] >= 500
        assert m["interplay_account_ci_low"] > m["interplay_account_majority"] + 0.2
        assert m["interplay_label_ci_low"] > m["interplay_label_majority"] + 0.2


def test_trace_levels_and_seeds():
    m = _metrics("02_finetuning")
    sec = P["02_finetuning"]
    assert m["auroc"] > 0.85
    for b in ("text_only_", "caption_only_", "image_only_"):
        assert m["accuracy"] > m[f"{b}accuracy"] + 0.08, b
    seeds = pd.read_csv(RES / "02_finetuning" / "seeds.csv")
    # every variant a claim reads, at five seeds or more (test-vs-reproduce: item 5)
    assert set(seeds.variant) == set(sec["seed_variants"]) and len(sec["seed_variants"]) >= 9
    assert (seeds.groupby("variant").seed.nunique() >= 5).all()
    assert seeds.groupby("variant").accuracy.std().max() > 0
    assert m["caption_benefit_n_seeds"] >= 5
    # each caption option: its own runs at every seed, its probe source, and its claim in the claims table
    claims = pd.read_csv(RES / "02_finetuning" / "claims.csv")
    for opt in sec.get("caption_options") or {}:
        assert len(list((RES / "02_finetuning" / f"runs_{opt}").glob("*/result.json"))) == 1 + len(sec["seeds"])
        assert f"probe_{opt}_label_gain" in m
        # the option's claim is the plan's (secondary: a capacity check), its cue-caption control a column
        assert f"{opt} captions help" in set(claims.claim)
    # frozen parts computed once: an epoch is at least 3x faster than the full backbone's
    assert m["epoch_s_uncached"] >= 3 * m["epoch_s_cached"]


def test_clip4dm_levels():
    m = _metrics("03_clip4dm")
    assert m["la"] > 3 * m["la_chance"] and m["la_chance_content"] > m["la_chance"]
    assert m["epsilon_chosen"] in P["03_clip4dm"]["epsilon_grid"]
    # floor_ratio is a timing (it moves between runs and machines): reported by the notebook, not asserted here
    assert m["batched_max_abs_diff"] < 1e-5 and m["floor_ratio"] > 0
    assert m["seetrue_nli_oracle"] > m["seetrue_nli_random_word"]


def test_serving_levels():
    m = _metrics("serving")
    assert m["speedup_served_vs_hf_c4"] >= 2.5 and m["served_scaling_c4_vs_c1"] >= 1.2
    assert m["schema_valid_rate_with_schema"] >= 0.95 > m["schema_valid_rate_without_schema"]


def test_few_shot_claims_are_sized_and_repeated():
    """Notebook 04: every claim on 96 memes or more; the headline claim (retrieved vs random exemplars)
    over three cold runs (per-meme means over the runs), random exemplars redrawn in each run."""
    sec = P["04_few_shot"]
    claims = pd.read_csv(RES / "04_few_shot" / "claims.csv")
    tested = claims[claims.p.notna()]
    assert (tested.n >= 96).all(), tested[["claim", "n"]]
    pooled = tested[tested.runs > 1]
    assert sec["cold_runs"]["runs"] >= 3 and (pooled.runs >= 3).all()
    assert "retrieved exemplars beat random ones" in set(pooled[pooled.role == "primary"].claim)
    cold = pd.read_csv(RES / "04_few_shot" / "cold_runs.csv")
    assert len(cold) == 3 * len(pooled[pooled.role == "primary"])
    m = _metrics("04_few_shot")
    assert m["rerun_calls"] == 0 and m["n_eval"] >= 96


def test_debate_claims_are_sized_and_repeated():
    """Notebook 05: every claim on 96 posts or more (the emergent-hate claims on 96 type-001 posts);
    ARCADE against the direct judge over three cold runs (per-post means over the runs)."""
    claims = pd.read_csv(RES / "05_debate" / "claims.csv")
    tested = claims[claims.p.notna()]
    assert (tested.n >= 96).all(), tested[["claim", "n"]]
    pooled = tested[tested.runs > 1]
    assert "debate beats a direct judge" in set(pooled[pooled.role == "primary"].claim)
    assert len(pd.read_csv(RES / "05_debate" / "cold_runs.csv")) == 3 * len(pooled[pooled.role == "primary"])
    m = _metrics("05_debate")
    assert m["rerun_calls"] == 0 and m["n_eval"] >= 96 and m["direct_n_seeds"] >= 3


def test_evaluation_compares_on_the_common_posts():
    m = _metrics("06_evaluation")
    assert m["n_common_memes"] >= 96
