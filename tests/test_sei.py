"""See, Explain, Intervene: retrieval, prompt assembly, parsing, controls, metrics against their
libraries, and the agent trainer on a tiny LLaVA-architecture model."""
import collections
import collections.abc
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from lib.sei import fewshot as sei, retrieval
from lib.evaluation import textmetrics as tm
from lib.evaluation.metrics import mean_ci
from lib.sei.fewshot import Answer, Meme, SeiTemplates, build_conversation, parse_answer


# ----------------------------------------------------------------------------- retrieval
def _brute_top_n(Q, P, n):
    out = []
    for q in Q:
        s = [(-float(np.dot(q, p)), j) for j, p in enumerate(P)]
        out.append([j for _, j in sorted(s)[:n]])
    return np.array(out)


def test_top_n_is_exact_and_breaks_ties_by_pool_order():
    rng = np.random.default_rng(0)
    P = rng.normal(size=(200, 16)).astype(np.float32)
    P /= np.linalg.norm(P, axis=1, keepdims=True)
    P[50] = P[10]                     # exact ties: the earlier pool meme must come first
    P[120] = P[10]
    Q = np.vstack([P[10], rng.normal(size=(30, 16)).astype(np.float32)])
    Q /= np.linalg.norm(Q, axis=1, keepdims=True)
    idx, sims = retrieval.top_n(Q, P, 8)
    assert np.array_equal(idx, _brute_top_n(Q, P, 8))
    assert list(idx[0, :3]) == [10, 50, 120]
    assert np.all(np.diff(sims, axis=1) <= 1e-7)
    with pytest.raises(ValueError, match="pool of 200"):
        retrieval.top_n(Q, P, 201)


def test_exemplar_order_and_retrieval_quality_against_hand_counts():
    assert sei.order_exemplars([1, 2, 3], "most_similar_last") == [3, 2, 1]
    assert sei.order_exemplars([1, 2, 3], "most_similar_first") == [1, 2, 3]
    with pytest.raises(ValueError, match="order"):
        sei.order_exemplars([1], "nearest")
    pool = [Meme(str(i), Path("x"), "", lab, type=t) for i, (lab, t) in
            enumerate([(1, "001"), (0, "000"), (1, "011"), (0, "000")])]
    queries = [Meme("q1", Path("x"), "", 1, type="001"), Meme("q2", Path("x"), "", 0, type="000")]
    ranked = np.array([[0, 1], [2, 3]])
    q = retrieval.retrieval_quality(ranked, pool, queries)
    assert q["label_agreement"] == pytest.approx(2 / 4)        # q1: 1 of 2, q2: 1 of 2
    assert q["label_base_rate"] == pytest.approx(0.5)
    assert q["type_agreement"] == pytest.approx((1 + 1) / 4)
    assert q["type_base_rate"] == pytest.approx((1 / 4 + 2 / 4) / 2)
    # majority vote, a tie going to the most similar exemplar
    assert retrieval.knn_vote(np.array([[0, 1], [1, 0], [0, 2, 1]], dtype=object), pool) == [1, 0, 1]


def test_plans_controls_and_silver_needs_are_seeded():
    pool = [Meme(str(i), Path("x"), "", i % 2) for i in range(40)]
    queries = [Meme(f"q{i}", Path("x"), "", i % 2) for i in range(10)]
    ranked = {"enc": np.tile(np.arange(8), (10, 1))}
    ret = sei.Setting("enc/4", 4, "enc")
    plan = sei.plan_exemplars(ret, queries, pool, ranked, "most_similar_last")
    assert plan["q0"] == [(3, 1), (2, 0), (1, 1), (0, 0)]   # most similar (index 0) last, gold labels
    shuf = sei.plan_exemplars(sei.Setting("s", 4, "enc", "shuffled_labels"), queries, pool, ranked, "most_similar_last")
    assert [j for j, _ in shuf["q0"]] == [3, 2, 1, 0]
    changed = sum(lab != pool[j].label for p in shuf.values() for j, lab in p)
    assert 0 < changed < 40
    assert shuf == sei.plan_exemplars(sei.Setting("s", 4, "enc", "shuffled_labels"), queries, pool, ranked,
                                      "most_similar_last")
    rnd = sei.plan_exemplars(sei.Setting("r", 4, None, "random"), queries, pool, ranked, "most_similar_last", seed=1)
    assert len({tuple(v) for v in rnd.values()}) > 1 and all(len(v) == 4 for v in rnd.values())
    zero = sei.plan_exemplars(sei.Setting("z", 0), queries, pool, ranked, "most_similar_last")
    assert all(v == [] for v in zero.values())
    caps, expl, iv = sei.silver_needs([plan, shuf])
    assert caps == {0, 1, 2, 3}
    assert {(j, pool[j].label) for j in caps} <= expl
    assert iv == {j for j, lab in expl if lab == 1}
    with pytest.raises(ValueError, match="need a retriever"):
        sei.Setting("bad", 2)
    with pytest.raises(ValueError, match="unknown keys"):
        sei.parse_settings({"x": {"n": 2, "shots": 3}}, ["enc"], [2])
    names = [s.name for s in sei.parse_settings({"zero": {"n": 0}, "sh": {"n": 2, "retriever": "default",
                                                                           "exemplars": "shuffled_labels"}},
                                                 ["enc", "enc2"], [2, 4])]
    assert names == ["enc/2", "enc/4", "enc2/2", "enc2/4", "zero", "sh"]


