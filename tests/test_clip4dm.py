"""CLIP4DM on a tiny randomly initialised Hugging Face CLIP: the seed README's interface,
the attribution recipe checked against an independent computation, batched == one pair,
the speed-up, the selection rules, the scores and the benchmark metrics."""
import numpy as np
import pytest
import torch
from PIL import Image

from lib.clip4dm.method import (CLIP4DM, average_precision, evaluate_foil, evaluate_hat, f_clipscore,
                                localization_accuracy, predicted_phrases, ref_clipscore, words_with_spans)
from lib.clip4dm.runs import benchmark
from lib.data.records import AlignmentRecord

CAPTIONS = ["a cup of coke", "a red sun on the left, and a blue house.", "zorblin",
            "a green tree in the middle and a crossed-out spiral sigil on the right"]


def _imgs(n, seed=0):
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)) for _ in range(n)]


@pytest.fixture(scope="module")
def model(tiny_clip_dir):
    return CLIP4DM.from_pretrained(tiny_clip_dir, device="cpu", epsilon=0.0)


OFFICIAL_KEYS = {"negative_word", "sum_negative_attribution", "negative_word_score_list", "clip_score",
                 "word_attributions"}


def test_output_has_the_seed_readme_keys_and_words(model):
    r = model(_imgs(1)[0], "a cup of coke")
    assert OFFICIAL_KEYS <= set(r)
    assert set(r) - OFFICIAL_KEYS == {"all_word_attributions", "word_positions", "lowest_word_position"}
    assert [w for w, _ in r["word_attributions"]] == ["a", "cup", "of", "coke"]   # template words dropped
    assert 0.0 <= r["clip_score"] <= 2.5
    kept = sorted([(f"{i}_{w}", s) for i, (w, s) in enumerate(r["word_attributions"]) if s < 0.0], key=lambda x: x[1])
    assert r["sum_negative_attribution"] == pytest.approx(sum(s for _, s in kept))
    assert r["negative_word_score_list"] == [s for _, s in kept]
    assert r["negative_word"] == " ".join(n for n, _ in kept)               # every kept word, ascending


def _select(sorted_by, attrs, epsilon=-0.05, positions=None):
    m = CLIP4DM.__new__(CLIP4DM)
    m.sorted_by, m.epsilon = sorted_by, epsilon
    return m._select(attrs, 0.3, positions)


def test_official_threshold_output_by_hand():
    """Threshold mode, worked by hand: "a red sun , and a blue house ." with "," -0.9 and "." -0.8.
    Punctuation is dropped before numbering, so the words are 0 a, 1 red, 2 sun, 3 and, 4 a,
    5 blue, 6 house; kept below -0.05: blue (-0.3), red (-0.2), sun (-0.1), ascending."""
    attrs = [("a", 0.1), ("red", -0.2), ("sun", -0.1), (",", -0.9), ("and", 0.0), ("a", 0.2), ("blue", -0.3),
             ("house", 0.05), (".", -0.8)]
    r = _select("threshold", attrs)
    assert r["negative_word"] == "5_blue 1_red 2_sun"
    assert r["sum_negative_attribution"] == pytest.approx(-0.6)
    assert r["negative_word_score_list"] == [-0.3, -0.2, -0.1]
    assert [w for w, _ in r["word_attributions"]] == ["a", "red", "sun", "and", "a", "blue", "house"]
    assert r["clip_score"] == pytest.approx(0.75)
    none = _select("threshold", [("a", 0.1), (".", -0.9)])
    assert none["negative_word"] == "" and none["sum_negative_attribution"] == 0 and none["negative_word_score_list"] == []


def test_official_most_negative_output_by_hand():
    """most_negative: the bare lowest word, punctuation a candidate like any word, an empty score
    list; the position-exact key points at the lowest real word."""
    attrs = [("a", 0.1), ("red", -0.2), ("sun", -0.1), (",", -0.9), ("and", 0.0), ("a", 0.2), ("red", -0.3)]
    r = _select("most_negative", attrs, positions=[0, 1, 2, 3, 4, 5, 6])
    assert r["negative_word"] == "," and r["sum_negative_attribution"] == -0.9
    assert r["negative_word_score_list"] == [] and [w for w, _ in r["word_attributions"]] == [w for w, _ in attrs]
    assert r["lowest_word_position"] == 6                                    # the second "red", not the first
    assert f_clipscore(r) == pytest.approx(-0.9 * (1 - 0.75 / 2.5))


