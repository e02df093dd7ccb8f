"""Checks of what `make test`'s run of every stage under the ci profile wrote (artifacts/ci/).

The ci profile is the embedded one at test sizes (params/ci.yaml): the same code, variants and
controls on a small MemeWorld with a few epochs and a handful of LLM items. These checks hold at any
size: every stage ran under that profile, wrote the files and figures the later stages and the
committed results read, and its tables agree with its own per-item outputs. The embedded run's
levels (what the papers' claims rest on) are checked on the committed results (tests/test_results.py).
"""
from __future__ import annotations

import json

import nbformat
import numpy as np
import pandas as pd
import pytest

from lib import ROOT
from lib.compendium.artifacts import ARTIFACTS_ROOT, figures_dir
from lib.compendium.params import load_profile, stages
from lib.compendium.results import RESULT_FILES, stage_result_files

pytestmark = pytest.mark.ci_run
PROFILE = "ci"
RUN = ARTIFACTS_ROOT / PROFILE
P = load_profile(PROFILE)


def _metrics(stage):
    p = RUN / stage / "metrics.json"
    if not p.exists():
        pytest.fail(f"{p} is missing: `make test` runs `python -m lib.compendium.runner reproduce --profile ci` first")
    return json.loads(p.read_text())


def _figure(name):
    assert (figures_dir(PROFILE) / f"{name}.png").exists(), name
    assert (figures_dir(PROFILE) / f"{name}.pdf").exists(), name