def test_balanced_subset():
    memes = [Meme(str(i), Path("x"), "", int(i < 30)) for i in range(100)]
    sub = sei.balanced_subset(memes, 20, seed=1)
    assert len(sub) == 20 and sum(m.label for m in sub) == 10
    assert [m.id for m in sub] == [m.id for m in sei.balanced_subset(memes, 20, seed=1)]
    assert len(sei.balanced_subset(memes, 0)) == 100
    few = sei.balanced_subset(memes[25:], 20, seed=0)          # only 5 hateful left: filled with the other label
    assert len(few) == 20 and sum(m.label for m in few) == 5


# ----------------------------------------------------------------------------- prompt
def test_golden_two_shot_conversation(tmp_path):
    d = tmp_path / "p"
    d.mkdir()
    (d / "system.txt").write_text("Classify. • hateful: {hateful_definition} • non-hateful: {non_hateful_definition}\n")
    (d / "user.txt").write_text("{caption}. ```{ocr}```\n")
    (d / "answer.txt").write_text("{label} - {explanation}{intervention}\n")
    (d / "intervention.txt").write_text(" Intervention - {intervention}\n")
    (d / "definitions.yaml").write_text("fhm:\n  hateful: an attack.\n  non_hateful: anything else.\n")
    tpl = SeiTemplates.load(d)
    shots = [Meme("1", Path("a.png"), "they are rats", 1, "rats beside a people", "It calls them vermin.",
                  "Nobody is vermin."),
             Meme("2", Path("b.png"), "sunny day", 0, "a sun.", "Nothing attacks anyone.", "ignored for benign")]
    q = Meme("9", Path("t.png"), "hello", None, "a boat")
    conv = build_conversation(q, shots, tpl, "fhm")
    expected = [
        {"role": "system", "content": [{"type": "text", "text": "Classify. • hateful: an attack. • non-hateful: "
                                                                 "anything else."}]},
        {"role": "user", "content": [{"type": "image", "image": "a.png"},
                                     {"type": "text", "text": "rats beside a people. ```they are rats```"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "hateful - It calls them vermin. Intervention - "
                                                                    "Nobody is vermin."}]},
        {"role": "user", "content": [{"type": "image", "image": "b.png"},
                                     {"type": "text", "text": "a sun. ```sunny day```"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "non-hateful - Nothing attacks anyone."}]},
        {"role": "user", "content": [{"type": "image", "image": "t.png"},
                                     {"type": "text", "text": "a boat. ```hello```"}]},
    ]
    assert conv == expected
    assert all(p["type"] == "text" for m in build_conversation(q, shots, tpl, "fhm", images=False)
               for p in m["content"])
    with pytest.raises(KeyError, match="definition set 'mami'"):
        build_conversation(q, shots, tpl, "mami")
    with pytest.raises(ValueError, match="no gold label"):
        build_conversation(q, [q], tpl, "fhm")


def test_shipped_templates_load_and_every_definition_set_renders():
    tpl = SeiTemplates.load("params/prompts/sei")
    for name in tpl.definitions:
        s = tpl.system_prompt(name)
        assert "{" not in s and "hateful:" in s
    assert tpl.answer(1, "why", "what to do").startswith("hateful - why")
    assert parse_answer(tpl.answer(1, "why", "what to do")) == Answer("ok", 1, "why", "what to do",
                                                                      raw=tpl.answer(1, "why", "what to do"))


# ----------------------------------------------------------------------------- parsing
@pytest.mark.parametrize("text, status, label, expl, iv, flags", [
    ("hateful - It mocks them. Intervention - Be kind.", "ok", 1, "It mocks them.", "Be kind.", {}),
    ("Hateful – it mocks them – be kind", "ok", 1, "it mocks them", "be kind", {}),
    ("{hateful – explanation. Intervention - intervention.}", "ok", 1, "explanation.", "intervention.", {}),
    ("non-hateful - a neutral remark", "ok", 0, "a neutral remark", "", {}),
    ("Not hateful: it condemns vandalism.", "ok", 0, "it condemns vandalism.", "", {}),
    ("non hateful - fine - Intervention: none needed", "ok", 0, "fine", "", {"dropped_intervention": True}),
    ("**Label:** hateful - x", "ok", 1, "x", "", {}),
    ("The meme is hateful because it mocks.", "unparseable", None, "", "", {}),
    ("", "unparseable", None, "", "", {}),
    ("I'm sorry, but I can't help with classifying this.", "refused", None, "", "", {}),
])
def test_parse_free_text(text, status, label, expl, iv, flags):
    a = parse_answer(text)
    assert (a.status, a.label, a.explanation, a.intervention) == (status, label, expl, iv)
    for k, v in flags.items():
        assert getattr(a, k) == v


def test_parse_statuses_from_the_chat_layer_structured_and_lenient():
    assert parse_answer("", "blocked").status == "blocked"
    assert parse_answer(None, "failed").status == "failed"
    assert parse_answer("hateful - x", "refused").status == "refused"
    assert parse_answer('{"label": "hateful"}', "unparseable").status == "unparseable"
    a = parse_answer("hateful - cut off mid", "ok", "length")
    assert a.status == "ok" and a.truncated
    s = parse_answer('{"label": "non-hateful", "explanation": "e", "intervention": "i"}', "ok",
                     parsed={"label": "non-hateful", "explanation": "e", "intervention": "i"})
    assert (s.label, s.explanation, s.intervention, s.dropped_intervention) == (0, "e", "", True)
    assert parse_answer("x", parsed={"label": "maybe", "explanation": ""}).status == "unparseable"
    le = parse_answer("The meme is not hateful. It names nobody.", parser="lenient")
    assert (le.status, le.label) == ("ok", 0)
    assert parse_answer("The meme is hateful, clearly.", parser="lenient").label == 1
    assert parse_answer("A picture of a boat. It is hateful.", parser="lenient").status == "unparseable"
    with pytest.raises(ValueError, match="parser"):
        parse_answer("x", parser="loose")


