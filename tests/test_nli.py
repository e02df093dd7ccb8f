"""memeworld-nli: pairs from scene facts, a cross-encoder trained on them, loaded like bart-large-mnli."""
import json

import numpy as np
import pytest

from lib.models import nli


def test_pairs_are_balanced_and_labelled_by_what_the_premise_says(memeworld_small):
    from lib.data.memeworld import load_specs
    out, _ = memeworld_small
    rows = [r for r in load_specs(out) if r["split"] == "train"][:200]
    pairs = nli.nli_pairs(rows, np.random.default_rng(0))
    assert len(pairs) > 300
    assert 0.4 < np.mean([y for *_, y in pairs]) < 0.6
    for prem, hyp, y in pairs:
        inside = f" {hyp} " in f" {prem} "
        assert inside == (y == 1), (prem, hyp, y)          # entailed exactly when the premise states it
        assert hyp.split()[0] not in nli.FUNCTION_WORDS and hyp.split()[-1] not in nli.FUNCTION_WORDS


def test_a_tiny_run_trains_saves_and_loads_through_the_seetrue_path(memeworld_small, tmp_path):
    from lib.clip4dm.method import nli_entailment
    out, _ = memeworld_small
    cfg = nli.NliConfig(epochs=1, train_memes=120, heldout_memes=40, batch_size=16)
    res = nli.train_memeworld_nli(out, tmp_path / "nli", cfg, progress=False)
    m = res["metrics"]
    assert 0.0 <= m["nli_heldout_acc"] <= 1.0 and m["nli_heldout_pairs"] > 40 and m["nli_train_pairs"] > 200
    cfgjson = json.loads((tmp_path / "nli" / "config.json").read_text())
    assert cfgjson["id2label"] == {"0": "contradiction", "1": "entailment"}
    p = nli_entailment(["blue cup", "blue cup"], ["blue cup", "red sun"], str(tmp_path / "nli"))
    assert p.shape == (2,) and ((0 <= p) & (p <= 1)).all()
    saved = json.loads((tmp_path / "nli" / "training.json").read_text())
    assert saved["metrics"]["nli_heldout_acc"] == m["nli_heldout_acc"]
    # notebook 03 reports it beside the SeeTRUE score, with the score's two controls
    from lib.clip4dm import report as c4r
    from lib.data.prep import load_all
    assert c4r.nli_heldout_accuracy(str(tmp_path / "nli")) == m["nli_heldout_acc"]
    assert c4r.nli_heldout_accuracy(str(tmp_path)) is None
    recs = load_all({"seetrue": {"root": str(out / "seetrue"), "img_dir": "../img"}})["seetrue"].records[:12]
    ctrl = c4r.seetrue_controls(recs, str(tmp_path / "nli"))
    assert set(ctrl) == {"seetrue_nli_oracle", "seetrue_nli_random_word"}
    assert all(0 <= v <= 1 for v in ctrl.values())
    want = np.mean(nli_entailment([r.misaligned_words[0] for r in recs], [r.misaligned_words[0] for r in recs],
                                  str(tmp_path / "nli")))
    assert ctrl["seetrue_nli_oracle"] == pytest.approx(want)


def test_a_three_label_mnli_folder_loads_through_the_same_code(tmp_path):
    """bart-large-mnli's layout (contradiction / neutral / entailment, a BART classifier) from a
    local folder: neutral is dropped, P(entailment) is over the other two."""
    import torch
    from transformers import AutoTokenizer, BartConfig, BartForSequenceClassification
    from lib.clip4dm.method import nli_entailment
    from lib.evaluation.textmetrics import resolve_text_model
    cfg = BartConfig(vocab_size=30522, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                     decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64,
                     num_labels=3, id2label={0: "contradiction", 1: "neutral", 2: "entailment"},
                     label2id={"contradiction": 0, "neutral": 1, "entailment": 2}, pad_token_id=0,
                     bos_token_id=101, eos_token_id=102, decoder_start_token_id=102)
    torch.manual_seed(0)
    model = BartForSequenceClassification(cfg).eval()
    model.save_pretrained(tmp_path / "mnli")
    AutoTokenizer.from_pretrained(resolve_text_model("minilm")).save_pretrained(tmp_path / "mnli")
    prem, hyp = ["blue cup", "red sun on the left"], ["cup", "green"]
    p = nli_entailment(prem, hyp, str(tmp_path / "mnli"))
    tok = AutoTokenizer.from_pretrained(tmp_path / "mnli")
    with torch.no_grad():
        logits = model(**tok(prem, hyp, padding=True, return_tensors="pt")).logits
    want = torch.softmax(logits[:, [2, 0]], -1)[:, 0].numpy()
    assert np.allclose(p, want, atol=1e-6)
