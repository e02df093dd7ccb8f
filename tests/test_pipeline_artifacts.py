"""Checks on what the embedded pipeline produced (`make test` runs the stages first).

These read `artifacts/embedded/`: the trained models meet their held-out figures, load
through the same presets as hub checkpoints, and the notebooks' headline numbers hold."""
import json

import pytest

from lib.artifacts import ARTIFACTS_ROOT

pytestmark = pytest.mark.artifacts
EMB = ARTIFACTS_ROOT / "embedded"


def _metrics(stage):
    p = EMB / stage / "metrics.json"
    if not p.exists():
        pytest.skip(f"{p} not produced yet (make reproduce NB={stage.split('_')[0]})")
    return json.loads(p.read_text())


def test_models_meet_their_held_out_figures():
    m = _metrics("models")
    assert m["clip_foil_pair_acc"] >= 0.95
    assert m["clip_retrieval_r1"] > 50 * m["clip_retrieval_chance"]
    assert m["clip_train_s"] > 0          # a timing is reported, never asserted (shared machines are noisy)
    assert m["vlm_rouge_l"] >= 0.6 and m["vlm_rouge_l"] > m["vlm_rouge_l_baseline"] + 0.2
    assert m["vlm_train_s"] > 0
    assert (ARTIFACTS_ROOT.parent / "figures" / "embedded" / "models_training_curves.png").exists()
    # the main CLIP trains on pairs that carry test captions (and says how many); the ablation's
    # two never do, and both learn well above chance
    assert m["clip_train_pairs_with_test_caption"] > 0
    for tag in ("leak_free", "leak_free_no_hard_negatives"):
        assert m[f"clip_train_pairs_with_test_caption_{tag}"] == 0
        assert m[f"clip_train_pairs_{tag}"] < m["clip_train_pairs"]
        assert m[f"clip_retrieval_r1_{tag}"] > 50 * m["clip_retrieval_chance"]
    # SeeTRUE's NLI scorer: well above the majority class on dev-meme pairs
    assert m["nli_heldout_acc"] > m["nli_heldout_majority"] + 0.3


def test_embedded_models_load_through_their_presets():
    import torch
    from PIL import Image
    from lib.chat import GenParams, load_chat, user
    from lib.encoders import load_encoder
    from lib.memeworld_vlm import CAPTION_PROMPT
    _metrics("models")
    mw = EMB / "00_data_prep" / "memeworld"
    rows = [json.loads(l) for l in (mw / "captions" / "scene_captions.jsonl").read_text().splitlines()][:4]
    img = Image.open(mw / rows[0]["img"])
    enc = load_encoder("memeworld-clip", device="cpu")
    with torch.no_grad():
        sim = enc.similarity([img], [rows[0]["caption"], rows[0]["foil"]])
    assert sim[0, 0] > sim[0, 1]
    chat = load_chat("memeworld-vlm", cache=None, device="cpu")
    r = chat.generate([user(img, CAPTION_PROMPT)], GenParams(max_new_tokens=40))
    assert r.status == "ok" and len(r.text.split()) >= 5