def test_classification_counts_missing_labels_as_wrong():
    from sklearn.metrics import f1_score
    P = sei.Prediction
    preds = [P("1", 1, "s", "ok", 1, "e", "i", False, False, [], []),
             P("2", 0, "s", "ok", 1, "e", "i", False, False, [], []),
             P("3", 0, "s", "unparseable", None, "", "", False, False, [], []),
             P("4", 1, "s", "refused", None, "", "", False, False, [], [])]
    c = sei.classification(preds)
    assert c["acc"] == 0.25 and c["n_unparseable"] == 1 and c["n_refused"] == 1 and c["support"] == 2
    assert c["macro_f1"] == pytest.approx(f1_score([1, 0, 0, 1], [1, 1, 1, 0], average="macro"))
    assert (c["hateful_if_benign"], c["hateful_if_hateful"]) == (0.5, 0.5)   # no label: not "hateful"
    assert sei.classification(preds[:2])["hateful_if_benign"] == 1.0
    assert np.isnan(sei.classification(preds[:1])["hateful_if_benign"])    # no benign meme: no share


# ----------------------------------------------------------------------------- metrics against their libraries
PREDS = ["the cat sat on the mat", "a meme that mocks a people", "nothing here attacks anyone"]
REFS = [["a cat sat on a mat", "dogs run"], ["the meme ridicules a people"], ["no group is attacked here"]]


def test_rouge_l_equals_rouge_score():
    from rouge_score import rouge_scorer
    sc = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)
    ours = tm.rouge_l(PREDS, REFS)
    theirs = [max(sc.score(r, p)["rougeL"].fmeasure for r in rr) for p, rr in zip(PREDS, REFS)]
    assert np.allclose(ours, theirs)
    assert ours[0] == pytest.approx(2 / 3, abs=1e-3)


def test_semsim_equals_sentence_transformers():
    from sentence_transformers import SentenceTransformer, util
    m = SentenceTransformer(tm.resolve_text_model("minilm"))
    ours = tm.semsim(PREDS, REFS)
    theirs = [max(float(util.cos_sim(m.encode(p), m.encode(r))) for r in rr) for p, rr in zip(PREDS, REFS)]
    assert np.allclose(ours, theirs, atol=1e-5)
    assert ours[1] > 0.5 > tm.semsim(["a red boat"], ["the meme ridicules a people"])[0]


def test_bertscore_equals_bert_score_on_a_local_folder():
    import bert_score
    path = tm.resolve_text_model("minilm")
    ours = tm.bertscore_f1(PREDS, REFS, tm.BertScoreSpec("minilm", 6, True))
    _, _, f = bert_score.score(PREDS, REFS, model_type=path, num_layers=6, rescale_with_baseline=False, idf=False,
                               use_fast_tokenizer=True)
    assert np.allclose(ours, f.numpy(), atol=1e-5)
    assert tm.BertScoreSpec().label.endswith("(MiniLM proxy)")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        tm.bertscore_f1(["a"], ["b"], tm.BertScoreSpec("data/models/no-such-model", 17, False))


def test_entropy_shift_equals_shifterator():
    if not hasattr(collections, "Mapping"):       # shifterator 0.3.0 predates Python 3.10
        collections.Mapping = collections.abc.Mapping
    import shifterator
    f1 = tm.word_freqs(["the meme mocks a people", "a people is called vermin", "the meme is hateful"])
    f2 = tm.word_freqs(["the meme is humorous", "a neutral remark about a people", "nothing attacks anyone"])
    ours = tm.entropy_shift(f1, f2, base=2)
    theirs = shifterator.EntropyShift(dict(f1), dict(f2), base=2).get_shift_scores()
    assert set(ours) == set(theirs)
    for w in ours:
        assert ours[w] == pytest.approx(theirs[w], abs=1e-12)
    raw = tm.entropy_shift(f1, f2, normalization="none")
    h = lambda f: -sum(c / sum(f.values()) * math.log2(c / sum(f.values())) for c in f.values())
    assert sum(raw.values()) == pytest.approx(h(f2) - h(f1))


def test_entropy_shift_is_the_same_whatever_the_hash_seed():
    """The word shift figure is redrawn byte for byte from the committed results by another process: the
    contributions' order (and their sum, the normalisation) may not follow the hash seed's set order."""
    import os
    import subprocess
    import sys
    code = ("from lib.evaluation import textmetrics as tm\n"
            "f1 = tm.word_freqs(['a b c d e f g h', 'a a b'])\nf2 = tm.word_freqs(['e f g h i j k', 'k k b'])\n"
            "print(repr(list(tm.entropy_shift(f1, f2).items())))")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2", "3")}
    assert len(outs) == 1