def test_punctuation_is_its_own_word(model):
    r = model(_imgs(1)[0], "a red sun on the left, and a blue house.")
    words = [w for w, _ in r["all_word_attributions"]]
    assert words == ["a", "red", "sun", "on", "the", "left", ",", "and", "a", "blue", "house", "."]
    assert r["word_positions"] == list(range(12))
    assert "," not in [w for w, _ in r["word_attributions"]]                 # threshold mode drops it
    assert all(not n.split("_", 1)[1] in {",", "."} for n in r["negative_word"].split())


@pytest.mark.parametrize("layers", [3, 2, 1])
def test_attribution_matches_an_independent_computation(model, layers):
    """grad x attention at the EOT row, mean over heads and the last `layers` layers, via
    retain_grad on the plain full forward; one caption alone and the same caption padded in a
    batch beside a longer one (the fast path skips gradients below the attributed layers and
    runs the last layer at the EOT query only)."""
    enc = model.encoder
    m = CLIP4DM(enc, start_layer_text=-layers, epsilon=0.0)
    img, cap = _imgs(1)[0], "a green tree in the middle"
    text = m.template + cap
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
    R = torch.stack([(a.grad * a).mean(1)[0] for a in atts[-layers:]]).mean(0)
    ref = R[eot, 1:eot].detach().numpy()
    scores, _, sims, _ = m.token_scores([img], [cap])
    np.testing.assert_allclose(scores[0], ref, rtol=1e-5, atol=1e-7)
    assert sims[0] == pytest.approx(float(torch.nn.functional.cosine_similarity(ie, te).detach()), abs=1e-6)
    padded, _, psims, _ = m.token_scores([img, img], [cap, cap + " and a blue house on the right, again"])
    np.testing.assert_allclose(padded[0], ref, rtol=1e-5, atol=1e-7)
    assert psims[0] == pytest.approx(sims[0], abs=1e-6)
    # the template's 3 words take the first tokens; a word's score is the mean of its tokens
    r = m(img, cap)
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
    assert r["negative_word"] == low[0] and r["sum_negative_attribution"] == low[1]
    assert f_clipscore(r) == pytest.approx(low[1] * (1 - r["clip_score"] / 2.5))


def test_open_clip_and_bad_parameters_are_refused_clearly(tiny_clip_dir):
    import open_clip
    from lib.models.encoders import AttentionUnavailable, OpenClipEncoder
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


def _res(words, clip_score=1.0, sorted_by="most_negative", epsilon=0.0):
    m = CLIP4DM.__new__(CLIP4DM)
    m.sorted_by, m.epsilon = sorted_by, epsilon
    r = m._select(list(words), 0.0)
    r["clip_score"] = clip_score
    return r


def test_foil_metrics_on_known_results():
    """LA is position-exact: in record 5 the foil word "red" occurs twice and the lowest word is the
    first "red", which was not swapped: the official string comparison counts it, LA does not."""
    recs = [AlignmentRecord("1", None, "a red dog", ["dog"], misaligned_positions=[2]),
            AlignmentRecord("2", None, "a red cat", []),
            AlignmentRecord("3", None, "a blue car", ["blue"], misaligned_positions=[1]),
            AlignmentRecord("4", None, "a blue car", []),
            AlignmentRecord("5", None, "a red cup and a red hat", ["red"], misaligned_positions=[5])]
    res = [_res([("a", 0.1), ("red", 0.0), ("dog", -0.5)], 0.5), _res([("a", 0.1), ("red", 0.0), ("cat", -0.01)], 0.9),
           _res([("a", -0.3), ("blue", -0.1), ("car", 0.2)], 0.6), _res([("a", 0.0), ("blue", -0.02), ("car", 0.1)], 0.8),
           _res([("a", 0.1), ("red", -0.4), ("cup", 0.0), ("and", 0.0), ("a", 0.0), ("red", -0.1), ("hat", 0.0)], 0.4)]
    m = evaluate_foil(res, recs)
    assert m["la"] == pytest.approx(1 / 3) and m["la_official_string"] == pytest.approx(2 / 3)
    assert m["n_repeated_foil_word"] == 1 and m["n_foil"] == 3
    assert m["ap_clipscore"] == 1.0
    # chance: any word 1/3, 1/3, 1/7; content words only (the foil is always one): 1/2, 1/2, 1/4
    assert m["la_chance"] == pytest.approx((1 / 3 + 1 / 3 + 1 / 7) / 3)
    assert m["la_chance_content"] == pytest.approx((1 / 2 + 1 / 2 + 1 / 4) / 3)
    assert localization_accuracy([{"negative_word": ""}], ["dog"]) == 0.0
    assert average_precision([0.1, 0.9], [False, True]) == 1.0


