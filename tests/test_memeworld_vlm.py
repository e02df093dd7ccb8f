"""memeworld-vlm: its own tokenizer, the LLaVA architecture saved in the standard format,
loaded through AutoModelForImageTextToText / AutoProcessor by the chat backend, with the
training prompt equal to what the chat template builds."""
import json

import pytest
import torch
from PIL import Image

from lib.chat import GenParams, load_chat, user
from lib.memeworld_vlm import (CAPTION_PROMPT, VlmConfig, generate_captions, prompt_ids, rouge_l, train_memeworld_vlm,
                               train_tokenizer)


@pytest.fixture(scope="module")
def tiny_vlm(memeworld_small, tmp_path_factory):
    from lib.embedded_models import ClipConfig, train_memeworld_clip
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