def test_vader_bootstrap_and_lexical_measures():
    from scipy import stats
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer
    v = SentimentIntensityAnalyzer()
    for t in ["This meme is hateful and dehumanizing.", "A lovely sunny day with friends!", "A boat."]:
        c = v.polarity_scores(t)["compound"]
        assert tm.vader_label(t) == ("positive" if c >= 0.05 else "negative" if c <= -0.05 else "neutral")
    assert tm.vader_label("This meme is hateful and dehumanizing.") == "negative"
    vals = [3, 5, 8, 13, 2, 7, 9]
    m, lo, hi, used = mean_ci(vals, 500, "BCa", seed=4)
    ref = stats.bootstrap((np.array(vals, float),), np.mean, n_resamples=500, method="BCa",
                          rng=np.random.default_rng(4)).confidence_interval
    assert (m, lo, hi, used) == (pytest.approx(np.mean(vals)), pytest.approx(ref.low), pytest.approx(ref.high), "BCa")
    assert mean_ci([2, 2, 2])[1:] == (2.0, 2.0, "percentile")
    assert math.isnan(mean_ci([4])[1])
    assert tm.token_count("Don't share it, please!") == 5
    assert tm.type_token_ratio("a a b c") == 0.75
    assert tm.unigram_perplexity("a a b c") == pytest.approx(2 ** 1.5)
    assert tm.unigram_perplexity("a b", collections.Counter({"a": 3})) == pytest.approx(
        math.exp(-(math.log(4 / 5) + math.log(1 / 5)) / 2))


# ----------------------------------------------------------------------------- agents on a tiny model
@pytest.fixture(scope="module")
def tiny_agent_base(tiny_clip_dir, tmp_path_factory):
    """A randomly initialised memeworld-vlm-architecture model (LLaVA) saved like the real one."""
    from lib.models.memeworld_vlm import VlmConfig, build_vlm, train_tokenizer
    from lib.compendium.artifacts import save_model
    texts = ["What does this meme mean? Its text:", "The meme is hateful. Explain why.", "non-hateful hateful",
             "they are rats", "a sunny day", "nothing attacks anyone", "it calls them vermin"] * 20
    cfg = VlmConfig(vocab_size=300, hidden=32, layers=1, heads=2, intermediate=64)
    model, proc = build_vlm(train_tokenizer(texts, cfg.vocab_size), Path(tiny_clip_dir), cfg)
    out = tmp_path_factory.mktemp("agent_base") / "base"
    save_model(model, proc, out)
    return out


def _records(tmp_path):
    from PIL import Image
    from lib.data.records import ExplanationRecord, MemeCapRecord, MemeRecord, MemeSenseRecord
    img = tmp_path / "img"
    img.mkdir(exist_ok=True)
    memes, cap, hat, sense = [], [], [], []
    for i in range(12):
        p = img / f"{i:05d}.png"
        Image.new("RGB", (32, 32), (20 * i, 100, 200 - 10 * i)).save(p)
        split = "test_seen" if i >= 9 else "train"
        lab = i % 2
        memes.append(MemeRecord(str(i), p, f"text {i}", lab, split))
        cap.append(MemeCapRecord(f"{i:05d}", p, f"text {i}", ["x"], [f"meaning {i}"], [],
                                 "test" if i >= 9 else "trainval"))
        hat.append(ExplanationRecord(str(i), p, ["group"] if lab else [], [f"because {i}"],
                                     "test" if i >= 9 else "train"))
        if lab:
            sense.append(MemeSenseRecord(f"{i:05d}", p, f"commonsense {i}", f"intervene {i}"))
    return memes, cap, hat, sense


def test_agent_data_joins_formats_and_holds_out_test_memes(tmp_path):
    from lib.sei.agents import AgentDataError, build_agent_data
    memes, cap, hat, sense = _records(tmp_path)
    data = build_agent_data(cap, hat, sense, memes)
    assert {a: len(v) for a, v in data.items()} == {"captioner": 12, "explainer": 12, "commonsense": 6,
                                                     "intervention": 6}
    e = next(x for x in data["explainer"] if x.id == "3")
    assert e.inputs == {"ocr": "text 3", "label": "hateful"} and e.target == "because 3" and e.split == "train"
    assert next(x for x in data["captioner"] if x.id == "0").inputs["ocr"] == "text 0"   # '00000' joins meme 0
    held = {x.id for x in data["intervention"] if x.split == "test"}
    assert held == {"9", "11"}                                   # MemeSense: the FHM test memes are held out
    assert next(x for x in data["intervention"] if x.id == "9").inputs["commonsense"] == "commonsense 9"
    cap[0].meme_captions = []
    with pytest.raises(AgentDataError, match="memecap record 00000: field 'meme_captions'"):
        build_agent_data(cap, hat, sense, memes)