def test_hat_official_phrases_merge_across_punctuation_and_score_by_mean():
    r = _res([("a", 0.1), ("big", -0.2), ("red", -0.4), (",", 0.3), ("dog", -0.3), ("on", 0.1), ("grass", -0.1)])
    ph = predicted_phrases(r, epsilon=0.0)
    assert [(p, t) for p, _, t in ph] == [([1, 2, 4], "big red dog"), ([6], "grass")]
    assert ph[0][1] == pytest.approx(-0.3) and ph[1][1] == pytest.approx(-0.1)
    assert [t for _, _, t in predicted_phrases(r, 0.0, merge_across_punctuation=False)] == ["big red", "dog", "grass"]


def test_hat_metrics_official_and_position_exact():
    """The lowest phrase is "red" (alone, -0.5). Record A flags the "red" at position 4 (the second
    one): the official substring test counts a hit, the position-exact variant does not. Record B
    has no word below epsilon: no fallback, a miss, and 0 as its AP score."""
    ra = _res([("a", 0.1), ("red", -0.5), ("cup", 0.2), ("and", 0.1), ("red", 0.3), ("hat", 0.1)])
    rb = _res([("a", 0.1), ("cat", 0.2)])
    ro = _res([("a", 0.1), ("dog", -0.01)])
    recs = [AlignmentRecord("A", None, "a red cup and red hat", ["red hat"],
                            token_labels=[("a", 0), ("red", 0), ("cup", 0), ("and", 0), ("red", 1), ("hat", 1)],
                            misaligned_positions=[4, 5]),
            AlignmentRecord("B", None, "a cat", ["cat"], token_labels=[("a", 0), ("cat", 1)], misaligned_positions=[1]),
            AlignmentRecord("O", None, "a dog", [], token_labels=[("a", 0), ("dog", 0)])]
    m = evaluate_hat([ra, rb, ro], recs, epsilon=0.0)
    assert m["hat_la"] == 0.5 and m["hat_la_position_exact"] == 0.0 and m["hat_n_misaligned"] == 2
    # AP on -lowest phrase score: A 0.5, B 0.0, O 0.01 -> ranking A, O, B; positives A, B: AP = (1 + 2/3) / 2
    assert m["hat_ap"] == pytest.approx((1 + 2 / 3) / 2)


def test_richhf_correlations_and_position_tokens():
    from lib.clip4dm.method import evaluate_richhf
    recs = [AlignmentRecord(str(i), None, "a red cup", ["red"] if i else [], misaligned_positions=[1] if i else [],
                            score=float(i)) for i in range(4)]
    res = [_res([("a", 0.1), ("red", v), ("cup", 0.1)], sorted_by="threshold", epsilon=-0.05)
           for v in (0.0, -0.03, -0.2, -0.3)]                                 # "red" at -0.03 is not below epsilon
    m = evaluate_richhf(res, recs, epsilon=-0.05)
    assert m["richhf_spearman_neg_attribution"] > 0.9 and m["richhf_pearson_neg_attribution"] > 0.9  # sign: + = expected
    assert m["richhf_precision"] == 1.0 and m["richhf_recall"] == pytest.approx(2 / 3)


