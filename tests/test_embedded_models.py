"""memeworld-clip: an offline Hugging Face CLIP tokenizer equal to open_clip's, and a model
that trains on MemeWorld and round-trips through the standard Hugging Face format."""
import json

import pytest
import torch

from lib.embedded_models import ClipConfig, build_clip_tokenizer, train_memeworld_clip

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