def test_agent_trains_on_the_answer_only_is_cached_and_answers_through_the_chat_layer(tiny_agent_base, tmp_path):
    from lib.sei.agents import (AgentRecipe, agent_chat, build_agent_data, encode_example, nearest_train_baseline,
                            run_agent, train_agent, _load_base)
    from lib.models.chat import ResponseCache
    from PIL import Image
    memes, cap, hat, sense = _records(tmp_path)
    data = build_agent_data(cap, hat, sense, memes)
    _, proc, _ = _load_base(str(tiny_agent_base), "float32")
    enc = encode_example(proc, Image.new("RGB", (32, 32)), "The meme is hateful. Explain why.", " it calls them vermin",
                         256)
    ans = [t for t, l in zip(enc["input_ids"], enc["labels"]) if l != -100]
    tok = proc.tokenizer
    assert tok.decode(ans, skip_special_tokens=True).strip() == "it calls them vermin"
    assert ans[-1] == tok.eos_token_id and enc["labels"][0] == -100
    recipe = AgentRecipe(base=str(tiny_agent_base), epochs=2, lr=1e-3, batch_size=4, threads=1)
    tpl = "The meme is {label}. Explain why. Its text: {ocr}"
    first = train_agent(data["explainer"], tmp_path / "agents" / "explainer", recipe, tpl, progress=False)
    assert not first["cached"] and first["n_train"] == 9 and len(first["curve"]) == 2
    assert first["curve"][1]["loss"] < first["curve"][0]["loss"]
    again = train_agent(data["explainer"], tmp_path / "agents" / "explainer", recipe, tpl, progress=False)
    assert again["cached"] and again["key"] == first["key"]
    other = train_agent(data["explainer"], tmp_path / "agents" / "explainer", recipe, tpl + ".", progress=False)
    assert not other["cached"]                                   # another prompt is another agent
    cache = ResponseCache(tmp_path / "cache.sqlite")
    chat = agent_chat(tmp_path / "agents" / "explainer", cache)
    test = [e for e in data["explainer"] if e.split == "test"]
    res = run_agent(chat, tpl, [(e.img_path, e.inputs) for e in test], max_new_tokens=6, progress=False)
    assert all(r.status == "ok" for r in res) and chat.stats.requests == 3
    chat2 = agent_chat(tmp_path / "agents" / "explainer", cache)
    assert [r.text for r in run_agent(chat2, tpl, [(e.img_path, e.inputs) for e in test], 6, progress=False)] == \
        [r.text for r in res] and chat2.stats.requests == 0
    train = [e for e in data["explainer"] if e.split == "train"]
    emb = {e.id: np.eye(12, dtype=np.float32)[int(e.id) % 8] for e in data["explainer"]}
    assert nearest_train_baseline(test, train, emb) == ["because 1", "because 2", "because 3"]