def test_seetrue_scores_every_phrase_with_entailment_over_contradiction(tmp_path):
    """A stub NLI model with fixed logits (entailment 2, neutral 5, contradiction 0): the neutral
    logit is dropped, so P = e^2 / (e^2 + 1) = 0.8808 per phrase; a caption with no phrase scores 0."""
    from types import SimpleNamespace
    from lib.clip4dm.method import evaluate_seetrue

    class Stub(torch.nn.Module):
        config = SimpleNamespace(label2id={"ENTAILMENT": 0, "NEUTRAL": 1, "CONTRADICTION": 2})
        device = torch.device("cpu")

        def forward(self, input_ids=None, **kw):
            return SimpleNamespace(logits=torch.tensor([[2.0, 5.0, 0.0]]).repeat(len(input_ids), 1))

    tok = lambda a, b, **kw: SimpleNamespace(to=lambda d: {"input_ids": torch.zeros(len(a), 2, dtype=torch.long)})  # noqa: E731
    recs = [AlignmentRecord("1", None, "a red cup", ["red cup"]), AlignmentRecord("2", None, "a cat", ["cat"])]
    res = [_res([("a", 0.1), ("red", -0.2), ("cup", -0.1), ("on", 0.3), ("grass", -0.4)]), _res([("a", 0.1), ("cat", 0.2)])]
    m = evaluate_seetrue(res, recs, 0.0, (Stub(), lambda a, b, **kw: tok(a, b)))
    p = np.exp(2) / (np.exp(2) + 1)
    assert m["seetrue_nli"] == pytest.approx((p + 0.0) / 2) and m["seetrue_share_with_phrase"] == 0.5
    assert evaluate_seetrue(res, recs, 0.0, None)["seetrue_nli"] is None


def test_word_spans():
    assert [w for w, _, _ in words_with_spans("A photo depicts a dog, a cat.")] == \
        ["A", "photo", "depicts", "a", "dog", ",", "a", "cat", "."]


def test_command_line_prints_the_result_dict(tiny_clip_dir, tmp_path):
    import json
    import subprocess
    import sys
    _imgs(1)[0].save(tmp_path / "x.png")
    out = subprocess.run([sys.executable, "-m", "lib.clip4dm.method", "--model", str(tiny_clip_dir), "--image",
                          str(tmp_path / "x.png"), "--caption", "a cup of coke", "--device", "cpu"],
                         capture_output=True, text=True, check=True).stdout
    d = json.loads(out)
    assert [w for w, _ in d["word_attributions"]] == ["a", "cup", "of", "coke"]


def test_attribute_pairs_resumes_and_skips_a_torn_line(model, tmp_path):
    from lib.clip4dm.method import select
    from lib.clip4dm.runs import attribute_pairs
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
    assert sel["negative_word"] == direct["negative_word"] and sel["word_positions"] == direct["word_positions"]
    lines = cache.read_text().splitlines()
    assert len(lines) == 3 and all(l.startswith('{"key"') and l.endswith("]}") for l in lines)


def test_image_reuse_and_the_eot_row_give_the_same_scores(model, tmp_path):
    """Scoring captions against precomputed image embeddings (each image embedded once) equals the
    plain path; the floor and the reuse throughput are measured on the same pairs."""
    from lib.clip4dm.runs import floor_pairs_per_s, reuse_pairs_per_s
    imgs = _imgs(2, seed=7)
    caps = [CAPTIONS[0], CAPTIONS[1], CAPTIONS[3], CAPTIONS[0]]
    pair_imgs = [imgs[0], imgs[0], imgs[1], imgs[1]]
    a = model.token_scores(pair_imgs, caps)
    e = model.image_embeddings(imgs)
    b = model.token_scores(None, caps, image_embeds=e[[0, 0, 1, 1]])
    for x, y in zip(a[0], b[0]):
        np.testing.assert_allclose(x, y, atol=1e-7)
    np.testing.assert_allclose(a[2], b[2], atol=1e-6)
    paths = []
    for i, im in enumerate(imgs):
        im.save(tmp_path / f"{i}.png")
        paths.append(str(tmp_path / f"{i}.png"))
    assert floor_pairs_per_s(model, pair_imgs, caps, batch_size=2, repeats=1) > 0
    assert reuse_pairs_per_s(model, [paths[0], paths[0], paths[1], paths[1]], caps, batch_size=2, repeats=1) > 0


