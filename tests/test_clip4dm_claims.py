"""CLIP4DM's claims table (notebook 03): weighted AP equals sklearn's, the paired bootstrap over images, the
oracle-attribution control beside each claim, and the findings table's verdict from it."""
import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import average_precision_score

from lib.clip4dm import claims as c4


def _results(n_images=600, gain=0.0, seed=0):
    """A results_nocaps_foil.csv of `n_images` images, each scored as foil and as original: CLIPScore
    separates them a little; F-CLIPScore is CLIPScore with foils pushed down by `gain` (in score units, 0:
    no help) plus noise; the attribution sum is noise (it helps nothing)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n_images):
        for kind in ("foil", "orig"):
            foil = kind == "foil"
            clip = rng.normal(1.0 - 0.25 * foil, 0.5)
            rows.append({"id": f"{i}_{kind}", "domain": "in-domain", "is_foil": foil, "clip_score": clip,
                         "f_clipscore": clip - gain * foil * rng.uniform() + rng.normal(0, 0.3),
                         "sum_negative_attribution": rng.normal(0, 1)})
    return pd.DataFrame(rows)


def test_weighted_average_precision_equals_sklearn_with_ties_and_weight_rows():
    rng = np.random.default_rng(3)
    s = np.round(rng.normal(size=400), 1)                       # many ties
    y = rng.random(400) < 0.4
    w = rng.integers(0, 4, size=(5, 400))
    w[:, 0] = 1
    got = c4.weighted_average_precision(s, y, w)
    for k in range(5):
        assert got[k] == pytest.approx(average_precision_score(y, s, sample_weight=w[k]), abs=1e-12)
    assert c4.weighted_average_precision(s, y, np.ones(400)) == pytest.approx(average_precision_score(y, s), abs=1e-12)


def test_the_paired_bootstrap_resamples_images_and_reads_no_difference_as_none():
    f = _results(300)
    y, g = ~f["is_foil"].to_numpy(bool), c4.image_groups(f, "nocaps_foil")
    assert g.max() + 1 == 300 and (g[0::2] == g[1::2]).all()            # a foil and its original are one unit
    same = c4.paired_ap_test(f["clip_score"], f["clip_score"], y, g, resamples=200)
    assert same["difference"] == 0 and same["p"] == 1.0 and same["images"] == 300
    better = c4.paired_ap_test(f["clip_score"] + 3 * y, f["clip_score"], y, g, resamples=200)   # originals on top
    assert better["difference"] > 0.2 and better["p"] <= 2 / 201 and better["ci_difference"][0] > 0
    # the simulated MDD (the centred resamples' quantiles) is about the normal one for a near-normal bootstrap
    assert better["mdd"] == pytest.approx(c4.MDD_Z * better["se"], rel=0.15)
    boot = np.random.default_rng(0).normal(0, 0.01, 200_000)
    assert c4.mdd_from_resamples(boot) == pytest.approx(c4.MDD_Z * 0.01, rel=0.01)
    with pytest.raises(ValueError, match="both originals and foils"):
        c4.paired_ap_test([1, 2], [2, 1], [True, True], [0, 1])


def test_the_oracle_control_reads_the_swap_positions_attribution_and_never_the_labels():
    """The control scores every caption (foil and original alike) from CLIP4DM's attribution at the pair's swap
    position, through the F-CLIPScore formula: the label column does not enter it."""
    f = _results(200)
    f["swap_attribution"] = np.random.default_rng(4).normal(-0.1, 0.2, len(f))
    s = c4.oracle_score(f, "f_clipscore")
    neg = np.minimum(f["swap_attribution"].to_numpy(), 0)
    assert s == pytest.approx(neg * (1 - f["clip_score"].to_numpy() / 2.5))
    flipped = f.assign(is_foil=~f["is_foil"])
    assert (c4.oracle_score(flipped, "f_clipscore") == s).all()
    assert (c4.oracle_score(f, "sum_negative_attribution") == neg).all()
    assert c4.oracle_score(f.drop(columns="swap_attribution"), "f_clipscore") is None
    assert c4.oracle_score(f, "clip_score") is None


def test_claims_table_puts_the_oracle_control_beside_each_claim_and_the_findings_give_the_verdict(tmp_path, monkeypatch,
                                                                                                   plan_at):
    from lib.compendium import results
    claim = c4.CLIP4DM_CLAIMS[0]                                   # F-CLIPScore vs CLIPScore on nocaps-FOIL
    plan_at(1800)                                                  # 900 images: 1,800 captions, as the plan's n
    stage = tmp_path / "03_clip4dm"
    stage.mkdir()
    f = _results(900, gain=0.0)
    # the attribution at the swap position is lower on the foil caption (where the foil word is)
    f["swap_attribution"] = np.where(f["is_foil"], -0.6, 0.0) + np.random.default_rng(2).normal(0, 0.2, len(f))
    f.to_csv(stage / "results_nocaps_foil.csv", index=False)
    t = c4.claim_table(stage, [claim], resamples=2000)
    assert len(t) == 1 and "verdict" not in t.columns
    r = t.iloc[0]
    assert (r["n"], r["images"], r["role"]) == (1800, 900, "primary") and r["A-B"] < 0   # noise: F-CLIPScore worse
    assert r["control"] == "oracle F-CLIPScore vs CLIPScore" and r["control status"] == "detected"
    assert r["control A-B"] > 0.05 and r["test"] == "paired bootstrap over images (2000 resamples)"
    assert "simulated" in r["MDD rule"] and r["design MDD"] > 0
    m = c4.claim_metrics(t)
    assert m["claims_detected_controls"] == 1 and m["claim_nocaps_fclip_n"] == 1800 and m["control_nocaps_fclip_p"] < 0.05
    assert not any(k.startswith(("claim_1", "control_1")) for k in m)           # keyed by the plan's id
    # attributions that carry nothing at the swap position: the control says the pipeline cannot show it
    f["swap_attribution"] = np.random.default_rng(3).normal(0, 0.2, len(f))
    f.to_csv(stage / "results_nocaps_foil.csv", index=False)
    r2 = c4.claim_table(stage, [claim], resamples=2000).iloc[0]
    assert r2["control status"].startswith("not detected") and r2["A-B"] == r["A-B"] and r2["p"] == r["p"]

    g = _results(900, gain=2.0, seed=1)                                           # foils pushed down
    g.to_csv(stage / "results_nocaps_foil.csv", index=False)
    t = c4.claim_table(stage, [claim], resamples=2000)
    assert t.iloc[0]["A-B"] > 0 and t.iloc[0]["control"] == "the results hold no swap-position attribution"
    t.to_csv(stage / "claims.csv", index=False)
    monkeypatch.setattr("lib.compendium.findings.results_dir", lambda profile: tmp_path)
    rows = [r for r in results.findings_rows("embedded") if r["system"] == "CLIP4DM" and r["verdict"] != "not run"]
    assert [r["claim"] for r in rows] == [claim.claim] and rows[0]["verdict"] == "reproduced"
    assert rows[0]["n"] == "1800 captions of 900 images" and rows[0]["paper"].startswith("+0.072 (nocaps ablation")

@pytest.mark.parametrize("profile", ["embedded", "paper"])
def test_the_published_profiles_resample_enough_for_the_corrected_threshold(profile):
    """A bootstrap p can be no smaller than 2 / (resamples + 1): the profiles that publish findings resample at least
    10,000 times, so a p can pass Holm's smallest threshold across the plan's family."""
    from lib.compendium.params import load_profile
    from lib.evaluation import plan as analysis
    n = load_profile(profile)["03_clip4dm"]["claim_resamples"]
    plan = analysis.load()
    family = sum(c.role == "primary" for c in plan.claims)
    assert n >= c4.RESAMPLES and 2 / (n + 1) < plan.alpha / family
