import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

import pytest


@pytest.fixture(scope="session")
def memeworld_small(tmp_path_factory):
    """A small MemeWorld (all views, real formats) shared by the data tests."""
    from lib.data.memeworld_files import write_memeworld
    out = tmp_path_factory.mktemp("memeworld")
    sheet = write_memeworld(out, n=600, seed=3, n_multioff=120, workers=1, progress=False)
    return out, sheet


@pytest.fixture(scope="session")
def tiny_clip_dir(tmp_path_factory):
    """A randomly initialised Hugging Face CLIP (3 text layers, eager attention) saved with the
    offline CLIP tokenizer and an image processor: the architecture of every CLIP preset."""
    from lib.models.smoke import clip
    return clip(tmp_path_factory.mktemp("tiny_clip"), patch=8, image_size=32, text_layers=3)


@pytest.fixture()
def tiny(tiny_clip_dir, tmp_path):
    """The tiny CLIP and 24 memes (train / dev_seen / test_seen in turn; every third has no caption)."""
    import numpy as np
    from PIL import Image
    from lib.data.records import MemeRecord
    from lib.models.encoders import load_encoder
    from lib.trace.features import MemeBatchData
    rng = np.random.default_rng(0)
    recs = []
    for i in range(24):
        p = tmp_path / f"{i}.png"
        Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(p)
        caps = {"vlm_caption": f"a red sun number {i % 5}"} if i % 3 else {}
        recs.append(MemeRecord(str(i), p, f"meme text {i} about zorblins", i % 2, ["train", "dev_seen", "test_seen"][i % 3],
                               captions=caps))
    data = MemeBatchData.from_records(recs, ["vlm_caption"])
    return load_encoder(tiny_clip_dir, device="cpu"), data


@pytest.fixture(autouse=True)
def _private_env_files_log(tmp_path_factory, monkeypatch):
    """Env files a test reads keys from are remembered in a log of the test session's own, never in
    the project's artifacts/.env_files."""
    monkeypatch.setattr("lib.models.chat.keys.ENV_FILES_LOG", tmp_path_factory.getbasetemp() / "env_files.log")


@pytest.fixture(scope="session")
def tiny_paligemma(tmp_path_factory):
    """A randomly initialised PaliGemma (the paper's agent architecture, no chat template); shared by
    the agent tests and the GPU tests."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (GemmaTokenizerFast, PaliGemmaConfig, PaliGemmaForConditionalGeneration,
                              PaliGemmaProcessor, SiglipImageProcessor)
    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(["the meme is hateful", "explain why", "it calls them vermin", "text"] * 10,
                           trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<eos>", "<bos>", "<unk>"],
                                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                               show_progress=False))
    tok = GemmaTokenizerFast(tokenizer_object=tk, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                             unk_token="<unk>")
    ip = SiglipImageProcessor(size={"height": 32, "width": 32})
    ip.image_seq_length = 16
    proc = PaliGemmaProcessor(image_processor=ip, tokenizer=tok)
    tok = proc.tokenizer
    cfg = PaliGemmaConfig(vision_config={"model_type": "siglip_vision_model", "hidden_size": 32,
                                         "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                                         "image_size": 32, "patch_size": 8},
                          text_config={"model_type": "gemma", "vocab_size": len(tok), "hidden_size": 32,
                                       "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                                       "num_key_value_heads": 1, "head_dim": 16, "pad_token_id": tok.pad_token_id,
                                       "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id},
                          projection_dim=32, image_token_index=tok.convert_tokens_to_ids("<image>"))
    torch.manual_seed(0)
    model = PaliGemmaForConditionalGeneration(cfg)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    out = tmp_path_factory.mktemp("paligemma") / "pg"
    model.save_pretrained(out)
    proc.save_pretrained(out)
    return out


@pytest.fixture()
def plan_at(monkeypatch):
    """The analysis plan with every claim's n (and runs) set to a synthetic table's, installed as the plan every
    stage adapter and the findings table load: `plan_at(n=96, runs=1)`. Claims with another unit keep theirs."""
    import dataclasses
    from lib.evaluation import plan as analysis
    real = analysis.load()

    def install(n: int, runs: int = 1, **by_id: int):
        claims = tuple(dataclasses.replace(c, n=by_id.get(c.id.replace(".", "_"), n), runs=min(c.runs, runs))
                       for c in real.claims)
        sized = dataclasses.replace(real, claims=claims)
        monkeypatch.setattr(analysis, "load", lambda path=None: sized)
        return sized
    return install


def run_launch(cmd, timeout: float, env: dict, **kw):
    """subprocess.run for a multi-process launch (torch.distributed.run and its workers): every process it starts
    carries a fresh run id (lib.compendium.procs), and all of them are ended afterwards, whether the launch
    finished, failed or ran past `timeout` (subprocess.run would kill only the launcher, leaving its workers)."""
    import subprocess
    import uuid
    from lib.compendium import procs
    rid = f"test-launch-{uuid.uuid4().hex[:8]}"
    env = {**env, procs.RUN_IDS_ENV: ":".join(x for x in (env.get(procs.RUN_IDS_ENV), rid) if x)}
    try:
        return subprocess.run(cmd, env=env, timeout=timeout, **kw)
    finally:
        procs.end_processes(rid, grace_s=1.0)