def test_ready_pixels_give_the_same_results_and_the_floor_is_timed_beside_them(model):
    """The speed benchmark's batched path takes ready pixel tensors: same outputs as from the
    images; the floor runs on the batched path's own length-sorted batches."""
    from lib.clip4dm.method import length_batches
    from lib.clip4dm.runs import floor_and_batched, ready_pixels
    imgs = _imgs(7, seed=5)
    caps = [CAPTIONS[i % 4] + " x" * i for i in range(7)]
    pix = ready_pixels(model, imgs)
    assert pix is not None and len(pix) == 7 and pix[0].ndim == 3
    a, b = model.batch(imgs, caps, batch_size=3), model.batch(pix, caps, batch_size=3)
    assert [r["word_attributions"] for r in a] == [r["word_attributions"] for r in b]
    assert [r["clip_score"] for r in a] == [r["clip_score"] for r in b]
    batches = length_batches(caps, 3)
    assert sorted(i for bt in batches for i in bt) == list(range(7)) and [len(bt) for bt in batches] == [3, 3, 1]
    lens = [len(caps[i]) for bt in batches for i in bt]
    assert lens == sorted(lens)
    floor, batched, ready = floor_and_batched(model, imgs, caps, batch_size=3, repeats=1)
    assert floor > 0 and batched > 0 and ready is True


def test_prefetching_batches_gives_the_same_results(model):
    imgs = _imgs(10, seed=3)
    caps = [CAPTIONS[i % 4] for i in range(10)]
    a = model.batch(imgs, caps, batch_size=3)
    b = model.batch(imgs, caps, batch_size=3, prefetch=True)
    assert [x["negative_word"] for x in a] == [x["negative_word"] for x in b]
    np.testing.assert_allclose([x["sum_negative_attribution"] for x in a], [x["sum_negative_attribution"] for x in b],
                               atol=1e-9)


def _perturbed_copy(src, dest, seed: int):
    """The tiny CLIP folder with every weight moved by noise: a second encoder with its own scores."""
    from transformers import CLIPModel
    m = CLIPModel.from_pretrained(src)
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.5 * torch.randn_like(p))
    m.save_pretrained(dest)
    for f in src.iterdir():
        if not f.name.startswith(("model", "config")):
            (dest / f.name).write_bytes(f.read_bytes())
    return dest


def test_several_encoders_write_their_own_files_and_sit_side_by_side(memeworld_small, tiny_clip_dir, tmp_path):
    """One run of notebook 03 over two encoders: the first writes the stage's own files, the
    second its folder; neither overwrites the other, and the side-by-side table and the keyed
    metrics name each encoder (the paper's row appears under a backbone the paper reports)."""
    import pandas as pd

    from lib.clip4dm import report as c4r
    from lib.data.prep import load_all
    root, _ = memeworld_small
    data = load_all({b: {"root": str(root / b), "img_dir": "../img"} for b in ("foil", "hat")})
    for ds in data.values():
        ds.records[:] = ds.records[:24]
    val = load_all({"hat": {"root": str(root / "hat"), "img_dir": "../img", "file": "hat_val.json"}})["hat"].records[:16]
    other = _perturbed_copy(tiny_clip_dir, tmp_path / "clip-vit-b32", seed=1)   # other weights, a name the paper reports
    out = tmp_path / "03"
    runs = {}
    for k, enc in enumerate((str(tiny_clip_dir), str(other))):
        model = CLIP4DM.from_pretrained(enc, device="cpu", epsilon=-5e-5)
        runs[enc] = c4r.run_encoder(model, enc, data, c4r.encoder_dir(out, enc, first=k == 0), epsilon=-5e-5,
                                    val_recs=val, epsilon_grid=[-1e-4, -1e-2], batch_size=8)
    first, second = runs.values()
    assert first.out_dir == out and second.out_dir == out / "clip-vit-b32"
    for r in runs.values():
        for f in ("attributions.jsonl", "results_foil.csv", "results_hat.csv", "ablation.csv", "epsilon_sweep.csv"):
            assert (r.out_dir / f).exists(), (r.encoder, f)
        saved = pd.read_csv(r.out_dir / "results_foil.csv")
        assert np.allclose(saved.clip_score, [x["clip_score"] for x in r.results("foil", "most_negative")])
    assert first.metrics["ap_clipscore"] != second.metrics["ap_clipscore"]      # the files are each encoder's own
    tab = c4r.by_encoder_frame({"tiny": first.metrics, "clip-vit-b32": second.metrics})
    assert list(tab.source) == ["this run", "this run", "paper"] and tab.iloc[2]["FOIL LA"] == 0.73
    assert tab.iloc[1]["FOIL AP (CLIPScore)"] == pytest.approx(second.metrics["ap_clipscore"])
    keyed = c4r.keyed_metrics({"tiny": first.metrics, "clip-vit-b32": second.metrics})
    assert keyed["la@tiny"] == first.metrics["la"] and keyed["la@clip-vit-b32"] == second.metrics["la"]
    assert c4r.encoder_folder("/models/openai/clip-vit-large-patch14/") == "clip-vit-large-patch14"


