"""memeworld-vlm: its own tokenizer, the LLaVA architecture saved in the standard format,
loaded through AutoModelForImageTextToText / AutoProcessor by the chat backend, with the
training prompt equal to what the chat template builds."""
import json

import numpy as np
import pytest
import torch
from PIL import Image

from lib.models.chat import GenParams, load_chat, user
from lib.models.memeworld_vlm import (CAPTION_PROMPT, VlmConfig, generate_captions, prompt_ids, rouge_l, train_memeworld_vlm,
                               train_tokenizer)


@pytest.fixture(scope="module")
def tiny_vlm(memeworld_small, tmp_path_factory):
    from lib.models.embedded import ClipConfig, train_memeworld_clip
    out, _ = memeworld_small
    d = tmp_path_factory.mktemp("models")
    train_memeworld_clip(out, d / "clip", ClipConfig(width=32, layers=1, heads=2, projection_dim=16, epochs=1,
                                                     batch_size=64, eval_pairs=20), progress=False)
    cfg = VlmConfig(vocab_size=400, hidden=32, layers=1, heads=2, intermediate=64, epochs=2, batch_size=32, eval_n=12,
                    max_new_tokens=12)
    res = train_memeworld_vlm(out, d / "clip", d / "vlm", cfg, progress=False)
    return out, d / "vlm", res


def test_tokenizer_round_trips_memeworld_text():
    tok = train_tokenizer(["a red sun on the left", "MY NEW ZORBLIN NEIGHBOURS", CAPTION_PROMPT] * 5, 300)
    for t in ["a red sun on the left", "MY NEW ZORBLIN NEIGHBOURS"]:
        assert tok.decode(tok(t, add_special_tokens=False)["input_ids"]) == t
    assert tok.convert_tokens_to_ids("<image>") != tok.unk_token_id


def test_vlm_trains_saves_and_reports(tiny_vlm):
    _, path, res = tiny_vlm
    curve, m = res["curve"], res["metrics"]
    assert len(curve) == 2 and curve[1]["loss"] < curve[0]["loss"]
    assert 0.0 <= m["vlm_rouge_l"] <= 1.0 and m["vlm_eval_n"] == 12 and m["vlm_train_s"] > 0
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["model_type"] == "llava" and cfg["text_config"]["model_type"] == "llama"
    assert (path / "tokenizer.json").exists() and (path / "processor_config.json").exists() or \
        (path / "preprocessor_config.json").exists()


def test_chat_backend_reproduces_the_training_prompt_and_greedy_captions(tiny_vlm, tmp_path):
    out, path, _ = tiny_vlm
    chat = load_chat(path, cache=tmp_path / "c.sqlite", device="cpu")
    backend = chat.backend
    img = Image.open(sorted((out / "img").iterdir())[0]).convert("RGB")
    # the chat template builds exactly the prompt the model was trained on
    enc = backend.processor.apply_chat_template([user(img, CAPTION_PROMPT)], add_generation_prompt=True,
                                                tokenize=True, return_dict=True, return_tensors="pt")
    assert enc["input_ids"][0].tolist() == prompt_ids(backend.processor)
    r = chat.generate([user(img, CAPTION_PROMPT)], GenParams(max_new_tokens=12))
    assert r.status == "ok" and r.usage["completion_tokens"] > 0
    px = backend.processor.image_processor(images=[img], return_tensors="pt")["pixel_values"]
    batch = generate_captions(backend.model, backend.processor, px, max_new_tokens=12)
    assert batch[0] == r.text
    again = chat.generate([user(img, CAPTION_PROMPT)], GenParams(max_new_tokens=12))
    assert again.from_cache and again.text == r.text and chat.stats.requests == 1


def test_rouge_l_is_one_for_identical_and_lower_otherwise():
    assert rouge_l(["a red sun on the left"], ["a red sun on the left"]) == 1.0
    assert rouge_l(["a blue tree"], ["a red sun on the left"]) < 0.5


def test_batched_generation_equals_one_at_a_time_and_is_cached(tiny_vlm, tmp_path):
    out, path, _ = tiny_vlm
    imgs = [Image.open(p).convert("RGB") for p in sorted((out / "img").iterdir())[:5]]
    convs = [[user(im, CAPTION_PROMPT)] for im in imgs] + [[user(imgs[0], "Describe the image in detail.")]]
    one = load_chat(path, cache=None, device="cpu")
    singles = [one.generate(c, GenParams(max_new_tokens=12)) for c in convs]
    chat = load_chat(path, cache=tmp_path / "b.sqlite", device="cpu")
    assert chat.batch_size > 1
    batched = chat.generate_many(convs, GenParams(max_new_tokens=12), progress=False)
    assert [b.text for b in batched] == [s.text for s in singles]
    assert [b.usage for b in batched] == [s.usage for s in singles]
    again = load_chat(path, cache=tmp_path / "b.sqlite", device="cpu")
    assert [r.text for r in again.generate_many(convs, GenParams(max_new_tokens=12), progress=False)] == \
        [s.text for s in singles] and again.stats.requests == 0


def test_zero_shot_tagger_and_caption_columns(tiny_vlm, tmp_path):
    from lib.trace.captioning import ZeroShotTagger, caption_many, grounded_prompt, tag_caption, trace_records
    from lib.data.records import MemeRecord
    from lib.models.encoders import load_encoder
    out, path, _ = tiny_vlm
    enc = load_encoder(path.parent / "clip", device="cpu")
    vocab = ["sun", "house", "tree", "boat", "cup"]
    paths = sorted((out / "img").iterdir())[:3]
    imgs = [Image.open(p).convert("RGB") for p in paths]
    tagger = ZeroShotTagger(enc, vocab, top_k=2, min_prob=0.0)
    tags = tagger.tags(imgs)
    probs = tagger.scores(imgs)
    assert np.allclose(probs.sum(1), 1.0, atol=1e-5)
    assert all(len(t) == 2 and t[0][0] == vocab[int(np.argmax(p))] for t, p in zip(tags, probs))
    assert "sun" in grounded_prompt([("sun", 0.9)]) and tag_caption([]) == ""
    chat = load_chat(path, cache=tmp_path / "cap.sqlite", device="cpu")
    caps = caption_many(chat, imgs, [CAPTION_PROMPT] * 3, max_new_tokens=8)
    recs = [MemeRecord(str(i), p, "meme text", 0, "train") for i, p in enumerate(paths)]
    rows = trace_records(recs, {"vlm_caption": [c.text for c in caps], "tag_caption": ["", "objects: sun", ""]})
    assert rows[1]["tag_caption"] == "objects: sun" and "tag_caption" not in rows[0]
    assert all(r["vlm_caption"] == c.text for r, c in zip(rows, caps) if c.text)



def test_the_tokenizer_text_ignores_other_views_of_the_world(memeworld_small, tmp_path):
    """A new view written beside the world (a jsonl of its own) must not change memeworld-vlm: its
    tokenizer reads named files only."""
    import shutil
    from lib.models.memeworld_vlm import memeworld_texts
    out, _ = memeworld_small
    world = tmp_path / "w"
    (world / "captions").mkdir(parents=True)
    for rel in ("memeworld.jsonl", "captions/scene_captions.jsonl"):
        shutil.copy(out / rel, world / rel)
    before = memeworld_texts(world)
    (world / "extra").mkdir()
    (world / "extra" / "view.jsonl").write_text('{"text": "an entirely new sentence here"}\n')
    assert memeworld_texts(world) == before and "an entirely new sentence here" not in before
    assert any("sun" in t for t in before)