def test_clip4dm_headline_numbers():
    import pandas as pd
    m = _metrics("03_clip4dm")
    for k in ("la", "la_official_string", "ap_clipscore", "ap_neg_attribution", "ap_fclipscore", "pairs_per_s_batched",
              "pairs_per_s_single", "epsilon_chosen", "hat_la", "hat_la_position_exact", "richhf_spearman_neg_attribution"):
        assert k in m
    assert m["la"] > 3 * m["la_chance"]                    # clearly above chance
    # a foil is always a content word: guessing among those is the honest chance line, and higher
    assert m["la_chance_content"] > m["la_chance"]
    # position-exact LA never credits the unchanged copy of a repeated foil word
    assert m["n_repeated_foil_word"] > 0 and m["la"] <= m["la_official_string"]
    assert m["hat_la_position_exact"] <= m["hat_la"] + 1e-9
    # epsilon is chosen on the validation copy, from the profile's grid
    from lib.params import load_profile
    grid = load_profile("embedded")["03_clip4dm"]["epsilon_grid"]
    assert m["epsilon_chosen"] in grid
    sweep = pd.read_csv(EMB / "03_clip4dm" / "epsilon_sweep.csv")
    band = sweep[sweep.within_tie]
    assert set(band.epsilon) >= {m["epsilon_chosen"]} and sweep.chosen.sum() == 1
    # the rule: the least abstaining threshold among the near-ties of the best validation word-F1
    assert m["epsilon_val_share_abstaining"] == pytest.approx(band.share_abstaining.min(), abs=1e-5)
    # RichHF is graded now: more negative attribution goes with more misaligned words
    assert m["richhf_spearman_neg_attribution"] > 0.05
    # batched attribution is several times faster per pair, both from PIL images; measured 4.8x
    # to 6.9x on the same 2-core machine across runs (the one-at-a-time path's speed varies most),
    # so 4x is asserted
    assert m["pairs_per_s_batched_from_images"] >= 4 * m["pairs_per_s_single"]
    assert m["batched_max_abs_diff"] < 1e-5
    # within 1.2x of the floor (forward + backward on ready inputs; measured 1.02-1.07 on 2 cores):
    # the batched path on ready pixels tokenises, attributes and assembles words inside the timing
    assert m["pixels_ready"] and m["pairs_per_s_floor"] > 0 and m["pairs_per_s_reuse"] > 0
    assert 0.5 < m["floor_ratio"] <= 1.2, m["floor_ratio"]
    assert m["pairs_per_s_batched"] >= m["pairs_per_s_batched_from_images"] * 0.9
    assert 0.5 < m["ap_clipscore"] <= 1.0
    for b in ("foil", "nocaps_foil", "hat", "richhf", "seetrue"):
        assert (EMB / "03_clip4dm" / f"results_{b}.csv").exists(), b
    by_enc = pd.read_csv(EMB / "03_clip4dm" / "by_encoder.csv")
    assert list(by_enc.encoder) == load_profile("embedded")["03_clip4dm"]["encoders"]
    assert by_enc["FOIL LA"].iloc[0] == pytest.approx(m["la"])
    for f in ("clip4dm_word_attributions", "clip4dm_epsilon_sweep", "clip4dm_score_distributions", "clip4dm_backbones",
              "clip4dm_nocaps_domains", "clip4dm_hard_negatives"):
        assert (ARTIFACTS_ROOT.parent / "figures" / "embedded" / f"{f}.png").exists(), f
    # nocaps-FOIL is its own benchmark now (novel objects), reported per domain, and differs from FOIL
    for d in ("in", "near", "out"):
        assert 0 <= m[f"nocaps_la_{d}"] <= 1
    assert m["nocaps_la"] != m["la"] and m["nocaps_ap_fclipscore"] != m["ap_fclipscore"]
    # the hard-negative ablation ran on leak-free models, with and without hard negatives
    for score in ("clipscore", "neg_attribution", "fclipscore"):
        for tag in ("leak_free", "no_hard_negatives"):
            assert 0.4 < m[f"ap_{score}_{tag}"] <= 1 and 0.4 < m[f"nocaps_ap_{score}_{tag}"] <= 1
    hn = pd.read_csv(EMB / "03_clip4dm" / "hard_negatives.csv")
    assert hn.model.nunique() == 3 and set(hn.benchmark) == {"foil", "nocaps_foil"}
    # SeeTRUE's NLI score lies between its controls' ends and is reported with the NLI model's accuracy
    assert 0 <= m["seetrue_nli_score"] <= 1 and m["nli_heldout_acc"] > 0.8
    assert m["seetrue_nli_oracle"] > m["seetrue_nli_random_word"]