def test_nocaps_domains_and_the_hard_negative_ablation(memeworld_small, tiny_clip_dir, tmp_path):
    """nocaps-FOIL is scored per domain (metrics nocaps_la_in / near / out equal an evaluation of that
    domain's pairs alone), and the hard-negative ablation scores each named model on FOIL and nocaps
    into its own folder, the main model's rows beside them."""
    import pandas as pd

    from lib.clip4dm import report as c4r
    from lib.data.prep import load_all
    root, _ = memeworld_small
    data = load_all({"foil": {"root": str(root / "foil"), "img_dir": "../img"},
                     "nocaps_foil": {"root": str(root / "nocaps_foil"), "img_dir": "img"}})
    from lib.clip4dm import method as clip4dm
    data["foil"].records[:] = data["foil"].records[:16]
    assert {r.group for r in data["nocaps_foil"].records} == {"in-domain", "near-domain", "out-domain"}
    by_dom = {}
    for r in data["nocaps_foil"].records:          # foil / original pairs, in order: 3 items per domain
        by_dom.setdefault(r.group, []).append(r)
    data["nocaps_foil"].records[:] = [r for rs in by_dom.values() for r in rs[:6]]
    out = tmp_path / "03"
    model = CLIP4DM.from_pretrained(str(tiny_clip_dir), device="cpu", epsilon=-5e-5)
    main = c4r.run_encoder(model, "tiny", data, c4r.encoder_dir(out, "tiny", first=True), epsilon=-5e-5, batch_size=8)
    recs = data["nocaps_foil"].records
    res = main.results("nocaps_foil", "most_negative")
    near = [i for i, r in enumerate(recs) if r.group == "near-domain"]
    alone = clip4dm.evaluate_foil([res[i] for i in near], [recs[i] for i in near])
    assert main.metrics["nocaps_la_near"] == alone["la"] and main.metrics["nocaps_ap_fclipscore_near"] == alone["ap_fclipscore"]
    table = pd.read_csv(out / "foil_table.csv")
    assert list(table.benchmark) == ["foil", "nocaps_foil", "nocaps_foil/in-domain", "nocaps_foil/near-domain",
                                     "nocaps_foil/out-domain"]
    other = _perturbed_copy(tiny_clip_dir, tmp_path / "other-clip", seed=2)
    hn, m = c4r.hard_negative_ablation({"no_hard_negatives": str(other)}, data, out, main, template="A photo depicts ",
                                       start_layer_text=-1, epsilon=-5e-5, device="cpu", batch_size=8)
    assert (out / "other-clip" / "results_nocaps_foil.csv").exists() and (out / "hard_negatives.csv").exists()
    assert set(hn.model) == {"main (trained on every training pair)", "leak-free, no hard negatives"}
    main_rows = hn[(hn.model.str.startswith("main")) & (hn.benchmark == "foil") & (hn.metric == "F-CLIPScore")]
    assert main_rows.value.iloc[0] == main.metrics["ap_fclipscore"]
    assert m["ap_fclipscore_no_hard_negatives"] != main.metrics["ap_fclipscore"]
    assert set(m) >= {"ap_clipscore_no_hard_negatives", "ap_neg_attribution_no_hard_negatives",
                      "nocaps_ap_fclipscore_no_hard_negatives", "la_no_hard_negatives"}
    with pytest.raises(ValueError, match="unknown role"):
        c4r.hard_negative_ablation({"oops": str(other)}, data, out, main, template="A photo depicts ",
                                   start_layer_text=-1, epsilon=-5e-5)


