"""TRACE's precondition on the components: linear probes on the frozen encoder's embeddings with and without
the captions' (lib.trace.probe): a caption that carries the target shows as a gain, one that does not as none."""
import numpy as np
import pytest

from lib.trace.probe import ProbeError, probe_metrics, probe_table


def _world(n=400, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    recs = [{"id": str(i), "split": "train" if i < n * 3 // 4 else "test_seen"} for i in range(n)]
    noise = lambda: rng.normal(size=(n, 8))                                     # noqa: E731
    cue = noise()
    cue[:, 0] += 3.0 * (2 * y - 1)                                             # a caption that states the label
    feats = {"image": noise(), "text": noise(), "vlm_caption": noise(), "cue_caption": cue}
    return feats, recs, {str(i): int(v) for i, v in enumerate(y)}


def test_a_caption_that_states_the_target_gains_and_one_that_does_not_does_not():
    feats, recs, labels = _world()
    table, gains, items = probe_table(feats, recs, {"label": labels}, columns=["cue_caption"])
    assert gains["label"]["difference"] > 0.3 and gains["label"]["ci_difference"][0] > 0 and gains["label"]["p"] < 1e-6
    assert list(table["features"]) == ["image + meme text", "image + meme text + captions", "gain from the captions"]
    assert table["n"].iloc[0] == 100
    table2, gains2, items2 = probe_table(feats, recs, {"label": labels}, columns=["vlm_caption"])
    assert abs(gains2["label"]["difference"]) < 0.1 and gains2["label"]["p"] > 0.01     # noise captions: no gain
    import pandas as pd
    both = pd.concat([items.assign(captions="cue"), items2.assign(captions="captions")])
    both["correct"] = both["correct"].astype(str)                              # as read back from the csv
    m = probe_metrics(both)
    assert m["probe_cue_label_gain"] == round(gains["label"]["difference"], 6) and m["probe_cue_label_n"] == 100
    assert m["probe_captions_label_p"] == gains2["label"]["p"]
    assert {k.rsplit("_", 1)[-1] for k in m} == {"gain", "low", "high", "p", "n"}


def test_a_probe_without_its_inputs_names_what_is_missing():
    feats, recs, labels = _world(40)
    del labels["35"]
    with pytest.raises(ProbeError, match="'label'.*'35'"):
        probe_table(feats, recs, {"label": labels}, columns=["vlm_caption"])
    with pytest.raises(ProbeError, match="split"):
        probe_table(feats, [dict(r, split="train") for r in recs], {"label": labels}, columns=["vlm_caption"])


def test_embed_sources_names_the_record_and_field_it_lacks(tmp_path):
    from lib.trace.probe import embed_sources
    recs = [{"id": "7", "img": str(tmp_path / "7.png")}]
    with pytest.raises(ProbeError, match=r"record 0 \(id '7'\).*'text'"):
        embed_sources("memeworld-clip", recs, ["vlm_caption"], tmp_path / "e.npz")
