"""lib.sei.adapt: the moderator's LoRA examples are what the served model reads for a zero-shot request and
the answer its constrained decoder would write; the shuffled-label control keeps the format and the label
rate; a trained adapter is read back, not retrained."""
from __future__ import annotations

import json
from collections import Counter

import jsonschema
import pytest

from lib.models.llm_adapt import AdaptError, LoraRecipe
from lib.sei import adapt
from lib.sei.fewshot import LABELS, Meme, SeiTemplates, answer_schema

TPL = SeiTemplates.load("params/prompts/sei")


def _memes(n=12):
    return [Meme(str(i), f"/data/img/{i}.png", f"text {i}", label=i % 2, caption=f"caption {i}",
                 explanation=f"The meme {i} is {'hateful' if i % 2 else 'not hateful'}: reason number {i} " * 3,
                 intervention=f"Please do not share meme {i}, it hurts people." if i % 2 else "")
            for i in range(n)]


def _describe(conv):
    return [{"role": m["role"], "content": [p if p["type"] == "text" else {"type": "text", "text": f"[IMG {p['image']}]\n"}
                                            for p in m["content"]]} for m in conv]


def test_the_answer_is_the_compact_json_the_grammar_writes():
    a = adapt.compact_answer(1, "word " * 40, "stop " * 40, 64)
    obj = json.loads(a)
    jsonschema.validate(obj, answer_schema(64))
    assert list(obj) == ["label", "explanation", "intervention"] and obj["label"] == "hateful"
    assert a == json.dumps(obj, separators=(",", ":")) and ": " not in a
    assert len(obj["explanation"]) <= 64 and obj["explanation"].endswith("word")     # cut at a word boundary
    assert json.loads(adapt.compact_answer(0, "fine", "unused", 64))["intervention"] == ""
    with pytest.raises(AdaptError):
        adapt.compact_answer(None, "x", "", 64)


def test_examples_are_the_zero_shot_request_as_the_text_model_reads_it():
    memes = _memes()
    ex = adapt.adaptation_examples(memes, TPL, "memeworld", _describe, string_max_length=64)
    assert len(ex) == len(memes)
    for m, (msgs, ans) in zip(memes, ex):
        assert [x["role"] for x in msgs] == ["system", "user"] and all(isinstance(x["content"], str) for x in msgs)
        assert msgs[0]["content"] == TPL.system_prompt("memeworld")
        assert msgs[1]["content"].startswith(f"[IMG {m.img_path}]") and m.ocr in msgs[1]["content"]
        assert json.loads(ans)["label"] == LABELS[m.label]
    with pytest.raises(AdaptError, match="describe"):
        adapt.adaptation_examples(memes, TPL, "memeworld", None)
    with pytest.raises(AdaptError, match="still holds an image"):
        adapt.adaptation_examples(memes, TPL, "memeworld", lambda c: c)
    no_text = _memes(2)
    no_text[1].explanation = " "
    with pytest.raises(AdaptError, match="meme 1: no gold explanation"):
        adapt.adaptation_examples(no_text, TPL, "memeworld", _describe)


def test_the_shuffled_control_keeps_format_and_label_rate_and_breaks_the_tie_to_the_meme():
    memes = _memes(40)
    real = adapt.adaptation_examples(memes, TPL, "memeworld", _describe, 64)
    ctl = adapt.adaptation_examples(memes, TPL, "memeworld", _describe, 64, shuffle_labels=True, seed=3)
    assert [m for m, _ in ctl] == [m for m, _ in real]                        # the same prompts
    assert Counter(a for _, a in ctl) == Counter(a for _, a in real)          # the same answers, permuted
    moved = sum(json.loads(a)["label"] != LABELS[m.label] for m, (_, a) in zip(memes, ctl))
    assert moved >= 10
    assert ctl == adapt.adaptation_examples(memes, TPL, "memeworld", _describe, 64, shuffle_labels=True, seed=3)


