"""CLIP4DM on a tiny randomly initialised Hugging Face CLIP: the seed README's interface,
the attribution recipe checked against an independent computation, batched == one pair,
the speed-up, the selection rules, the scores and the benchmark metrics."""
import numpy as np
import pytest
import torch
from PIL import Image

from lib.clip4dm import (CLIP4DM, average_precision, benchmark, evaluate_foil, evaluate_hat, f_clipscore,
                         localization_accuracy, predicted_phrases, ref_clipscore, words_with_spans)
from lib.datasets import AlignmentRecord

CAPTIONS = ["a cup of coke", "a red sun on the left, and a blue house.", "zorblin",
            "a green tree in the middle and a crossed-out spiral sigil on the right"]


def _imgs(n, seed=0):
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)) for _ in range(n)]


@pytest.fixture(scope="module")
def model(tiny_clip_dir):
    return CLIP4DM.from_pretrained(tiny_clip_dir, device="cpu", epsilon=0.0)


def test_output_has_the_seed_readme_keys_and_words(model):
    r = model(_imgs(1)[0], "a cup of coke")
    assert set(r) == {"negative_word", "sum_negative_attribution", "negative_word_score_list", "clip_score",
                      "word_attributions"}
    assert [w for w, _ in r["word_attributions"]] == ["a", "cup", "of", "coke"]   # template words dropped
    assert 0.0 <= r["clip_score"] <= 2.5
    kept = [s for _, s in r["word_attributions"] if s < 0.0]
    assert r["sum_negative_attribution"] == pytest.approx(sum(kept))
    assert r["negative_word_score_list"] == sorted(kept)
    if kept:
        i = min(range(4), key=lambda j: r["word_attributions"][j][1])
        assert r["negative_word"] == f"{i}_{r['word_attributions'][i][0]}"


def test_punctuation_is_its_own_word_and_never_selected(model):
    r = model(_imgs(1)[0], "a red sun on the left, and a blue house.")
    words = [w for w, _ in r["word_attributions"]]
    assert words == ["a", "red", "sun", "on", "the", "left", ",", "and", "a", "blue", "house", "."]
    assert r["negative_word"] is None or r["negative_word"].split("_", 1)[1] not in {",", "."}


def test_attribution_matches_an_independent_computation(model):
    """grad x attention at the EOT row, mean over heads and the last 3 layers, via retain_grad."""
    enc = model.encoder
    img, cap = _imgs(1)[0], "a green tree in the middle"
    text = model.template + cap
    tok = enc.tokenizer([text], return_tensors="pt")
    with torch.no_grad():
        ie = enc.model.get_image_features(**enc.processor(images=[img], return_tensors="pt")).pooler_output
    out = enc.model.text_model(**tok, output_attentions=True)
    atts = out.attentions
    for a in atts:
        a.retain_grad()
    te = enc.model.text_projection(out.pooler_output)
    torch.nn.functional.cosine_similarity(ie, te).sum().backward()
    eot = int(tok["input_ids"][0].argmax())
    R = torch.stack([(a.grad * a).mean(1)[0] for a in atts[-3:]]).mean(0)
    ref = R[eot, 1:eot].detach().numpy()
    scores, _, sims, _ = model.token_scores([img], [cap])
    np.testing.assert_allclose(scores[0], ref, rtol=1e-5, atol=1e-7)
    assert sims[0] == pytest.approx(float(torch.nn.functional.cosine_similarity(ie, te).detach()), abs=1e-6)
    # the template's 3 words take the first tokens; a word's score is the mean of its tokens
    r = model(img, cap)
    n_tpl = len(enc.tokenizer("A photo depicts", add_special_tokens=False)["input_ids"])
    assert r["word_attributions"][0][1] == pytest.approx(float(ref[n_tpl]), abs=1e-7)


def test_batched_equals_one_pair_and_is_faster(model):
    imgs = _imgs(64, seed=1)
    caps = [CAPTIONS[i % 4] + (" again" * (i % 3)) for i in range(64)]
    res = benchmark(model, imgs, caps, batch_size=32)
    assert res.max_abs_diff < 1e-5
    assert res.speedup >= 5.0, res


def test_most_negative_picks_the_single_lowest_word(tiny_clip_dir):
    m = CLIP4DM.from_pretrained(tiny_clip_dir, device="cpu", sorted_by="most_negative")
    r = m(_imgs(1)[0], "a cup of coke")
    low = min(r["word_attributions"], key=lambda x: x[1])
    assert r["negative_word"].endswith("_" + low[0]) and r["sum_negative_attribution"] == low[1]
    assert f_clipscore(r) == pytest.approx(low[1] * (1 - r["clip_score"] / 2.5))


def test_open_clip_and_bad_parameters_are_refused_clearly(tiny_clip_dir):
    import open_clip
    from lib.encoders import AttentionUnavailable, OpenClipEncoder
    oc = open_clip.CLIP(embed_dim=16, vision_cfg=dict(image_size=32, patch_size=8, width=32, layers=1, head_width=16),
                        text_cfg=dict(context_length=77, vocab_size=49408, width=32, heads=2, layers=1))
    with pytest.raises(AttentionUnavailable, match="open_clip"):
        CLIP4DM(OpenClipEncoder(oc, open_clip.get_tokenizer("ViT-B-32"), None))
    with pytest.raises(ValueError, match="sorted_by"):
        CLIP4DM.from_pretrained(tiny_clip_dir, device="cpu", sorted_by="lowest")