def test_captioning_headline_numbers():
    m = _metrics("01_captioning")
    assert m["n_memes"] > 0 and m["n_unreadable"] == 0
    assert m["rouge_l_vlm_caption"] >= 0.6
    rows = json.loads((EMB / "01_captioning" / "trace_captions.json").read_text())
    assert len(rows) == m["n_memes"] and all({"img", "text", "label", "split"} <= set(r) for r in rows)
    assert sum("vlm_caption" in r for r in rows) == len(rows)
    # held-out captions (memeworld-vlm never saw them) stay close to gold
    assert m["rouge_l_vlm_caption"] >= 0.6 and "rouge_l_vlm_caption_train" in m
    # boxes for the tags: every tagged meme carries them, and a correct tag's box lands in the
    # right third of the image clearly more often than chance (1/3)
    assert all(len(r["grounding"]) == len(r["tag_caption"].split(", ")) for r in rows if r.get("tag_caption"))
    assert m["n_boxes_scored"] > 1000 and m["box_position_accuracy"] > 1 / 3 + 0.05
    mo = json.loads((EMB / "01_captioning" / "trace_captions_multioff.json").read_text())
    assert len(mo) == m["n_memes_multioff"] > 0 and {r["split"] for r in mo} == {"train", "val", "test"}


def test_trace_runs_the_official_defaults_with_honest_baselines():
    m = _metrics("02_finetuning")
    for k in ("auroc", "accuracy", "macro_f1", "epoch_s_cached", "epoch_s_uncached", "best_epoch"):
        assert k in m
    assert m["auroc"] > 0.85
    # the multimodal default beats every unimodal baseline overall, and on dual inversion (110)
    for b in ("text_only_", "caption_only_", "image_only_"):
        assert m["accuracy"] > m[f"{b}accuracy"] + 0.08, b
    assert m["acc_type_110"] > m["text_only_acc_type_110"] + 0.3
    # baselines mean their names: text-only reads only the meme text, caption-only never does
    assert m["text_only_text_mean_weight"] == 1.0 and m["caption_only_text_mean_weight"] == 0.0
    # the no-caption model keeps image and meme text and never reads a caption; the caption benefit is
    # tested against it (the difference, McNemar, and its spread over seeds), whatever its sign
    assert m["image_text_only_text_mean_weight"] == 1.0
    assert 0 <= m["caption_benefit_mcnemar_p"] <= 1 and m["caption_benefit_n"] > 0
    assert m["caption_benefit_n_seeds"] >= 5 and 0 <= m["caption_benefit_seeds_positive"] <= m["caption_benefit_n_seeds"]
    # emergent hate (001): the image+caption scorer finds it, the official caption-only scorer and
    # every unimodal baseline do not (the notebook's reading)
    assert m["image_caption_scorer_acc_type_001"] > m["text_only_acc_type_001"] + 0.5
    assert m["image_caption_scorer_acc_type_001"] > m["image_only_acc_type_001"] + 0.5
    # whether the default learns 001 depends on the seed and on the machine's floating point (0.04 / 0.68 /
    # 0.01 over three seeds on one machine, 0.94 / 0.87 / 0.32 on another, same commit): reported as a
    # distribution over seeds, never asserted either way
    import pandas as pd
    seeds = pd.read_csv(EMB / "02_finetuning" / "seeds.csv")
    default = seeds[seeds.variant == "cls+rel"]
    assert len(default) >= 5 and default.acc_type_001.between(0, 1).all()
    assert abs(m["trace_seeds_cls_rel_acc_type_001_mean"] - default.acc_type_001.mean()) < 1e-6
    # the selection fix: cosine / 0.07 never picks the meme text in training, the raw cosine does
    assert m["cls_con_cos007_text_train_pick_share"] < 0.05 < 0.1 < m["cls_con_text_train_pick_share"]
    # frozen parts computed once: an epoch is at least 3x faster than the full backbone's
    assert m["epoch_s_uncached"] >= 3 * m["epoch_s_cached"]
    assert m["epoch_s_cached_prefix_only"] > m["epoch_s_cached"]
    # MultiOFF: the recipe ran; the majority answer is reported beside it; without its contrastive
    # term it learns something
    assert 0 <= m["multioff_macro_f1"] <= 1 and 0.5 < m["multioff_majority_accuracy"] < 0.7
    assert m["multioff_no_con_auroc"] > 0.62
    preds = EMB / "02_finetuning" / "predictions_cls_rel.csv"
    import pandas as pd
    df = pd.read_csv(preds)
    assert {"id", "split", "probability", "threshold", "prediction", "label", "selected"} <= set(df.columns)
    assert df["threshold"].nunique() == 1                      # one threshold, chosen on validation
    runs = EMB / "02_finetuning" / "runs"
    for name in ("fhm_memeworld-clip_cls_rel", "fhm_memeworld-clip_text_only", "multioff_memeworld-clip_all"):
        for f in ("config.json", "checkpoint.pt", "result.json", "predictions.csv"):
            assert (runs / name / f).exists(), (name, f)
    share = pd.read_csv(EMB / "02_finetuning" / "selected_share.csv", index_col=[0, 1])
    assert set(share.index.get_level_values(0)) == {"train pick share (last epoch)", "mean inference weight", "argmax share"}
    # seeds: the default, the default without captions and the loss ablations over at least five seeds;
    # the first is the run above
    seeds = pd.read_csv(EMB / "02_finetuning" / "seeds.csv")
    assert {"cls+rel", "image_text_only"} <= set(seeds.variant)
    assert (seeds.groupby("variant").seed.nunique() >= 5).all() and m["n_seeds"] >= 5
    assert seeds.groupby("variant").accuracy.std().max() > 0             # replicates, not copies of one run
    first = seeds[seeds.seed == json.loads((runs / "fhm_memeworld-clip_cls_rel" / "config.json").read_text())["config"]["seed"]]
    assert first[first.variant == "cls+rel"].accuracy.iloc[0] == pytest.approx(m["accuracy"])
    assert m["trace_seeds_cls_rel_accuracy_mean"] > m["trace_seeds_cls_con_accuracy_mean"] + 3 * m["trace_seeds_cls_con_accuracy_sd"]