def test_a_trained_adapter_is_read_back_and_a_changed_recipe_retrains(tmp_path, monkeypatch):
    from lib.models import llm_adapt
    calls = []
    monkeypatch.setattr(llm_adapt, "_TRAINED", {})
    monkeypatch.setattr(llm_adapt, "load_base", lambda gguf: ("model", "tok"))
    monkeypatch.setattr(llm_adapt, "train_lora", lambda m, t, ex, r, progress=True: calls.append(len(ex)) or m)
    monkeypatch.setattr(llm_adapt, "write_adapter_gguf", lambda m, p: p.parent.mkdir(parents=True, exist_ok=True)
                        or p.write_bytes(b"gguf") or p)
    ex = adapt.adaptation_examples(_memes(), TPL, "memeworld", _describe, 64)
    path = tmp_path / "a" / "adapter.gguf"
    first = adapt.train_adapter(path, ex, LoraRecipe(), "base.gguf", progress=False)
    again = adapt.train_adapter(path, ex, LoraRecipe(), "base.gguf", progress=False)
    assert (first["cached"], again["cached"]) == (False, True) and calls == [len(ex)]
    assert first["n_examples"] == len(ex) and first["hateful_share"] == 0.5 and path.exists()
    assert (tmp_path / "a" / "training.json").exists()
    adapt.train_adapter(path, ex, LoraRecipe(epochs=2), "base.gguf", progress=False)
    assert calls == [len(ex), len(ex)]


def test_an_adapter_with_the_digest_of_one_already_trained_is_a_copy_and_the_base_loads_once(tmp_path, monkeypatch):
    """A control whose shuffle moved nothing (one post, or one label) has the model's digest: it is the same
    adapter, copied, not trained again; and the base GGUF is read once per process, each training on a copy."""
    from lib.models import llm_adapt
    loads, trained = [], []
    monkeypatch.setattr(llm_adapt, "_TRAINED", {})
    monkeypatch.setattr(llm_adapt, "_BASES", {})
    monkeypatch.setattr(llm_adapt, "load_base", lambda gguf: loads.append(gguf) or ({"w": [0]}, "tok"))
    def fake_train(m, t, ex, r, progress=True):
        assert m == {"w": [0]}                         # an untouched copy of the base every time
        m["w"].append(len(ex))
        trained.append(len(ex))
        return m
    monkeypatch.setattr(llm_adapt, "train_lora", fake_train)
    monkeypatch.setattr(llm_adapt, "write_adapter_gguf", lambda m, p: p.parent.mkdir(parents=True, exist_ok=True)
                        or p.write_bytes(repr(m).encode()) or p)
    ex = adapt.adaptation_examples(_memes(), TPL, "memeworld", _describe, 64)
    a, b, c = (tmp_path / d / "adapter.gguf" for d in ("model", "control", "other"))
    first = llm_adapt.train_cached(a, ex, LoraRecipe(), "base.gguf", progress=False)
    twin = llm_adapt.train_cached(b, ex, LoraRecipe(), "base.gguf", progress=False)
    assert (first["cached"], twin["cached"], twin["same_as"], twin["digest"]) == (False, True, "model", first["digest"])
    assert b.read_bytes() == a.read_bytes() and trained == [len(ex)]
    assert json.loads((b.parent / "training.json").read_text())["adapter"] == "adapter.gguf"
    assert llm_adapt.train_cached(b, ex, LoraRecipe(), "base.gguf", progress=False)["cached"]   # read back
    llm_adapt.train_cached(c, ex[:-1], LoraRecipe(), "base.gguf", progress=False)          # other examples: trained
    assert trained == [len(ex), len(ex) - 1] and loads == ["base.gguf"]


