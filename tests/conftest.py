import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

import pytest


@pytest.fixture(scope="session")
def memeworld_small(tmp_path_factory):
    """A small MemeWorld (all views, real formats) shared by the data tests."""
    from lib.memeworld import write_memeworld
    out = tmp_path_factory.mktemp("memeworld")
    sheet = write_memeworld(out, n=600, seed=3, n_multioff=120, workers=1, progress=False)
    return out, sheet


@pytest.fixture(scope="session")
def tiny_clip_dir(tmp_path_factory):
    """A randomly initialised Hugging Face CLIP (3 text layers, eager attention) saved with the
    offline CLIP tokenizer and an image processor: the architecture of every CLIP preset."""
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel
    from lib.embedded_models import build_clip_tokenizer
    tok = build_clip_tokenizer()
    cfg = CLIPConfig(text_config=dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                      num_attention_heads=2, bos_token_id=49406, eos_token_id=49407, pad_token_id=49407),
                     vision_config=dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=2), projection_dim=16)
    torch.manual_seed(0)
    model = CLIPModel(cfg)
    out = tmp_path_factory.mktemp("tiny_clip")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(out)
    return out


@pytest.fixture(autouse=True)
def _private_env_files_log(tmp_path_factory, monkeypatch):
    """Env files a test reads keys from are remembered in a log of the test session's own, never in
    the project's artifacts/.env_files."""
    monkeypatch.setattr("lib.chat.keys.ENV_FILES_LOG", tmp_path_factory.getbasetemp() / "env_files.log")