def test_trace_command_line_trains_one_variant(tmp_path):
    """`python -m lib.trace_report` (what `accelerate launch` runs) trains from the profile and writes a
    resumable run folder; run again, it reads the finished run back instead of retraining."""
    import shutil
    import subprocess
    import sys
    _metrics("01_captioning")
    run = EMB / "02_finetuning" / "runs" / "multioff_memeworld-clip_all_clitest"
    shutil.rmtree(run, ignore_errors=True)
    cmd = [sys.executable, "-m", "lib.trace_report", "--profile", "embedded", "--dataset", "multioff", "--epochs", "2",
           "--tag", "clitest", "--no-progress"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ARTIFACTS_ROOT.parent)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((run / "result.json").read_text())
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["config"]["epochs"] == 2 and cfg["config"]["scorer_arch"] == "small"     # the MultiOFF script's recipe
    assert len(res["curve"]) == 2 and (run / "checkpoint.pt").exists()
    assert 0 <= res["eval"]["splits"]["test"]["macro_f1"] <= 1 and 0 < res["eval"]["threshold"] < 1
    import pandas as pd
    df = pd.read_csv(run / "predictions.csv")
    assert set(df["split"]) == {"test"} and df["threshold"].nunique() == 1
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ARTIFACTS_ROOT.parent)
    assert again.returncode == 0 and "already finished" in again.stdout
    shutil.rmtree(run)