def test_refclipscore_max_over_references_vs_first_only(model):
    img = _imgs(1)
    refs = [["zorblin", "a cup of coke"]]
    full = ref_clipscore(model, img, ["a cup of coke"], refs)
    first = ref_clipscore(model, img, ["a cup of coke"], refs, first_reference_only=True)
    assert full[0] >= first[0] - 1e-9      # the max over references can only help


def _res(words, clip_score=1.0, neg=None):
    attrs = list(words)
    named = [(f"{i}_{w}", s) for i, (w, s) in enumerate(attrs) if w not in ".,"]
    low = min(named, key=lambda x: x[1])
    return {"negative_word": neg if neg is not None else low[0], "sum_negative_attribution": low[1],
            "negative_word_score_list": [low[1]], "clip_score": clip_score, "word_attributions": attrs}


def test_foil_metrics_on_known_results():
    recs = [AlignmentRecord("1", None, "a red dog", ["dog"]), AlignmentRecord("2", None, "a red cat", []),
            AlignmentRecord("3", None, "a blue car", ["blue"]), AlignmentRecord("4", None, "a blue car", [])]
    res = [_res([("a", 0.1), ("red", 0.0), ("dog", -0.5)], 0.5), _res([("a", 0.1), ("red", 0.0), ("cat", -0.01)], 0.9),
           _res([("a", -0.3), ("blue", -0.1), ("car", 0.2)], 0.6), _res([("a", 0.0), ("blue", -0.02), ("car", 0.1)], 0.8)]
    m = evaluate_foil(res, recs)
    assert m["la"] == 0.5 and m["la_chance"] == pytest.approx(1 / 3)
    assert m["ap_clipscore"] == 1.0 and m["ap_fclipscore"] == 1.0
    assert localization_accuracy([{"negative_word": None}], ["dog"]) == 0.0
    assert average_precision([0.1, 0.9], [False, True]) == 1.0


def test_hat_phrases_merge_adjacent_flagged_words():
    r = _res([("a", 0.1), ("big", -0.2), ("red", -0.3), ("dog", 0.1), (".", -0.9)])
    ph = predicted_phrases(r, epsilon=0.0)
    assert ph == [([1, 2], -0.3)]
    rec = AlignmentRecord("h", None, "a big red dog.", ["big", "red"],
                          token_labels=[("a", 0), ("big", 1), ("red", 1), ("dog.", 0)])
    rec2 = AlignmentRecord("h2", None, "a big red dog.", ["dog"],
                           token_labels=[("a", 0), ("big", 0), ("red", 0), ("dog.", 1)])
    m = evaluate_hat([r, r], [rec, rec2], epsilon=0.0)
    assert m["hat_la"] == 0.5


def test_word_spans():
    assert [w for w, _, _ in words_with_spans("A photo depicts a dog, a cat.")] == \
        ["A", "photo", "depicts", "a", "dog", ",", "a", "cat", "."]


def test_command_line_prints_the_result_dict(tiny_clip_dir, tmp_path):
    import json
    import subprocess
    import sys
    _imgs(1)[0].save(tmp_path / "x.png")
    out = subprocess.run([sys.executable, "-m", "lib.clip4dm", "--model", str(tiny_clip_dir), "--image",
                          str(tmp_path / "x.png"), "--caption", "a cup of coke", "--device", "cpu"],
                         capture_output=True, text=True, check=True).stdout
    d = json.loads(out)
    assert [w for w, _ in d["word_attributions"]] == ["a", "cup", "of", "coke"]


def test_attribute_pairs_resumes_and_skips_a_torn_line(model, tmp_path):
    from lib.clip4dm import attribute_pairs, select
    for i, im in enumerate(_imgs(3, seed=5)):
        im.save(tmp_path / f"{i}.png")
    pairs = [(str(tmp_path / f"{i}.png"), CAPTIONS[i]) for i in range(3)]
    cache = tmp_path / "attr.jsonl"
    first = attribute_pairs(model, pairs[:2], cache, batch_size=1, progress=False)
    with open(cache, "a") as f:
        f.write('{"key": "torn')              # a crash mid-write
    calls = []
    orig = model.token_scores
    model.token_scores = lambda *a, **k: (calls.append(len(a[1])), orig(*a, **k))[1]
    try:
        again = attribute_pairs(model, pairs, cache, batch_size=8, progress=False)
    finally:
        model.token_scores = orig
    assert calls == [1]                       # only the third pair is computed
    assert again[:2] == first
    direct = model(Image.open(pairs[2][0]).convert("RGB"), CAPTIONS[2])
    sel = select(again[2], "threshold", model.epsilon)
    assert [w for w, _ in sel["word_attributions"]] == [w for w, _ in direct["word_attributions"]]
    np.testing.assert_allclose([s for _, s in sel["word_attributions"]],
                               [s for _, s in direct["word_attributions"]], atol=1e-6)
    assert sel["negative_word"] == direct["negative_word"]
    lines = cache.read_text().splitlines()
    assert len(lines) == 3 and all(l.startswith('{"key"') and l.endswith("]]}") for l in lines)