def test_tokenising_several_passes_at_once_changes_nothing(tiny_clip_dir):
    """Captions are tokenised a window of passes at a time and each pass cut to its own longest
    caption: the results equal tokenising pass by pass, whatever the window."""
    m = CLIP4DM.from_pretrained(tiny_clip_dir, device="cpu", epsilon=0.0)
    imgs = _imgs(11, seed=9)
    caps = [CAPTIONS[i % 4] + " and more" * (i % 5) for i in range(11)]
    runs = []
    for w in (1, 2, 64):
        m.tokenize_window = w
        runs.append(m.batch(imgs, caps, batch_size=3))
    assert runs[0] == runs[1] == runs[2]
    one = [m(im, c) for im, c in zip(imgs[:3], caps[:3])]
    for a, b in zip(one, runs[2][:3]):
        assert a["negative_word"] == b["negative_word"]
        np.testing.assert_allclose([s for _, s in a["word_attributions"]], [s for _, s in b["word_attributions"]],
                                   atol=1e-6)


def test_content_words_drop_punctuation_and_closed_class_words():
    from lib.clip4dm.method import content_words
    assert content_words(["A", "dog", "is", "on", "the", "red", "sofa", ",", "near", "two", "cats", "."]) == \
        ["dog", "red", "sofa", "cats"]


def test_epsilon_rule_prefers_the_least_abstaining_threshold_among_near_ties():
    import pandas as pd

    from lib.clip4dm.report import pick_epsilon
    sweep = pd.DataFrame({"epsilon": [-1e-5, -1e-4, -1e-3, -1e-2], "word_f1": [0.40, 0.47, 0.475, 0.30],
                          "share_abstaining": [0.05, 0.10, 0.64, 0.90]})
    picked = pick_epsilon(sweep, tie=0.01)
    assert picked.loc[picked.chosen, "epsilon"].item() == -1e-4        # the arg-max (-1e-3) abstains on 64%
    assert list(picked.within_tie) == [False, True, True, False]
    strict = pick_epsilon(sweep, tie=0.0)
    assert strict.loc[strict.chosen, "epsilon"].item() == -1e-3        # tie 0: the plain arg-max of F1


def _files(tmp_path, n, seed):
    paths = []
    for i, im in enumerate(_imgs(n, seed=seed)):
        im.save(tmp_path / f"img{i}.png")
        paths.append(str(tmp_path / f"img{i}.png"))
    return paths


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_loader_threads_give_the_same_pixels_in_the_same_batches(model, tmp_path, workers):
    """Images decoded and preprocessed ahead of the model on threads are the in-line path's pixels, batch
    for batch, in order (a faster path that changed pixels would change every attribution)."""
    from lib.models.encoders.loading import image_batches
    paths = _files(tmp_path, 7, seed=11)
    inline = list(image_batches(model.encoder, paths, 3, workers=0))
    threaded = list(image_batches(model.encoder, paths, 3, workers=workers))
    assert [p for p, _ in inline] == [p for p, _ in threaded] == [paths[:3], paths[3:6], paths[6:]]
    for (_, a), (_, b) in zip(inline, threaded):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_attribute_pairs_with_loader_threads_equals_the_inline_path(model, tmp_path):
    from lib.clip4dm.runs import attribute_pairs
    paths = _files(tmp_path, 5, seed=12)
    pairs = [(paths[i % 5], CAPTIONS[i % 4]) for i in range(9)]
    a = attribute_pairs(model, pairs, tmp_path / "a.jsonl", batch_size=2, progress=False, workers=0)
    b = attribute_pairs(model, pairs, tmp_path / "b.jsonl", batch_size=2, progress=False, workers=2)
    assert a == b