def test_serving_benchmark_figures():
    m = _metrics("serving")
    for c in (1, 2, 4, 8):
        assert m[f"tokens_per_s_served_c{c}"] > 0 and m[f"requests_per_s_served_c{c}"] > 0
    # ratios measured side by side in one run; the targets are 3x and 1.5x (measured here 3.4x-4.6x
    # and 1.5x-1.7x across runs), asserted with a margin for a noisy shared machine
    assert m["speedup_served_vs_hf_c4"] >= 2.5
    assert m["served_scaling_c4_vs_c1"] >= 1.2
    assert m["schema_valid_rate_with_schema"] >= 0.95
    assert m["schema_valid_rate_with_schema"] > m["schema_valid_rate_without_schema"]
    assert m["ttft_warm_s"] < m["ttft_cold_s"]
    assert m["prefix_cached_tokens_warm"] >= 0.8 * m["prefix_prompt_tokens"] > m["prefix_cached_tokens_cold"]
    assert (ARTIFACTS_ROOT.parent / "figures" / "embedded" / "serving_throughput.png").exists()


def test_captioned_served_model_sees_captions_of_memeworld_images(tmp_path):
    from PIL import Image
    from lib.chat import GenParams, load_chat, user
    from lib.serve import serve
    _metrics("models")
    mw = EMB / "00_data_prep" / "memeworld"
    rows = [json.loads(l) for l in (mw / "memeworld.jsonl").read_text().splitlines()[:3]]
    imgs = [Image.open(mw / r["img"]).convert("RGB") for r in rows]
    convs = [[user(im, f"Meme text: {r['text']}. Is this meme hateful?")] for im, r in zip(imgs, rows)]
    params = GenParams(max_new_tokens=40, choices=("hateful", "non-hateful"))
    with serve("smollm2-135m-instruct") as srv:
        chat = load_chat("smollm2-135m-instruct+memeworld-captions", cache=tmp_path / "c.sqlite",
                         base_url=srv.base_url, device="cpu")
        res = chat.generate_many(convs, params, progress=False)
        assert all(r.status == "ok" and r.parsed in params.choices for r in res), res
        described = chat.backend.describe(convs[0])
        caption_part = described[0]["content"][0]["text"]
        assert "captioning model" in caption_part and len(caption_part.split()) > 10
        assert all(p["type"] == "text" for m in described for p in m["content"])
        again = load_chat("smollm2-135m-instruct+memeworld-captions", cache=tmp_path / "c.sqlite",
                          base_url=srv.base_url, device="cpu")
        assert [r.parsed for r in again.generate_many(convs, params, progress=False)] == [r.parsed for r in res]
        assert again.stats.requests == 0 and again.backend.captioner.stats.requests == 0


def test_debate_notebook_outputs():
    from lib.debate import evaluate
    from lib.debate_report import results_from_jsonl
    m = _metrics("05_debate")
    for k in ("acc", "acc_easy", "acc_normal", "acc_hard", "macro_f1", "weighted_f1", "direct_acc", "calls_per_sample",
              "calls_per_sample_track1", "calls_per_sample_track2", "share_track1", "n_eval", "n_refused",
              "n_unparseable", "rerun_calls"):
        assert k in m, k
    assert m["rerun_calls"] == 0                       # replayed from the response cache
    for k in ("acc", "direct_acc"):                    # Wilson intervals: the sample is tens of posts
        assert m[f"{k}_ci_low"] <= m[k] <= m[f"{k}_ci_high"] and m[f"{k}_ci_high"] - m[f"{k}_ci_low"] > 0
    out = EMB / "05_debate"
    res = results_from_jsonl(out / "results_arcade.jsonl")
    assert len(res) == m["n_eval"] and evaluate(res)["acc"] == pytest.approx(m["acc"], abs=1e-6)   # metrics: 6 decimals
    assert all(c.template and c.status in ("ok", "unparseable", "refused", "blocked", "failed")
               for r in res for c in r.calls)
    routed = [r for r in res if r.route in ("track1", "track2", "dismissal")]
    assert all(r.calls[0].stage == "rapid_scan" and r.calls[0].temperature == 0.0 for r in routed)
    assert (out / "report_arcade.txt").read_text().startswith("Report: [ARCADE]")
    for name in ("debate_accuracy", "debate_cost", "debate_claims"):
        assert (ARTIFACTS_ROOT.parent / "figures" / "embedded" / f"{name}.png").exists()
    # each claim's paired test: recomputed from the two variants' saved verdicts on the posts both judged
    import pandas as pd
    from lib.debate_report import paired_test, post_correct
    claims = pd.read_csv(out / "claims.csv")
    tested = claims[claims["exact McNemar p"].notna()]
    assert len(tested) >= 1 and tested["exact McNemar p"].between(0, 1).all()
    for _, row in tested.iterrows():
        a, b = (results_from_jsonl(out / f"results_{row[k]}.jsonl") for k in ("A", "B"))
        truth = {r.id: r.gt for r in a + b}
        t = paired_test(post_correct(a), post_correct(b), truth)
        assert t["n"] == row["n"] and (t["only_a_right"], t["only_b_right"]) == (row["only A right"], row["only B right"])
        assert m[f"claim_{row['A']}_vs_{row['B']}_n"] == row["n"]