def test_every_stage_ran_under_the_ci_profile_and_wrote_its_results():
    for st in stages():
        assert (RUN / st.name / ".stamp.json").exists(), f"{st.name} did not finish"
        if st.notebook is not None:
            nb = nbformat.read(str(RUN / "notebooks" / st.notebook.name), as_version=4)
            injected = next(c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", []))
            assert 'profile = "ci"' in injected.source
        if st.name != "07_figures":
            assert "metrics.json" in stage_result_files(PROFILE, st.name), st.name
    # every declared result file pattern matches something in a full run (a renamed output would
    # silently drop out of results/ otherwise); cold runs and gold-less files are the only optional ones
    optional = {"cold_runs.csv", "*/results_*.csv", "*/metrics.json", "eval_*.jsonl", "retrieval.csv"}
    for stage, patterns in RESULT_FILES.items():
        for pat in patterns:
            if pat not in optional:
                assert list((RUN / stage).glob(pat)), f"{stage}: nothing matches {pat}"


def test_the_run_wrote_only_its_own_folder():
    """An unpublished profile's figures and index go under artifacts/ci/, never figures/."""
    assert figures_dir(PROFILE) == RUN / "figures"
    assert (RUN / "figures" / "README.md").exists()
    assert not (ARTIFACTS_ROOT.parent / "figures" / PROFILE).exists()


def test_data_counts_match_the_metrics():
    m = _metrics("00_data_prep")
    counts = pd.read_csv(RUN / "00_data_prep" / "counts.csv")
    for name, g in counts.groupby("dataset"):
        assert m[f"n_{name}"] == g.n.sum(), name
    fhm = counts[counts.dataset == "fhm"]
    assert m["fhm_hateful_share"] == pytest.approx(fhm.n_hateful.sum() / fhm.n.sum(), abs=1e-6)
    assert m["n_fhm"] == P["00_data_prep"]["memeworld_n"]
    _figure("memeworld_gallery")
    _figure("memeworld_unimodal_readers")


def test_models_trained_and_load_through_the_overlay():
    from lib.models.encoders import load_encoder
    from lib.compendium.presets import get_preset, resolve_model_path
    m = _metrics("models")
    assert m["clip_train_s"] > 0 and m["vlm_eval_n"] == P["models"]["vlm_eval_n"]
    assert m["clip_train_pairs_with_test_caption_leak_free"] == 0
    import os
    os.environ["COMPENDIUM_PRESET_OVERLAY"] = str(ARTIFACTS_ROOT.parent / "params/presets/overlays/ci.yaml")
    try:
        path = resolve_model_path(get_preset("encoders", "memeworld-clip").model)
        assert path.startswith(str(RUN / "models"))
        enc = load_encoder("memeworld-clip", device="cpu")
        assert len(enc.text_layers()) >= 1
    finally:
        del os.environ["COMPENDIUM_PRESET_OVERLAY"]
    _figure("models_training_curves")


def test_captioning_scores_give_the_metrics():
    from lib.trace.captioning import caption_quality_from_scores
    m = _metrics("01_captioning")
    scores = pd.read_csv(RUN / "01_captioning" / "caption_scores.csv", dtype={"id": str})
    boxes = pd.read_csv(RUN / "01_captioning" / "box_scores.csv", dtype={"id": str})
    again = caption_quality_from_scores(scores, boxes)
    for k, v in again.items():
        assert m[k] == pytest.approx(v, abs=1e-6, nan_ok=True), k
    rows = json.loads((RUN / "01_captioning" / "trace_captions.json").read_text())
    assert len(rows) == m["n_memes"] and all({"img", "text", "label", "split"} <= set(r) for r in rows)
    _figure("captioning_examples")


def test_trace_runs_every_variant_and_seed():
    m = _metrics("02_finetuning")
    sec = P["02_finetuning"]
    seeds = pd.read_csv(RUN / "02_finetuning" / "seeds.csv")
    assert set(seeds.variant) == set(sec["seed_variants"])
    assert (seeds.groupby("variant").seed.nunique() == 1 + len(sec["seeds"])).all()
    variants = json.loads((RUN / "02_finetuning" / "variants.json").read_text())
    for name, run in variants.items():
        res = json.loads((RUN / "02_finetuning" / "runs" / run / "result.json").read_text())
        assert res["fit"]["epochs_run"] <= sec["epochs"], name
        preds = pd.read_csv(RUN / "02_finetuning" / "runs" / run / "predictions.csv")
        assert preds["threshold"].nunique() == 1, name
        ts = preds[preds.split == "test_seen"]
        assert res["eval"]["splits"]["test_seen"]["accuracy"] == pytest.approx(float(np.mean(ts.prediction == ts.label)))
    default = seeds[(seeds.variant == "cls+rel") & (seeds.seed == sec["seed"])]
    assert default.accuracy.iloc[0] == pytest.approx(m["accuracy"])
    assert m["text_only_text_mean_weight"] == 1.0 and m["caption_only_text_mean_weight"] == 0.0
    for f in ("trace_seeds", "trace_training_curves", "trace_per_type_accuracy", "trace_selected_caption_share"):
        _figure(f)


def test_clip4dm_benchmarks_and_chosen_epsilon():
    m = _metrics("03_clip4dm")
    for b in P["03_clip4dm"]["benchmarks"]:
        assert (RUN / "03_clip4dm" / f"results_{b}.csv").exists(), b
    assert m["epsilon_chosen"] in P["03_clip4dm"]["epsilon_grid"]
    assert json.loads((RUN / "03_clip4dm" / "settings.json").read_text())["epsilon"] == m["epsilon_chosen"]
    assert m["la_chance_content"] > m["la_chance"] and m["la"] <= m["la_official_string"]
    for f in ("clip4dm_word_attributions", "clip4dm_epsilon_sweep", "clip4dm_score_distributions",
              "clip4dm_backbones", "clip4dm_nocaps_domains", "clip4dm_hard_negatives"):
        _figure(f)


def test_serving_benchmark_ran_every_level():
    m = _metrics("serving")
    for c in P["serving"]["concurrency"]:
        assert m[f"tokens_per_s_served_c{c}"] > 0
    assert m["ttft_warm_s"] > 0 and m["schema_n_per_arm"] > 0
    _figure("serving_throughput")


def _fewshot_preds():
    from lib.sei.fewshot import Prediction
    rows = [json.loads(x) for x in (RUN / "04_few_shot" / "predictions_fhm.jsonl").read_text().splitlines()]
    by = {}
    for r in rows:
        by.setdefault(r["setting"], []).append(Prediction(**{k: v for k, v in r.items() if k != "model"}))
    return by


def test_few_shot_settings_cold_runs_and_claims_recompute():
    from lib.sei import fewshot as sei
    from lib.sei.report import claim_frame
    sec = P["04_few_shot"]
    m = _metrics("04_few_shot")
    by = _fewshot_preds()
    main = sei.main_setting_name(sec["retrievers"], sec["shots"])
    settings = sei.parse_settings(sec["controls"], sec["retrievers"], sec["shots"], sec["answer_format"],
                                  sec["subset"], sec["cold_runs"])
    assert set(by) == {s.name for s in settings}
    assert f"{main}_run1" in by and "random_4_run1" in by
    ids = {p.id for p in by[main]}
    assert len(ids) == sec["eval_n"] and all({p.id for p in v} == ids for v in by.values())
    # a cold run of random exemplars draws other exemplars; of retrieved ones the same
    assert [p.exemplar_ids for p in by[main]] == [p.exemplar_ids for p in by[f"{main}_run1"]]
    assert [p.exemplar_ids for p in by["random_4"]] != [p.exemplar_ids for p in by["random_4_run1"]]
    claims = pd.read_csv(RUN / "04_few_shot" / "claims.csv")
    from lib.evaluation.preconditions import retrieval_status
    first = {p.id for p in by["zero_shot"]}                   # the memes the run first answered: the plan's n
    again, cold = claim_frame(by, main, sec["retrievers"][0], spread=True, others=sec["retrievers"][1:],
                              preconditions=retrieval_status(RUN), first_items=first)
    # every column but the no-model baseline's (the exemplars' label vote, rebuilt from the rankings by
    # lib.evaluation.recompute, which test_published_results_of_the_run_recompute runs on this run)
    own = [c for c in claims.columns if "baseline" not in c]
    tested = claims[claims.B != "knn_vote"].reset_index(drop=True)[own]
    again = again[again.B != "knn_vote"].reset_index(drop=True)[own]
    pd.testing.assert_frame_equal(tested, again.astype(tested.dtypes.to_dict()), check_exact=False, atol=1e-3)
    assert (claims[claims.B != "knn_vote"].baseline == "knn_vote").any()     # the notebook named the vote as baseline
    pooled = claims[claims.runs > 1]
    assert len(pooled) >= 1 and (pooled.runs == sec["cold_runs"]["runs"]).all()
    saved_cold = pd.read_csv(RUN / "04_few_shot" / "cold_runs.csv")
    assert len(saved_cold) == len(cold) == sec["cold_runs"]["runs"] * len(pooled)
    from lib.evaluation.claims import claim_metric_keys
    keys = claim_metric_keys(claims.to_dict("records"))      # what claims.csv says metrics.json holds
    assert len(keys) >= 5 * len(claims[claims.p.notna()])
    for k, v in keys.items():
        assert m[k] == pytest.approx(v, rel=1e-6, nan_ok=True), k
    assert m["rerun_calls"] == 0
    for f in ("few_shot_agents", "few_shot_accuracy", "few_shot_lexical", "few_shot_claims", "few_shot_cold_runs"):
        _figure(f)


def test_debate_variants_cold_runs_and_claims_recompute():
    from lib.arcade.scoring import evaluate
    from lib.arcade.report import claim_frame, results_from_jsonl, with_cold_runs
    sec = P["05_debate"]
    m = _metrics("05_debate")
    names = with_cold_runs(sec["variants"], sec["cold_runs"])
    runs = {}
    for name in names:
        res = results_from_jsonl(RUN / "05_debate" / f"results_{name}.jsonl")
        ev = json.loads((RUN / "05_debate" / f"eval_{name}.json").read_text())
        assert evaluate(res, sec["class_mode"], "corrected")["acc"] == pytest.approx(ev["corrected"]["acc"])
        runs[name] = {"results": res, "corrected": ev["corrected"], "cost": ev["cost"], "config": ev["config"]}
    assert len(runs["arcade"]["results"]) == sec["samples"]
    assert {r.id for r in runs["arcade_run1"]["results"]} == {r.id for r in runs["arcade"]["results"]}
    assert all(r.type == "001" for r in runs["track2_transcript"]["results"])
    claims = pd.read_csv(RUN / "05_debate" / "claims.csv")
    from lib.arcade.report import judge_preconditions
    again, cold = claim_frame(runs, sec["class_mode"], spread=True, precondition=judge_preconditions(RUN))
    cols = ["id", "claim", "family", "A", "B", "n", "runs", "only A right", "only B right", "test", "flag", "precondition"]
    tested = claims[claims.p.notna()]
    assert tested[cols].reset_index(drop=True).equals(again[again.p.notna()][cols].reset_index(drop=True).astype(
        tested[cols].dtypes.to_dict()))
    assert (tested.p.to_numpy() == pytest.approx(again[again.p.notna()].p.to_numpy(), rel=1e-6))
    assert (claims.runs > 1).any() and len(pd.read_csv(RUN / "05_debate" / "cold_runs.csv")) == len(cold)
    assert m["rerun_calls"] == 0
    for f in ("debate_accuracy", "debate_cost", "debate_claims", "debate_cold_runs"):
        _figure(f)


def test_the_adapted_judge_trained_on_train_posts_and_judged_every_variant():
    """Notebook 05's `adapted_judge` option: two adapters (the judge and its shuffled control) trained on train
    posts only, each variant run again with the adapted judge on the same posts, its claims recomputing."""
    from lib.arcade.report import adapted_runs, claim_frame, judge_preconditions, results_from_jsonl
    from lib.data.prep import load_prepared
    from lib.evaluation.preconditions import precondition_rows
    sec, out = P["05_debate"], RUN / "05_debate"
    aj = sec["adapted_judge"]
    info = json.loads((out / "adapted_judge.json").read_text())
    split = {r.id: r.split for r in load_prepared(PROFILE, sec["dataset"], "tests/test_ci_run.py").records}
    assert info["train_posts"] and all(split[i] == "train" for i in info["train_posts"])   # no test post trained it
    for role in ("model", "control"):
        t = info["training"][role]
        assert t["n_examples"] == sum(t["label_counts"].values()) >= len(info["train_posts"])
        assert (out / ("judge_adapter" if role == "model" else "judge_adapter_shuffled") / "adapter.gguf").exists()
    if len(set(info["training"]["model"]["label_counts"])) > 1:       # one label (or one post): shuffling moves nothing
        assert info["training"]["model"]["digest"] != info["training"]["control"]["digest"]
    runs = {}
    for name, suffix in [(v, "_adapted") for v in aj["variants"]] + [(v, "_shuffled") for v in aj["control_variants"]]:
        res = results_from_jsonl(out / f"results_{name}{suffix}.jsonl")
        base = results_from_jsonl(out / f"results_{name}.jsonl")
        assert [r.id for r in res] == [r.id for r in base]                  # the same posts as the served judge's run
        if name == "oracle":                                                # the oracle debaters are not asked
            assert all(c.template == "oracle" for r in res for c in r.calls if c.role in ("prosecutor", "defender"))
        ev = json.loads((out / f"eval_{name}{suffix}.json").read_text())
        runs[name + suffix] = {"results": res, "corrected": ev["corrected"], "cost": ev["cost"], "config": ev["config"]}
    claims = pd.read_csv(out / "claims_adapted.csv")
    again = claim_frame(adapted_runs(runs), sec["class_mode"], suffix="_adapted", tag=" (adapted judge)",
                        precondition=judge_preconditions(RUN, "_adapted"))
    cols = ["id", "claim", "A", "B", "n", "only A right", "only B right", "test", "flag", "precondition"]
    assert claims[cols].equals(again[cols].astype(claims[cols].dtypes.to_dict()))
    assert claims.claim.str.endswith("(adapted judge)").all() and claims.A.str.endswith("_adapted").any()
    methods = {r["method"] for r in precondition_rows(RUN)}
    assert {"ARCADE, judge adapted to MemeWorld (LoRA)", "ARCADE, judge adapter trained on shuffled verdicts (control)"} <= methods


def test_evaluation_compares_every_method_on_the_common_memes():
    m = _metrics("06_evaluation")
    out = RUN / "06_evaluation"
    t = pd.read_csv(out / "comparison.csv", dtype={"subset": str})
    common = t[(t.memes == "common") & (t.subset == "all") & (t.metric == "accuracy")]
    assert len(common) == m["n_methods_compared"] and (common.n == m["n_common_memes"]).all()
    assert ((common.ci_low <= common.value) & (common.value <= common.ci_high)).all()
    common_ids = json.loads((out / "common.json").read_text())["ids"]
    assert len(common_ids) == m["n_common_memes"]
    mc = pd.read_csv(out / "mcnemar.csv")
    k = m["n_methods_compared"]
    assert len(mc) == k * (k - 1) // 2 and (mc.p_adjusted >= mc.pvalue - 1e-12).all()
    fl = pd.read_csv(out / "injection.csv")
    io = fl[(fl.method == "TRACE memeworld-clip_image_only [OCR text only]") & (fl.copies == "instruction")]
    assert len(io) == 1 and not (io.flip_rate.iloc[0] > 0 or io.reverse_flip_rate.iloc[0] > 0)   # NaN: none to flip
    for f in ("evaluation_accuracy_forest", "evaluation_per_type", "evaluation_mcnemar", "evaluation_injection"):
        _figure(f)


def test_notebook_07_indexed_the_run_figures():
    index = (figures_dir(PROFILE) / "README.md").read_text()
    pngs = sorted(p.stem for p in figures_dir(PROFILE).glob("*.png"))
    assert len(pngs) >= 25
    for name in pngs:
        assert f"[png]({name}.png)" in index, name


def test_nbval_checked_every_marked_cell_of_every_notebook():
    """nbval executed every notebook of the ci run and compared each cell marked NBVAL_CHECK_OUTPUT with its
    recorded output (tests/reference/ci_checked_outputs.json): every notebook has such cells, each has a recorded
    output for its current source, and nbval compared every one (a cell left unchecked passes on nothing)."""
    import nbformat
    from lib.compendium.execution import checked_cells
    from lib.compendium.nbcheck import unrecorded
    assert unrecorded() == [], "python -m lib.compendium.nbcheck --write records them from this ci run"
    for nb_file in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        marked = checked_cells(nbformat.read(str(nb_file), as_version=4))
        assert marked, f"{nb_file.name} has no cell marked NBVAL_CHECK_OUTPUT"
        meta = nbformat.read(str(RUN / "notebooks" / nb_file.name), as_version=4).metadata.get("nbval")
        assert meta and meta["failed"] == 0 and meta["checked"] == len(marked), (nb_file.name, meta, len(marked))


@pytest.fixture
def ci_presets(monkeypatch):
    """The ci profile's preset overlay: memeworld-* presets are the models the ci run trained."""
    monkeypatch.setenv("COMPENDIUM_PRESET_OVERLAY", str(ARTIFACTS_ROOT.parent / "params/presets/overlays/ci.yaml"))


def test_embedded_models_load_through_their_presets(ci_presets):
    import torch
    from PIL import Image
    from lib.models.chat import GenParams, load_chat, user
    from lib.models.encoders import load_encoder
    from lib.models.memeworld_vlm import CAPTION_PROMPT
    mw = RUN / "00_data_prep" / "memeworld"
    rows = [json.loads(x) for x in (mw / "captions" / "scene_captions.jsonl").read_text().splitlines()][:4]
    img = Image.open(mw / rows[0]["img"])
    enc = load_encoder("memeworld-clip", device="cpu")
    with torch.no_grad():
        sim = enc.similarity([img], [rows[0]["caption"], rows[0]["foil"]])
    assert sim.shape == (1, 2)
    chat = load_chat("memeworld-vlm", cache=None, device="cpu")
    r = chat.generate([user(img, CAPTION_PROMPT)], GenParams(max_new_tokens=40))
    assert r.status == "ok" and r.text.strip()


def test_trace_command_line_trains_one_variant():
    """`python -m lib.trace.runs` (what `accelerate launch` runs) trains from the profile and writes a
    resumable run folder; run again, it reads the finished run back instead of retraining."""
    import shutil
    import subprocess
    import sys
    run = RUN / "02_finetuning" / "runs" / "multioff_memeworld-clip_all_clitest"
    shutil.rmtree(run, ignore_errors=True)
    cmd = [sys.executable, "-m", "lib.trace.runs", "--profile", PROFILE, "--dataset", "multioff", "--epochs", "2",
           "--tag", "clitest", "--no-progress"]
    env = {**__import__("os").environ, "COMPENDIUM_PRESET_OVERLAY":
           str(ARTIFACTS_ROOT.parent / "params/presets/overlays/ci.yaml")}
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ARTIFACTS_ROOT.parent, env=env)
        assert r.returncode == 0, r.stderr[-3000:]
        res = json.loads((run / "result.json").read_text())
        cfg = json.loads((run / "config.json").read_text())
        assert cfg["config"]["epochs"] == 2 and cfg["config"]["scorer_arch"] == "small"   # the MultiOFF script's recipe
        assert len(res["curve"]) == 2 and (run / "checkpoint.pt").exists()
        assert 0 <= res["eval"]["splits"]["test"]["macro_f1"] <= 1
        again = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ARTIFACTS_ROOT.parent, env=env)
        assert again.returncode == 0 and "already finished" in again.stdout
    finally:
        shutil.rmtree(run, ignore_errors=True)