def test_training_memes_carry_the_gold_texts_balanced_by_type_and_look_only_at_the_pool():
    pool = [Meme(str(i), f"{i}.png", f"t{i}", label=i % 2, type=f"{i % 4:03b}") for i in range(40)]
    gold = {"explanation": {str(i): [f"why {i}", "another"] for i in range(40) if i != 6},
            "intervention": {str(i): [f"stop {i}"] for i in range(40) if i % 2 and i != 7},
            "unused": {"99": ["a test meme's text"]}}
    ms = adapt.training_memes(pool, gold, n=16, seed=1)
    assert len(ms) == 16 and {"6", "7"}.isdisjoint(m.id for m in ms)        # no explanation / no intervention
    assert Counter(m.type for m in ms) == Counter({t: 4 for t in ("000", "001", "010", "011")})
    m = next(m for m in ms if m.label == 1)
    assert m.explanation == f"why {m.id}" and m.intervention == f"stop {m.id}" and m.caption == ""
    assert all(x.intervention == "" for x in ms if x.label == 0)
    assert ms == adapt.training_memes(pool, gold, n=16, seed=1)
    assert len(adapt.training_memes(pool, gold, n=1000)) == 38
    with pytest.raises(AdaptError, match="no training meme"):
        adapt.training_memes(pool, {}, n=4)


def test_the_preset_says_where_the_adapter_lives():
    from lib.compendium.presets import PresetError
    spec = adapt.served_adapter("smollm2-135m-instruct-compact-moderator+memeworld-captions")
    assert spec["served"] == "smollm2-135m-instruct-compact-moderator"
    assert spec["adapter"].name == "adapter.gguf" and spec["adapter"].parent.name == "moderator_adapter"
    assert spec["base"].endswith(".gguf")
    assert adapt.served_adapter("smollm2-135m-instruct-compact-shuffled")["adapter"].parent.name == \
        "moderator_adapter_shuffled"
    with pytest.raises(PresetError, match="lora"):
        adapt.served_adapter("smollm2-135m-instruct-compact+memeworld-captions")


def test_the_loaded_base_is_kept_on_disk_once_per_profile_and_content(tmp_path, monkeypatch):
    """Reading the GGUF's tokenizer and dequantizing its weights costs about 25 s a process: the loaded base is
    kept in the profile's models folder, named by the file's content, and an unreadable copy is loaded afresh."""
    from lib.compendium.artifacts import ARTIFACTS_ROOT
    from lib.models import llm_adapt
    base, cache, loads = tmp_path / "base.gguf", tmp_path / "cache", []
    base.write_bytes(b"weights v1")
    monkeypatch.setattr(llm_adapt, "load_base", lambda gguf: loads.append(gguf) or ({"w": [len(loads)]}, "tok"))
    first = llm_adapt.load_base_cached(str(base), cache)
    assert llm_adapt.load_base_cached(str(base), cache) == first == ({"w": [1]}, "tok") and len(loads) == 1
    (kept,) = cache.iterdir()
    kept.write_bytes(b"not a pickle")                                   # a foreign or broken copy: loaded afresh
    assert llm_adapt.load_base_cached(str(base), cache) == ({"w": [2]}, "tok")
    assert llm_adapt.load_base_cached(str(base), cache) == ({"w": [2]}, "tok") and len(loads) == 2   # replaced
    base.write_bytes(b"weights v2")                                     # another base: its own copy
    assert llm_adapt.load_base_cached(str(base), cache) == ({"w": [3]}, "tok") and len(list(cache.iterdir())) == 2
    assert llm_adapt.load_base_cached(str(base), None) == ({"w": [4]}, "tok") and len(list(cache.iterdir())) == 2
    assert (llm_adapt.base_cache_dir(ARTIFACTS_ROOT / "ci" / "05_debate" / "judge_adapter" / "adapter.gguf")
            == ARTIFACTS_ROOT / "ci" / "models" / "llm-base")
    assert llm_adapt.base_cache_dir(tmp_path / "judge" / "adapter.gguf") is None
    with pytest.raises(llm_adapt.AdaptError, match="does not exist"):
        llm_adapt.load_base_cached(str(tmp_path / "missing.gguf"), cache)