def test_attribute_pairs_streams_images_and_gives_what_embedding_every_image_first_gives(model, tmp_path):
    """The images are embedded as the pairs first need them (the loader decoding ahead while the model attributes),
    in the same image batches and pair chunks as embedding them all first: the same words, scores and cosines."""
    import torch
    from lib.clip4dm.runs import attribute_pairs, embed_image_files
    paths = _files(tmp_path, 7, seed=5)
    pairs = [(paths[(3 * i) % 7], CAPTIONS[i % 4]) for i in range(15)]        # images shared, out of order
    got = attribute_pairs(model, pairs, tmp_path / "s.jsonl", batch_size=4, progress=False, workers=2)
    emb = embed_image_files(model, [p for p, _ in pairs], batch_size=4, workers=0)
    for s in range(0, len(pairs), 4):
        chunk = pairs[s:s + 4]
        scores, offsets, sims, texts = model.token_scores(None, [c for _, c in chunk],
                                                         image_embeds=torch.stack([emb[p] for p, _ in chunk]))
        for row, t, sc, of, c in zip(got[s:s + 4], texts, scores, offsets, sims):
            want = model._words(t, sc, of, float(c))
            assert row["cos"] == float(c)
            assert row["word_attributions"] == [list(x) for x in want["all_word_attributions"]]


def test_the_loader_defaults_to_no_threads_on_a_cpu_and_reports_its_ratio(model, tmp_path):
    from lib.clip4dm.runs import loader_ratio
    from lib.models.encoders.loading import default_loader_workers, image_batches
    assert default_loader_workers("cpu") == 0 and default_loader_workers(None) == 0
    assert 1 <= default_loader_workers("cuda:0") <= 8
    with pytest.raises(ValueError, match="workers must be >= 0"):
        list(image_batches(model.encoder, ["x.png"], 2, workers=-1))
    paths = _files(tmp_path, 4, seed=13)
    r = loader_ratio(model, paths, CAPTIONS[:4], batch_size=2, repeats=1)
    assert r["workers"] == 0 and r["pairs"] == 4 and r["from_files_pairs_per_s"] > 0 and r["floor_pairs_per_s"] > 0
    assert r["ratio"] == pytest.approx(r["from_files_pairs_per_s"] / r["floor_pairs_per_s"])
    with pytest.raises(ValueError, match="4 images but 3 captions"):
        loader_ratio(model, paths, CAPTIONS[:3])


def test_a_launch_computes_the_attributions_notebook_03_then_reads_back(memeworld_small, tiny_clip_dir, tmp_path,
                                                                        monkeypatch):
    """`python -m lib.clip4dm.report --profile P` (what `accelerate launch` runs, each process its share) writes
    every pair notebook 03's run_encoder attributes, HAT's validation copy included, to the caches it reads: the
    notebook's run then computes none of them again."""
    from lib.clip4dm import report as c4r
    from lib.data.prep import load_all
    root, _ = memeworld_small
    sources = {b: {"root": str(root / b), "img_dir": "../img"} for b in ("foil", "hat")}

    def prepared(profile, name, consumer, file=None):
        ds = load_all({name: {**sources[name], **({"file": file} if file else {})}})[name]
        ds.records[:] = ds.records[:12]
        return ds
    section = {"benchmarks": ["foil", "hat"], "encoders": [str(tiny_clip_dir)], "template": "A photo depicts ",
               "start_layer_text": -3, "epsilon": -5e-5, "epsilon_from_validation": "hat_val.json", "batch_size": 8,
               "max_pairs": 0, "device": "cpu"}
    monkeypatch.setattr(c4r, "load_profile", lambda profile: {"03_clip4dm": section})
    monkeypatch.setattr(c4r.data_prep, "load_prepared", prepared)
    monkeypatch.setattr(c4r, "stage_dir", lambda profile, stage: tmp_path / "03")
    assert c4r.main(["--profile", "x"]) == 0
    cache = tmp_path / "03" / "attributions.jsonl"
    lines = cache.read_text().splitlines()
    data = {b: prepared("x", b, "") for b in ("foil", "hat")}
    model = CLIP4DM.from_pretrained(str(tiny_clip_dir), device="cpu", epsilon=-5e-5)
    run = c4r.run_encoder(model, "tiny", data, c4r.encoder_dir(tmp_path / "03", "tiny", first=True), epsilon=-5e-5,
                          val_recs=prepared("x", "hat", "", file="hat_val.json").records, epsilon_grid=[-1e-4, -1e-2],
                          batch_size=8)
    assert run.n_unique == len(lines) > 12 and cache.read_text().splitlines() == lines     # nothing recomputed