def test_few_shot_notebook_outputs():
    """Notebook 04: the metrics the evaluation reads, predictions that reproduce them, exemplar
    ids that are the exact top-n of the saved embeddings, agents scored beside their baseline."""
    import numpy as np
    from lib import sei
    m = _metrics("04_few_shot")
    for k in ("acc", "macro_f1", "acc_zero_shot", "acc_random_exemplars", "acc_shuffled_labels", "acc_knn_vote",
              "retrieval_label_agreement", "retrieval_label_base_rate", "n_eval", "n_unparseable", "rerun_calls"):
        assert k in m, k
    for a in ("captioner", "explainer", "commonsense", "intervention"):
        for k in ("rouge_l", "semsim", "baseline_rouge_l", "baseline_semsim"):
            assert f"agent_{a}_{k}" in m
        assert (EMB / "04_few_shot" / "agents" / a / "config.json").exists()
    assert m["rerun_calls"] == 0
    for k in ("acc", "acc_zero_shot", "acc_random_exemplars"):     # Wilson intervals beside each accuracy
        assert m[f"{k}_ci_low"] <= m[k] <= m[f"{k}_ci_high"]
    out = EMB / "04_few_shot"
    rows = [json.loads(l) for l in (out / "predictions_fhm.jsonl").read_text().splitlines()]
    main = [r for r in rows if r["setting"] == "memeworld-clip/4"]
    assert len(main) == m["n_eval"]
    assert np.mean([r["label"] == r["gold"] for r in main]) == pytest.approx(m["acc"])
    assert all(r["status"] in sei.STATUSES for r in rows)
    ex = json.loads((out / "exemplars_fhm_memeworld-clip.json").read_text())
    z = np.load(out / "embeddings_memeworld-clip.npz")
    emb = dict(zip(z["ids"].tolist(), z["emb"]))
    q = next(iter(ex))
    key = next(k for k in emb if k.split("|")[0] == q)
    sims = [s for _, s in ex[q]]
    assert sims == sorted(sims, reverse=True) and len(sims) >= 4
    assert float(np.dot(emb[key], next(v for k, v in emb.items() if k.split("|")[0] == ex[q][0][0]))) == \
        pytest.approx(sims[0], abs=1e-5)
    # the §7 analyses read one answer per meme (the main setting), never the 2- and 4-shot answers pooled
    import pandas as pd
    coh = pd.read_csv(out / "coherence.csv", dtype={"id": str})
    assert coh.id.is_unique and set(coh.setting) <= {"memeworld-clip/4"}
    for name in ("few_shot_agents", "few_shot_accuracy", "few_shot_lexical", "few_shot_sentiment", "few_shot_claims"):
        assert (ARTIFACTS_ROOT.parent / "figures" / "embedded" / f"{name}.png").exists()