def test_every_figure_redraws_from_artifacts_alone(tmp_path):
    """Notebook 07's promise: with every model loader and dataset loader made to fail, all figures
    whose artifacts exist are redrawn in under a minute, and the index lists only files that exist."""
    import re
    import subprocess
    import sys
    script = r'''
import sys, time
import torch, transformers
import lib.sei.agents, lib.models.chat, lib.data.prep, lib.data.datasets, lib.models.encoders, lib.models.serve
def refuse(*a, **k):
    raise RuntimeError("a model or a dataset was loaded while redrawing figures")
for mod, name in ((lib.models.encoders, "load_encoder"), (lib.models.chat, "load_chat"), (lib.models.serve, "serve"),
                  (lib.sei.agents, "agent_chat"), (lib.data.datasets, "load"), (lib.data.prep, "load_prepared"),
                  (torch, "load")):
    setattr(mod, name, refuse)
transformers.PreTrainedModel.from_pretrained = classmethod(lambda cls, *a, **k: refuse())
from lib.evaluation import figures
t0 = time.time()
rows = figures.redraw_all("ci", progress=False, root=sys.argv[1])
figures.write_index(rows, ("ci",), root=sys.argv[1])
print("ELAPSED", time.time() - t0, "DRAWN", sum(r["status"] == "drawn" for r in rows), "OF", len(rows))
for r in rows:
    print("ROW", r["name"], r["status"])
'''
    from lib.evaluation import figures
    expected = {f.name for f in figures.available(PROFILE)}
    r = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=300,
                       cwd=ARTIFACTS_ROOT.parent)
    assert r.returncode == 0, r.stderr[-3000:]
    elapsed = float(re.search(r"ELAPSED (\S+)", r.stdout).group(1))
    drawn = {line.split()[1] for line in r.stdout.splitlines() if line.startswith("ROW") and line.endswith("drawn")}
    assert drawn == expected and len(drawn) >= 25
    assert elapsed < 60, f"redrawing took {elapsed:.0f}s"
    index = (tmp_path / "README.md").read_text()
    links = re.findall(r"\]\((ci/[^)]+\.png)\)", index)
    assert len(links) == len(drawn) and all((tmp_path / x).exists() and (tmp_path / x.replace(".png", ".pdf")).exists()
                                            for x in links)


