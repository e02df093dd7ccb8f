"""memeworld-clip: an offline Hugging Face CLIP tokenizer equal to open_clip's, and a model
that trains on MemeWorld and round-trips through the standard Hugging Face format."""
import json

import pytest
import torch

from lib.models.embedded import ClipConfig, build_clip_tokenizer, train_memeworld_clip

STRINGS = ["A photo depicts a red sun on the left and a crossed-out spiral sigil.",
           "hello   World!! naïve café 123", "they're  vermin", "MY NEW ZORBLIN NEIGHBOURS BE LIKE"]


@pytest.mark.parametrize("text", STRINGS)
def test_hf_tokenizer_equals_open_clip(text):
    from open_clip import tokenizer as oc
    hf = build_clip_tokenizer()
    ref = oc.tokenize([text])[0]
    ref = ref[: int((ref > 0).sum())].tolist()
    assert hf(text)["input_ids"] == ref
    assert hf.convert_ids_to_tokens(ref[0]) == "<|startoftext|>" and hf.convert_ids_to_tokens(ref[-1]) == "<|endoftext|>"


def test_tiny_clip_trains_and_round_trips_in_hf_format(memeworld_small, tmp_path):
    from transformers import AutoTokenizer, CLIPImageProcessor, CLIPModel
    out, _ = memeworld_small
    cfg = ClipConfig(width=32, layers=1, heads=2, projection_dim=16, epochs=2, batch_size=32, eval_pairs=50)
    res = train_memeworld_clip(out, tmp_path / "clip", cfg, progress=False)
    curve = res["curve"]
    assert len(curve) == 2 and curve[1]["loss"] < curve[0]["loss"]  # it learns
    m = res["metrics"]
    assert 0.0 <= m["clip_foil_pair_acc"] <= 1.0 and m["clip_eval_pairs"] == 50
    model = CLIPModel.from_pretrained(tmp_path / "clip", attn_implementation="eager").eval()
    tok = AutoTokenizer.from_pretrained(tmp_path / "clip")
    proc = CLIPImageProcessor.from_pretrained(tmp_path / "clip")
    from PIL import Image
    img = Image.open(out / "img" / sorted(p.name for p in (out / "img").iterdir())[0])
    px = proc(images=img, return_tensors="pt")["pixel_values"]
    assert px.shape == (1, 3, 64, 64)
    enc = tok(["a red sun on the left", "a blue tree on the right"], padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**enc, pixel_values=px).logits_per_image
    assert logits.shape == (1, 2) and torch.isfinite(logits).all()
    saved = json.loads((tmp_path / "clip" / "training.json").read_text())
    assert saved["config"]["width"] == 32 and saved["metrics"]["clip_train_s"] > 0


def test_leak_free_training_never_sees_a_test_caption(memeworld_small, tmp_path):
    """The hard-negative ablation's models drop every pair whose caption or foil some benchmark
    scores; the main model keeps them and says how many it trained on."""
    from lib.models.embedded import test_captions
    out, _ = memeworld_small
    test = test_captions(out)
    foil = json.loads((out / "foil" / "foil_test.json").read_text())
    nocaps = json.loads((out / "nocaps_foil" / "nocaps_foil.json").read_text())
    assert {a["caption"] for a in foil["annotations"]} <= test and {n["foil"] for n in nocaps} <= test
    rows = [json.loads(l) for l in (out / "captions" / "scene_captions.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["split"] == "train"]
    overlap = sum(r["caption"] in test or r["foil"] in test for r in train)
    assert overlap > 0                       # the small world has the leak this guards against
    tiny = dict(width=32, layers=1, heads=2, projection_dim=16, epochs=1, batch_size=32, eval_pairs=20)
    m = {}
    for name, cfg in (("main", ClipConfig(**tiny)), ("free", ClipConfig(**tiny, leak_free=True)),
                      ("free_nohn", ClipConfig(**tiny, leak_free=True, hard_negatives=False))):
        m[name] = train_memeworld_clip(out, tmp_path / name, cfg, progress=False)["metrics"]
    assert m["main"]["clip_train_pairs"] == len(train) and m["main"]["clip_train_pairs_with_test_caption"] == overlap
    for name in ("free", "free_nohn"):
        assert m[name]["clip_train_pairs"] == len(train) - overlap == len(train) - m[name]["clip_train_pairs_dropped"]
        assert m[name]["clip_train_pairs_with_test_caption"] == 0


@pytest.mark.parametrize("texts", [["a red sun on the left", "a blue tree in the middle and a black cup on the right",
                                    "a crossed-out zigzag sigil"]])
def test_pretokenised_batches_equal_the_tokenizer_padding(texts):
    """Training tokenises every caption once and pads per batch: the same tensors as `padding=True`."""
    from lib.models.embedded import pad_batch
    tok = build_clip_tokenizer()
    ids, mask = pad_batch(tok(texts)["input_ids"], tok.pad_token_id)
    ref = tok(texts, padding=True, return_tensors="pt")
    assert torch.equal(ids, ref["input_ids"]) and torch.equal(mask, ref["attention_mask"])