def test_few_shot_claims_are_recomputed_from_the_saved_answers():
    """Notebook 04's sizing and claims: the settings' memes as the profile says (the type-balanced
    evaluation set, the subset settings on a nested subset), and every claim row recomputed from
    predictions_fhm.jsonl with the same counts and exact p."""
    import pandas as pd
    from lib.params import load_profile
    from lib.sei import Prediction
    from lib.sei_report import claim_frame, main_setting_name
    sec = load_profile("embedded")["04_few_shot"]
    out = EMB / "04_few_shot"
    rows = [json.loads(l) for l in (out / "predictions_fhm.jsonl").read_text().splitlines()]
    by = {}
    for r in rows:
        by.setdefault(r["setting"], []).append(Prediction(**{k: v for k, v in r.items() if k != "model"}))
    main = main_setting_name(sec["retrievers"], sec["shots"])
    ids = {p.id for p in by[main]}
    assert len(ids) == sec["eval_n"] == len(by[main])
    for name, preds in by.items():
        sub = {p.id for p in preds}
        assert sub <= ids, name
        assert len(sub) == (sec["subset"]["n"] if name in sec["subset"]["settings"] else sec["eval_n"]), name
    if sec.get("eval_balance") == "type":
        from collections import Counter
        from lib.sei_report import memeworld_types
        types = memeworld_types(EMB / "00_data_prep" / "memeworld")
        per = Counter(types[i] for i in ids)
        assert len(per) == 8 and set(per.values()) == {sec["eval_n"] // 8}
    claims = pd.read_csv(out / "claims.csv")
    m = _metrics("04_few_shot")
    # the knn vote's answers are not saved per meme: its row is checked through metrics.json
    tested = claims[claims.B != "knn_vote"]
    again = claim_frame(by, main, sec["retrievers"][0]).set_index(["A", "B"])
    assert len(tested) >= 3
    for _, row in tested.iterrows():
        r = again.loc[(row["A"], row["B"])]
        assert (r["n"], r["only A right"], r["only B right"]) == (row["n"], row["only A right"], row["only B right"])
        assert r["exact McNemar p"] == pytest.approx(row["exact McNemar p"], rel=1e-6)
        key = "claim_" + f"{row['A']}_vs_{row['B']}".replace("/", "_")
        assert m[f"{key}_n"] == row["n"] and m[f"{key}_acc_a"] == pytest.approx(row["acc A"], abs=1e-6)


def test_evaluation_notebook_outputs():
    """Notebook 06: the headline keys, a comparison table whose numbers the saved predictions give
    back, every pair tested once, and injection rows with their control and channel checks."""
    import numpy as np
    import pandas as pd
    from lib import datasets
    m = _metrics("06_evaluation")
    for k in ("n_methods_compared", "n_common_memes", "n_significant_pairs", "n_pairs",
              "injection_flip_rate_trace_cls_rel", "injection_flip_rate_trace_cls_rel_control"):
        assert k in m, k
    out = EMB / "06_evaluation"
    t = pd.read_csv(out / "comparison.csv", dtype={"subset": str})
    common = t[(t.memes == "common") & (t.subset == "all") & (t.metric == "accuracy")]
    assert len(common) == m["n_methods_compared"] and (common.n == m["n_common_memes"]).all()
    assert ((common.ci_low <= common.value) & (common.value <= common.ci_high)).all()
    # TRACE's common-set accuracy from its own predictions file
    ids = json.loads((out / "gallery.json").read_text())            # gallery ids are common memes
    pred = pd.read_csv(EMB / "02_finetuning" / "runs" / "fhm_memeworld-clip_cls_rel" / "predictions.csv", dtype={"id": str})
    arc = [json.loads(x)["id"] for x in (EMB / "05_debate" / "results_arcade.jsonl").read_text().splitlines()]
    common_ids = json.loads((out / "common.json").read_text())["ids"]     # the posts every debate variant judged
    assert len(common_ids) == m["n_common_memes"] and set(common_ids) <= set(arc)
    p = pred.set_index("id").loc[common_ids]
    row = common.set_index("method").loc["TRACE memeworld-clip_cls_rel"]
    assert np.mean(p.prediction == p.label) == pytest.approx(row.value)
    assert all(g["id"] in common_ids for g in ids)
    mc = pd.read_csv(out / "mcnemar.csv")
    k = m["n_methods_compared"]
    assert len(mc) == k * (k - 1) // 2 == m["n_pairs"] and (mc.p_adjusted >= mc.pvalue - 1e-12).all()
    fl = pd.read_csv(out / "injection.csv")
    assert {"instruction", "control"} <= set(fl.copies)
    io = fl[(fl.method == "TRACE memeworld-clip_image_only [OCR text only]") & (fl.copies == "instruction")]
    assert len(io) == 1 and io.flip_rate.iloc[0] == 0.0
    # several copies of one meme are one cluster: TRACE's rows resample memes, one-copy rows use Wilson
    trace_rows = fl[fl.method.str.startswith("TRACE") & fl.flip_rate.notna() & (fl.copies == "instruction")]
    assert (trace_rows.ci == "cluster").all() and (trace_rows.n_memes_called_hateful < trace_rows.n_called_hateful).all()
    llm_rows = fl[~fl.method.str.startswith("TRACE") & fl.flip_rate.notna()]
    assert (llm_rows.ci == "wilson").all()
    back = datasets.load("injection", out / "injection" / "llm").records
    assert len(back) == m["n_injected_llm"] and all(r.label == 1 for r in back)
    for name in ("evaluation_accuracy_forest", "evaluation_per_type", "evaluation_mcnemar", "evaluation_injection",
                 "evaluation_error_gallery", "trace_seeds"):
        assert (ARTIFACTS_ROOT.parent / "figures" / "embedded" / f"{name}.png").exists()


def test_every_figure_redraws_from_artifacts_alone(tmp_path):
    """Notebook 07's promise: with every model loader and dataset loader made to fail, all figures
    whose artifacts exist are redrawn in under a minute, and the index lists only files that exist."""
    import re
    import subprocess
    import sys
    script = r'''
import sys, time
import torch, transformers
import lib.agents, lib.chat, lib.data_prep, lib.datasets, lib.encoders, lib.serve
def refuse(*a, **k):
    raise RuntimeError("a model or a dataset was loaded while redrawing figures")
for mod, name in ((lib.encoders, "load_encoder"), (lib.chat, "load_chat"), (lib.serve, "serve"),
                  (lib.agents, "agent_chat"), (lib.datasets, "load"), (lib.data_prep, "load_prepared"),
                  (torch, "load")):
    setattr(mod, name, refuse)
transformers.PreTrainedModel.from_pretrained = classmethod(lambda cls, *a, **k: refuse())
from lib import figures
t0 = time.time()
rows = figures.redraw_all("embedded", progress=False, root=sys.argv[1])
figures.write_index(rows, ("embedded",), root=sys.argv[1])
print("ELAPSED", time.time() - t0, "DRAWN", sum(r["status"] == "drawn" for r in rows), "OF", len(rows))
for r in rows:
    print("ROW", r["name"], r["status"])
'''
    from lib import figures
    expected = {f.name for f in figures.available("embedded")}
    if not expected:
        pytest.skip("no artifacts yet (make reproduce)")
    r = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    elapsed = float(re.search(r"ELAPSED (\S+)", r.stdout).group(1))
    drawn = {line.split()[1] for line in r.stdout.splitlines() if line.startswith("ROW") and line.endswith("drawn")}
    assert drawn == expected and len(drawn) >= 20
    assert elapsed < 60, f"redrawing took {elapsed:.0f}s"
    index = (tmp_path / "README.md").read_text()
    links = re.findall(r"\]\((embedded/[^)]+\.png)\)", index)
    assert len(links) == len(drawn) and all((tmp_path / l).exists() and (tmp_path / l.replace(".png", ".pdf")).exists()
                                            for l in links)