def test_published_results_of_the_run_recompute(tmp_path):
    """What `make reproduce` would commit for this run (lib.compendium.results.publish_stage into a scratch
    results folder) recomputes to its metrics.json, stage by stage: the committed results' check,
    exercised at ci sizes on every run of `make test`."""
    import lib.compendium.results as results
    from lib.evaluation.recompute import RECOMPUTE, coverage, mismatches, recompute
    old = results.RESULTS_ROOT
    results.RESULTS_ROOT = tmp_path
    try:
        for st in stages():
            if st.name in RESULT_FILES:
                results.publish_stage(PROFILE, st.name)
    finally:
        results.RESULTS_ROOT = old
    root = tmp_path / PROFILE
    for st in RECOMPUTE:
        committed = json.loads((root / st / "metrics.json").read_text())
        again = recompute(st, root / st, root)
        assert not mismatches(committed, again), (st, mismatches(committed, again)[:10])
        assert not coverage(st, committed, again), (st, coverage(st, committed, again)[:10])


# ----------------------------------------------------------------------------- killed and resumed (last: it reruns stages)
def _outputs(stage, files):
    from lib.compendium.results import TIMING

    def content(f):                                  # a JSON file without its timings and call counts
        if f.suffix != ".json":
            return f.read_bytes()
        return {k: v for k, v in json.loads(f.read_text()).items() if not TIMING.search(k) and "calls" not in k}
    m = {k: v for k, v in _metrics(stage).items() if not TIMING.search(k)}
    return m, {f.name: content(f) for pat in files for f in sorted((RUN / stage).glob(pat))}


