"""CLIP4DM's claims table (notebook 03): weighted AP equals sklearn's, the paired bootstrap over images, the
planted positive control and the verdicts it feeds, and the findings table's reading of it."""
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
    assert better["mdd"] == pytest.approx(c4.MDD_Z * better["se"])
    with pytest.raises(ValueError, match="both originals and foils"):
        c4.paired_ap_test([1, 2], [2, 1], [True, True], [0, 1])


def test_the_planted_control_moves_only_foils_and_gains_the_target_ap():
    f = _results(400)
    y = f["is_foil"].to_numpy(bool)
    s = f["clip_score"].to_numpy(float)
    out, lam = c4.planted(s, y, 0.072)
    base = average_precision_score(~y, s)
    assert average_precision_score(~y, out) - base == pytest.approx(0.072, abs=5e-4) and lam > 0
    assert (out[~y] == s[~y]).all() and (out[y] <= s[y]).all()
    with pytest.raises(ValueError, match="out of reach"):
        c4.planted(s, y, 1 - base + 0.01)


def test_claims_table_verdicts_follow_the_control_and_the_findings_read_claim_rows_only(tmp_path, monkeypatch):
    from lib.compendium import results
    claim = c4.CLIP4DM_CLAIMS[0]                                   # F-CLIPScore vs CLIPScore on nocaps-FOIL
    stage = tmp_path / "03_clip4dm"
    stage.mkdir()
    _results(900, gain=0.0).to_csv(stage / "results_nocaps_foil.csv", index=False)
    t = c4.claim_table(stage, [claim], resamples=300)
    assert list(t["role"]) == ["control", "claim"] and t["n"].tolist() == [1800, 1800]
    assert t.loc[0, "A-B"] == pytest.approx(claim.paper.value, abs=1e-3) and t.loc[0, "verdict"] == "control detected"
    assert t.loc[1, "control"] == "detected" and t.loc[1, "A-B"] < 0      # noise added: F-CLIPScore is worse
    assert t.loc[1, "verdict"] == "not reproduced"
    m = c4.claim_metrics(t)
    assert m["claims_detected_controls"] == 1 and m["claim_1_n"] == 1800 and m["control_1_p"] < 0.05

    _results(900, gain=2.0, seed=1).to_csv(stage / "results_nocaps_foil.csv", index=False)   # foils pushed down
    t = c4.claim_table(stage, [claim], resamples=300)
    assert t.loc[1, "A-B"] > 0 and t.loc[1, "verdict"] == "reproduced"
    t.to_csv(stage / "claims.csv", index=False)
    monkeypatch.setattr("lib.compendium.findings.results_dir", lambda profile: tmp_path)
    rows = [r for r in results.findings_rows("embedded") if r["system"] == "CLIP4DM"]
    assert [r["claim"] for r in rows] == [claim.claim] and rows[0]["verdict"] == "reproduced"
    assert rows[0]["n"] == "1800 captions of 900 images" and rows[0]["paper"].startswith("+0.072 (nocaps ablation")