def test_prefix_models_train_and_answer_without_a_chat_template(tiny_paligemma, tmp_path):
    """PaliGemma-pt (the paper's agents): prefix + suffix encoding for training, the prefix alone at
    inference, through the same trainer and chat layer as chat-template models."""
    from PIL import Image
    from lib.sei.agents import AgentRecipe, _load_base, agent_chat, build_agent_data, encode_example, run_agent, train_agent
    from lib.models.chat import ResponseCache
    _, proc, _ = _load_base(str(tiny_paligemma), "float32")
    assert not getattr(proc, "chat_template", None)
    enc = encode_example(proc, Image.new("RGB", (32, 32)), "explain why", "it calls them vermin", 256)
    ans = [t for t, l in zip(enc["input_ids"], enc["labels"]) if l != -100]
    tok = proc.tokenizer
    assert ans == tok("it calls them vermin", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert enc["labels"][:16] == [-100] * 16                       # image and prefix tokens carry no loss
    # a max_len shorter than the image tokens is refused with the length to set (it used to cut them,
    # and the first training batch failed with "image features and image tokens do not match")
    from lib.sei.agents import image_token_id
    n_img = enc["input_ids"].count(image_token_id(proc))
    assert n_img > 0
    with pytest.raises(ValueError, match=f"{n_img} image tokens"):
        encode_example(proc, Image.new("RGB", (32, 32)), "explain why", "it calls them vermin", n_img - 2)
    cut = encode_example(proc, Image.new("RGB", (32, 32)), "explain why", "it calls them vermin",
                         len(enc["input_ids"]) - 2)                # the answer's end goes, never an image token
    assert cut["input_ids"].count(image_token_id(proc)) == n_img and len(cut["input_ids"]) == len(enc["input_ids"]) - 2
    memes, cap, hat, sense = _records(tmp_path)
    data = build_agent_data(cap, hat, sense, memes)
    rec = train_agent(data["explainer"], tmp_path / "pg_agent", AgentRecipe(base=str(tiny_paligemma), epochs=1,
                                                                            lr=1e-3, batch_size=4, threads=1),
                      "explain why {label} {ocr}", progress=False)
    assert rec["n_train"] == 9 and np.isfinite(rec["curve"][0]["loss"])
    chat = agent_chat(tmp_path / "pg_agent", ResponseCache(tmp_path / "c.sqlite"))
    test = [e for e in data["explainer"] if e.split == "test"]
    res = run_agent(chat, "explain why {label} {ocr}", [(e.img_path, e.inputs) for e in test], 5, progress=False)
    assert [r.status for r in res] == ["ok"] * 3 and all(r.usage["completion_tokens"] <= 5 for r in res)
    with pytest.raises(ValueError, match="single user turn"):
        chat.backend.complete_batch([[{"role": "system", "content": [{"type": "text", "text": "x"}]},
                                      {"role": "user", "content": [{"type": "text", "text": "y"}]}]],
                                    __import__("lib.models.chat", fromlist=["GenParams"]).GenParams(max_new_tokens=2))


def test_training_twice_in_one_process_with_two_precisions_and_then_trace(tiny_agent_base, tmp_path):
    """accelerate keeps one state per process and refuses a second Accelerator with another mixed precision;
    every run here starts from a fresh one (a kernel trains agents in bf16 and fp32, then TRACE)."""
    from accelerate import Accelerator
    from lib.sei.agents import AgentRecipe, build_agent_data, train_agent
    from lib.compendium.presets import new_accelerator
    data = build_agent_data(*_records(tmp_path)[1:], _records(tmp_path)[0])
    tpl = "The meme is {label}. Explain why. Its text: {ocr}"
    for k, mp in enumerate(("no", "bf16", "no")):
        rec = train_agent(data["explainer"], tmp_path / f"agent_{k}", AgentRecipe(
            base=str(tiny_agent_base), epochs=1, lr=1e-3, batch_size=4, threads=1, mixed_precision=mp), tpl,
            progress=False)
        assert not rec["cached"] and np.isfinite(rec["curve"][0]["loss"]) and rec["recipe"]["mixed_precision"] == mp
    # the state the last run left is live: without the reset accelerate refuses another precision
    with pytest.raises(ValueError, match="already been initialized"):
        Accelerator(mixed_precision="bf16", cpu=True)
    assert new_accelerator(mixed_precision="bf16", cpu=True).mixed_precision == "bf16"   # then TRACE's path
    assert new_accelerator(mixed_precision="no").mixed_precision == "no"


def test_an_answer_cut_away_entirely_is_an_error_or_dropped_and_counted(tiny_paligemma, tmp_path):
    """A max_len that leaves an example no answer token used to give a NaN loss (a batch of only such
    examples) without an error."""
    from PIL import Image
    from lib.sei.agents import AgentDataError, AgentRecipe, _load_base, build_agent_data, encode_example, train_agent
    memes, cap, hat, sense = _records(tmp_path)
    for m in memes[:2]:
        m.text = f"{m.text} " + "a long text that fills the prompt " * 3     # memes 0 and 1: long prompts
    data = build_agent_data(cap, hat, sense, memes)
    tpl = "explain why {label} {ocr}"
    _, proc, _ = _load_base(str(tiny_paligemma), "float32")
    train = [e for e in data["explainer"] if e.split == "train"]
    encs = {e.id: encode_example(proc, Image.open(e.img_path).convert("RGB"), tpl.format(**e.inputs), e.target, 4096)
            for e in train}
    prompt_len = {i: x["labels"].index(next(t for t in x["labels"] if t != -100)) for i, x in encs.items()}
    short = max(v for i, v in prompt_len.items() if i not in ("0", "1"))
    assert min(prompt_len["0"], prompt_len["1"]) > short + 2
    recipe = AgentRecipe(base=str(tiny_paligemma), epochs=1, lr=1e-3, batch_size=2, threads=1, max_len=short + 2)
    with pytest.raises(AgentDataError) as e:
        train_agent(data["explainer"], tmp_path / "cut", recipe, tpl, progress=False)
    need = max(len(encs[i]["input_ids"]) for i in ("0", "1"))
    assert f"max_len {short + 2} cuts away the whole answer of 2 of 9" in str(e.value)
    assert "memes 0, 1" in str(e.value) and f"at least {need}" in str(e.value)
    rec = train_agent(data["explainer"], tmp_path / "cut", replace(recipe, drop_cut_answers=True), tpl, progress=False)
    assert rec["n_train"] == 7 and rec["n_answer_cut"] == 2 and rec["n_answer_shortened"] == 7
    assert np.isfinite(rec["curve"][0]["loss"])


def test_a_non_finite_loss_stops_training_naming_the_step_and_memes(tiny_agent_base, tmp_path):
    import torch
    from lib.sei.agents import AgentRecipe, _load_base, build_agent_data, train_agent
    from lib.compendium.artifacts import save_model
    model, proc, _ = _load_base(str(tiny_agent_base), "float32")
    with torch.no_grad():
        next(model.parameters()).fill_(float("nan"))
    save_model(model, proc, tmp_path / "nan_base")
    memes, cap, hat, sense = _records(tmp_path)
    data = build_agent_data(cap, hat, sense, memes)
    with pytest.raises(FloatingPointError, match=r"loss is nan at epoch 1, step 1 of 3 \(memes "):
        train_agent(data["explainer"], tmp_path / "nan_agent", AgentRecipe(base=str(tmp_path / "nan_base"), epochs=1,
                                                                           batch_size=4, threads=1),
                    "The meme is {label}. {ocr}", progress=False)
    assert not (tmp_path / "nan_agent" / "config.json").exists()


def test_gradient_checkpointing_gives_the_same_training_and_the_same_agent_key(tiny_paligemma, tmp_path):
    from lib.sei.agents import AgentRecipe, build_agent_data, train_agent
    data = build_agent_data(*_records(tmp_path)[1:], _records(tmp_path)[0])
    recipe = AgentRecipe(base=str(tiny_paligemma), epochs=1, lr=1e-3, batch_size=4, threads=1)
    plain = train_agent(data["explainer"], tmp_path / "plain", recipe, "explain {label} {ocr}", progress=False)
    ckpt = train_agent(data["explainer"], tmp_path / "ckpt", replace(recipe, gradient_checkpointing=True),
                       "explain {label} {ocr}", progress=False)
    assert ckpt["gradient_checkpointing"] and not plain["gradient_checkpointing"]       # it was on, and only there
    assert ckpt["key"] == plain["key"]                    # the same weights: a cached agent is reused either way
    assert ckpt["curve"][0]["loss"] == pytest.approx(plain["curve"][0]["loss"], rel=1e-4)


def test_fused_attention_trains_like_eager_attention_under_the_same_agent_key(tiny_paligemma, tmp_path):
    """attn_implementation (SDPA by default: no s x s score matrix per head) is the same function as eager
    attention: the same key, the same loss to float tolerance; the record names the one that ran."""
    from lib.sei.agents import AgentRecipe, build_agent_data, train_agent
    data = build_agent_data(*_records(tmp_path)[1:], _records(tmp_path)[0])
    recipe = AgentRecipe(base=str(tiny_paligemma), epochs=1, lr=1e-3, batch_size=4, threads=1)
    assert recipe.attn_implementation == "sdpa"
    fused = train_agent(data["explainer"], tmp_path / "sdpa", recipe, "explain {label} {ocr}", progress=False)
    eager = train_agent(data["explainer"], tmp_path / "eager", replace(recipe, attn_implementation="eager"),
                        "explain {label} {ocr}", progress=False)
    assert (fused["attn_implementation"], eager["attn_implementation"]) == ("sdpa", "eager")
    assert fused["key"] == eager["key"]
    assert fused["curve"][0]["loss"] == pytest.approx(eager["curve"][0]["loss"], rel=1e-4)


def test_on_a_gpu_a_recipe_that_cannot_fit_is_refused_before_training(tiny_agent_base, tmp_path, monkeypatch):
    """The memory check runs before anything reaches the GPU (its free-memory query is mocked here)."""
    import lib.sei.agents as agents
    from lib.models.train_memory import RecipeMemoryError
    monkeypatch.setattr(agents, "_on_gpu", lambda acc: True)
    monkeypatch.setattr(agents, "gpu_free_bytes", lambda device=None: 1024.0)
    data = agents.build_agent_data(*_records(tmp_path)[1:], _records(tmp_path)[0])
    with pytest.raises(RecipeMemoryError, match=r"this GPU has 0.0 GiB free"):
        agents.train_agent(data["explainer"], tmp_path / "big", agents.AgentRecipe(base=str(tiny_agent_base), epochs=1,
                                                                                   batch_size=4, threads=1),
                           "explain {label} {ocr}", progress=False)
    assert not (tmp_path / "big").exists()


@pytest.mark.parametrize("base", ["tiny_paligemma", "tiny_agent_base"])
def test_the_answer_only_loss_equals_the_models_loss_from_fewer_logits(base, request):
    """answer_logits_only: the loss and every gradient from the answer positions' logits, two at a time, equal the
    model's own (PaliGemma and the LLaVA architecture of memeworld-vlm), and the model's output layer computes
    one position per example instead of every one."""
    import contextlib
    import torch
    from PIL import Image
    from lib.sei.agents import ANSWER_KEYS, _collate, _load_base, answer_loss, encode_example
    model, proc, _ = _load_base(str(request.getfixturevalue(base)), "float32")
    prompts = ["explain why", "explain why the meme is hateful and who it names", "why"]
    answers = ["it calls them vermin", "a", "the meme is hateful because it calls them vermin"]
    enc = [encode_example(proc, Image.new("RGB", (32, 32), (9 * k, 50, 90)), p, a, 4096)
           for k, (p, a) in enumerate(zip(prompts, answers))]
    tok = getattr(proc, "tokenizer", proc)
    batch = _collate(enc, tok.pad_token_id or 0)
    answer = {k: batch.pop(k) for k in ANSWER_KEYS}
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    torch.manual_seed(0)
    full = model(**batch).loss
    g_full = torch.autograd.grad(full, params, allow_unused=True)
    torch.manual_seed(0)
    head = model.get_output_embeddings()
    seen = []
    hook = head.register_forward_hook(lambda _m, _a, out: seen.append(out.shape[:-1]))
    part = answer_loss(model, batch, answer, head, contextlib.nullcontext, chunk=2)
    hook.remove()
    g_part = torch.autograd.grad(part, params, allow_unused=True)
    assert part.item() == pytest.approx(full.item(), rel=1e-5)
    for a, b in zip(g_full, g_part):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    n_answer = int((batch["labels"] != -100).sum())
    assert answer["_answer_count"] == n_answer > 2
    # the model's own call: one position per example; then the answer positions in chunks of two
    assert tuple(seen[0]) == (3, 1) and [tuple(x) for x in seen[1:]] == [(min(2, n_answer - i),)
                                                                        for i in range(0, n_answer, 2)]


def test_mami_records_join_the_same_memes(memeworld_small):
    """MemeWorld's MAMI copy names memes by file ('01234.png'): they join FHM's ids."""
    from lib.data.prep import load_all
    from lib.data.datasets import memeworld_sources
    from lib.sei.report import to_memes
    out, _ = memeworld_small
    ds = load_all({k: v for k, v in memeworld_sources(out).items() if k in ("fhm", "mami")})
    fhm = {m.id: m for m in to_memes(ds["fhm"].records)}
    mami = to_memes(ds["mami"].records)
    assert mami and all(m.id in fhm and fhm[m.id].label == m.label for m in mami)


def test_table2_layout_and_paper_rows():
    from lib.sei.analysis import paper_row, table2_frame
    keys = [("vllm-internvl3.5-8b", "fhm", "siglip-so400m/4"), ("vllm-internvl3.5-8b", "mami", "siglip-so400m/4"),
            ("vllm-internvl3.5-8b", "fhm", "zero_shot")]
    key = lambda m, d, n: f"{m} · {d} · {n}"
    results = {key(*k): {"acc": 0.7 + i / 10, "macro_f1": 0.6, "support": 3} for i, k in enumerate(keys)}
    t = table2_frame(keys, results, key, "paper")
    assert list(t.index) == [("vllm-internvl3.5-8b", "siglip-so400m", 4)]       # controls are not grid rows
    assert t.loc[("vllm-internvl3.5-8b", "siglip-so400m", 4), ("mami", "acc")] == pytest.approx(0.8)
    assert t.loc[("vllm-internvl3.5-8b", "siglip-so400m", 4), ("fhm", "paper acc")] == pytest.approx(0.7355)
    assert paper_row("gpt-4o", "mami", 8)["support"] == 446 and paper_row("smollm2", "fhm", 4) is None
    # Table 2 is SigLIP retrieval: a CLIP or BLIP row never gets its numbers (it did in notebook 04's paper
    # rows, found by the paper-smoke run)
    assert paper_row("vllm-internvl3.5-8b", "fhm", 4, "siglip-so400m") is not None
    assert paper_row("vllm-internvl3.5-8b", "fhm", 4, "clip-vit-l14") is None
    assert paper_row("vllm-internvl3.5-8b", "fhm", 4, "blip-base") is None
    assert ("fhm", "paper acc") not in table2_frame(keys, results, key, "embedded").columns


def test_the_main_setting_is_the_first_retriever_at_four_shots():
    from lib.sei.fewshot import main_setting_name
    assert main_setting_name(["clip", "siglip"], [2, 4, 8]) == "clip/4"
    assert main_setting_name(["clip"], [2, 8]) == "clip/8"


def test_memeworld_definition_carries_the_world_a_moderator_knows():
    """MemeWorld's groups are fictional: its definition names every people and sigil the generator
    draws, the hate gang and the pictures' meanings; the real datasets' definitions name none."""
    import yaml
    from lib import ROOT
    from lib.data.memeworld import GANG, GROUPS
    defs = yaml.safe_load((ROOT / "params/prompts/sei/definitions.yaml").read_text())
    text = " ".join(defs["memeworld"].values())
    for plural, _, _, symbol in GROUPS.values():
        assert plural in text and symbol in text, (plural, symbol)
    assert GANG in text and "sludge rat" in text and "myth stamp" in text
    assert not any(p in " ".join(defs["fhm"].values()) for p, *_ in GROUPS.values())


def test_an_accuracy_interval_counts_every_meme_evaluated():
    """A setting whose answers mostly did not parse is scored over all its memes (unparseable =
    wrong), so its interval is over all of them too, not over the few that parsed."""
    from lib.sei.report import evaluated
    assert evaluated({"n": 5, "n_ok": 5, "n_unparseable": 19, "n_refused": 0}) == 24
    assert evaluated({"n": 7}) == 7


def test_a_text_retriever_embeds_the_picture_beside_the_memes_text_and_caches_by_both(tmp_path, monkeypatch):
    import torch
    from PIL import Image
    from lib.sei import retrieval
    from lib.sei.fewshot import Meme
    calls = []

    class Fake:
        def encode_images(self, ims):
            calls.append(("images", len(ims)))
            return torch.nn.functional.normalize(torch.tensor([[1.0, 0.0]] * len(ims)), dim=-1)

        def encode_texts(self, texts):
            calls.append(("texts", list(texts)))
            return torch.tensor([[0.0, 1.0] if t == "a" else [1.0, 0.0] for t in texts])

    monkeypatch.setattr(retrieval, "load_encoder", lambda name: Fake())
    monkeypatch.setattr(retrieval, "encoder_identity", lambda name: {"model": "fake", "backend": "fake", "code": "x"})
    enc_dir = tmp_path / "enc"
    enc_dir.mkdir()
    memes = []
    for i, text in enumerate(["a", "b", "a"]):
        Image.new("RGB", (4, 4)).save(tmp_path / f"{i}.png")
        memes.append(Meme(str(i), tmp_path / f"{i}.png", text))
    assert retrieval.split_retriever(f"{enc_dir}+text") == (str(enc_dir), True)
    cache = tmp_path / "emb.npz"
    e = retrieval.embed_memes(f"{enc_dir}+text", memes, cache, progress=False)
    assert all(np.linalg.norm(v) == pytest.approx(1.0) for v in e.values())
    assert float(e["0"] @ e["2"]) == pytest.approx(1.0) and float(e["0"] @ e["1"]) == pytest.approx(0.5)   # mean of the two cosines
    calls.clear()
    retrieval.embed_memes(f"{enc_dir}+text", memes, cache, progress=False)
    assert calls == []                                                                  # all cached
    memes[1].ocr = "a"                                                                  # a meme whose text changed
    retrieval.embed_memes(f"{enc_dir}+text", memes, cache, progress=False)
    assert calls == [("images", 1), ("texts", ["a"])]
    plain = retrieval.embed_memes(str(enc_dir), memes, tmp_path / "plain.npz", progress=False)
    assert plain["0"].shape == (2,) and float(plain["0"] @ plain["1"]) == pytest.approx(1.0)


def test_answers_without_any_text_give_empty_tables_and_figures_not_a_key_error():
    """A model whose every call failed (or that wrote no explanation) leaves notebook 04's lexical analysis empty:
    the frame keeps its columns, the intervals table is empty with its columns, and both figures still draw."""
    import matplotlib
    matplotlib.use("Agg")
    from lib.sei import analysis
    failed = [sei.Prediction(str(i), i % 2, "memeworld-clip/4", "failed", None, "", "", False, False, ["a"], [0])
              for i in range(6)]
    ana = analysis.analysis_frame(failed)
    assert len(ana) == 0 and list(ana.columns) == list(analysis.ANALYSIS_COLUMNS)
    ci = analysis.ci_frame(ana, n_resamples=50)
    assert len(ci) == 0 and list(ci.columns) == list(analysis.CI_COLUMNS)
    assert ci.pivot_table(index=["kind", "subgroup"], columns="measure", values=["mean", "n"]).empty
    for fig in (analysis.plot_lexical(ci, "empty"), analysis.plot_sentiment(ana, "empty")):
        assert fig.axes
    # one answer with a text: the same columns, in the same order, as before
    ok = [sei.Prediction("1", 1, "memeworld-clip/4", "ok", 1, "the text calls a group vermin", "be kind", False,
                         False, ["a"], [1])]
    assert list(analysis.analysis_frame(ok).columns) == list(analysis.ANALYSIS_COLUMNS)