def _process_tree(root):
    """`root` and every process below it (Linux /proc): the runner, its notebook kernel (which has a process
    group of its own), the kernel's training workers and model server."""
    from pathlib import Path
    children = {}
    for st in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(st.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(st.parent.name))
    out, todo = [root], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _kill_tree(root):
    """Freeze the whole tree first (nothing new starts, nothing is orphaned), then SIGKILL every process."""
    import os
    import signal
    tree = _process_tree(root)
    for pid in tree:
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            pass
    tree = list(dict.fromkeys(tree + [q for pid in tree for q in _process_tree(pid)]))
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return tree


def _kill_and_resume(stage, seed, window, log):
    """Start `make reproduce NB=<stage>` for the ci profile and SIGKILL its whole process tree (runner,
    kernel, training workers, model server) after a seeded random number of seconds in `window`, twice;
    then let a third run finish. Returns the seconds each kill came after its start (None: that
    run finished first)."""
    import os
    import random
    import subprocess
    import sys
    import time
    from lib import ROOT
    rng = random.Random(seed)
    cmd = [sys.executable, "-m", "lib.compendium.runner", "reproduce", "--profile", PROFILE, "--only", stage, "--no-publish"]
    kills = []
    with open(log, "w") as out:
        for k in range(2):
            p = subprocess.Popen(cmd + (["--force"] if k == 0 else []), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
            t = rng.uniform(*window)
            try:
                p.wait(timeout=t)
                kills.append(None)
            except subprocess.TimeoutExpired:
                tree = _kill_tree(p.pid)
                p.wait()
                kills.append(round(t, 1))
                time.sleep(0.5)
                alive = [q for q in tree[1:] if os.path.exists(f"/proc/{q}") and
                         open(f"/proc/{q}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"]
                assert not alive, f"processes of the killed run outlived it: {alive}"
        done = subprocess.run(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    assert done.returncode == 0, f"the resumed run of {stage} failed; its log: {log}"
    return kills


@pytest.mark.ci_resume
@pytest.mark.parametrize("stage, files, window", [
    ("02_finetuning", ["predictions_*.csv", "seeds.csv", "ablation.csv"], (10.0, 40.0)),   # training: epoch checkpoints
    ("05_debate", ["eval_*.json", "claims.csv"], (5.0, 20.0)),                                # model answers: the cache
], ids=["training", "llm"])
def test_a_stage_killed_twice_at_random_points_resumes_to_the_same_results(stage, files, window, tmp_path):
    """A `make reproduce` killed at any point resumes where it stopped and ends with the uninterrupted run's
    results: the ci run's training stage (six of its runs deleted first, so the kills land in training and
    the resumed runs continue from their last finished epoch) and an LLM stage (its answers come back from the
    response cache, claims and all), each killed twice at seeded random points."""
    import shutil
    from lib.compendium.results import compare_metrics
    before = _outputs(stage, files)
    if stage == "02_finetuning":       # six seed repeats, trained last: the kills land in training without
        for run in sorted((RUN / stage / "runs").glob("fhm_*_seed1"))[:6]:   # retraining all twenty runs
            shutil.rmtree(run)
    kills = _kill_and_resume(stage, seed=sum(map(ord, stage)), window=window, log=tmp_path / f"{stage}.log")
    after = _outputs(stage, files)
    assert compare_metrics(before[0], after[0])[1:] == [], (kills, compare_metrics(before[0], after[0])[:8])
    assert before[1].keys() == after[1].keys() and len(before[1]) >= 2
    assert [f for f in before[1] if before[1][f] != after[1][f]] == [], kills


# ----------------------------------------------------------------------------- the ablation path, at ci size
def test_a_child_profile_reruns_one_stage_reusing_what_its_change_did_not_move(tmp_path):
    """A child profile (`extends: ci`, one variant added to notebook 02) run with `reproduce --only 02 --deps`:
    the stages before 02, whose parameters it leaves as they are, are the parent's (copied from artifacts/ci/);
    its 02 reads back every TRACE run the change did not touch and trains only the new one; it writes only under
    artifacts/<child>/; `compare` then names what moved against the parent's run, on the stages it ran."""
    import os
    import shutil
    import subprocess
    import sys
    name = f"ablation-{os.getpid()}"
    prof = ROOT / "params" / f"{name}.yaml"
    prof.write_text('extends: ci\n02_finetuning:\n  extra_variants:\n    "cls+rel (head dropout 0.3)": {head_dropout: 0.3}\n')
    before = {p: p.stat().st_mtime_ns for p in (RUN / "02_finetuning").rglob("*") if p.is_file()}
    try:
        r = subprocess.run([sys.executable, "-m", "lib.compendium.runner", "reproduce", "--profile", name, "--only", "02",
                            "--deps"], cwd=ROOT, capture_output=True, text=True, timeout=1200)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert "reused from the profile it extends" in r.stdout
        for st in ("00_data_prep", "models", "01_captioning"):
            assert f"{st} (artifacts/ci/{st})" in r.stdout
        child = ARTIFACTS_ROOT / name / "02_finetuning" / "runs"
        new = [d for d in child.iterdir() if d.name.endswith("_head_dropout_0_3")]
        assert len(new) == 1 and (new[0] / "checkpoint.pt").exists()                 # the one run the change made
        for d in (RUN / "02_finetuning" / "runs").iterdir():                          # every other: the parent's
            if (d / "predictions.csv").exists():
                assert (child / d.name / "predictions.csv").read_bytes() == (d / "predictions.csv").read_bytes(), d.name
        assert {p: p.stat().st_mtime_ns for p in (RUN / "02_finetuning").rglob("*") if p.is_file()} == before
        c = subprocess.run([sys.executable, "-m", "lib.compendium.compare", str(RUN), str(ARTIFACTS_ROOT / name)],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert c.returncode == 1, c.stdout + c.stderr                                  # something moved: named
        assert "stages compared: 00_data_prep, models, 01_captioning, 02_finetuning" in c.stdout
        assert "00_data_prep: " in c.stdout and "identical to the first run" in c.stdout.split("02_finetuning:")[0]
        assert "head_dropout_0_3" in c.stdout or "new" in c.stdout.split("02_finetuning:")[1]
    finally:
        prof.unlink(missing_ok=True)
        shutil.rmtree(ARTIFACTS_ROOT / name, ignore_errors=True)
