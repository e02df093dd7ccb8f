"""The GPU paths, on one CUDA GPU (`make test-gpu`; never in CI, which has none): TRACE's bf16
training, CLIP4DM's batched attribution, an agent's mixed-precision training step, HF chat
generation, and where each model is placed. On a machine without a GPU every test skips; on a
machine with a GPU this torch cannot use, the first test fails with the reason instead of the
rest running silently on the CPU."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lib.compendium.presets import DeviceError, default_device, gpu_present

pytestmark = pytest.mark.gpu


def _need_cuda():
    if not torch.cuda.is_available():
        if gpu_present():
            pytest.fail(f"a GPU is attached but torch {torch.__version__} (CUDA {torch.version.cuda}) cannot use it")
        pytest.skip("no GPU on this machine")


def test_this_torch_uses_the_gpu_and_models_default_to_it(tiny_clip_dir):
    if not torch.cuda.is_available() and gpu_present():
        with pytest.raises(DeviceError, match="cannot use"):
            default_device()
    _need_cuda()
    from lib.models.encoders import load_encoder
    assert default_device() == "cuda"
    enc = load_encoder(str(tiny_clip_dir))                                 # no device given: the GPU
    assert torch.device(enc.device).type == "cuda"
    assert all(p.device.type == "cuda" for p in enc.model.parameters())


def _memes(tmp_path, n=24):
    from PIL import Image
    from lib.data.records import MemeRecord
    rng = np.random.default_rng(0)
    recs = []
    for i in range(n):
        p = tmp_path / f"{i}.png"
        Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(p)
        caps = {"vlm_caption": f"a red sun number {i % 5}"} if i % 3 else {}
        recs.append(MemeRecord(str(i), p, f"meme text {i} about zorblins", i % 2, ["train", "dev_seen", "test_seen"][i % 3],
                               captions=caps))
    return recs


def test_trace_trains_with_bf16_autocast_on_the_gpu(tiny_clip_dir, tmp_path):
    _need_cuda()
    from lib.models.encoders import load_encoder
    from lib.trace.model import TrainConfig
    from lib.trace.features import FeatureCache, MemeBatchData
    from lib.trace.runs import run_variant
    data = MemeBatchData.from_records(_memes(tmp_path), ["vlm_caption"])
    make = lambda: load_encoder(str(tiny_clip_dir), device="cuda")                  # noqa: E731
    cache = lambda e: FeatureCache(e, data, lowest_unfrozen=2, progress=False)      # noqa: E731
    from lib.trace.runs import load_trained
    for amp in (True, False):                                               # bf16 autocast, then fp32
        cfg = TrainConfig(hidden=16, epochs=3, batch_size=4, lr=1e-2, patience=10, amp=amp)
        r = run_variant(tmp_path / f"amp_{amp}", data, "tiny", cfg, make, cache, progress=False)
        assert r["trained"] and all(np.isfinite(c["loss"]) for c in r["curve"])
        probs = np.array([p["probability"] for p in r["eval"]["predictions"]])
        assert np.isfinite(probs).all() and ((0 <= probs) & (probs <= 1)).all()
        trainer, _ = load_trained(tmp_path / f"amp_{amp}", data, make)          # the checkpoint loads onto the GPU
        assert all(p.device.type == "cuda" for p in trainer.model.parameters())


def test_clip4dm_batched_attribution_on_the_gpu_matches_one_at_a_time_and_the_cpu(tiny_clip_dir):
    _need_cuda()
    from PIL import Image
    from lib.clip4dm.method import CLIP4DM
    rng = np.random.default_rng(1)
    imgs = [Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)) for _ in range(6)]
    caps = ["a red sun on the left", "a cup of coke", "two blue boats", "a crossed-out flame sigil",
            "a grey hand emblem", "a brown sludge rat"]
    gpu = CLIP4DM.from_pretrained(str(tiny_clip_dir), device="cuda", epsilon=0.0)
    cpu = CLIP4DM.from_pretrained(str(tiny_clip_dir), device="cpu", epsilon=0.0)
    batched = gpu.batch(imgs, caps)
    for k, (im, c) in enumerate(zip(imgs, caps)):
        one, ref = gpu(im, c), cpu(im, c)
        for a, b, tol in ((batched[k], one, 1e-5), (one, ref, 1e-4)):
            assert [w for w, _ in a["all_word_attributions"]] == [w for w, _ in b["all_word_attributions"]]
            np.testing.assert_allclose([s for _, s in a["all_word_attributions"]],
                                       [s for _, s in b["all_word_attributions"]], atol=tol, rtol=1e-3)
            assert a["clip_score"] == pytest.approx(b["clip_score"], abs=1e-4)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_an_agent_trains_in_mixed_precision_and_generates_on_the_gpu(tiny_paligemma, tmp_path, precision):
    _need_cuda()
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    from PIL import Image
    from lib.sei.agents import AgentRecipe, agent_chat, build_agent_data, run_agent, train_agent
    from lib.models.chat import ResponseCache
    from lib.data.records import ExplanationRecord, MemeCapRecord, MemeRecord, MemeSenseRecord
    memes, cap, hat, sense = [], [], [], []
    for i in range(12):
        p = tmp_path / f"{i:05d}.png"
        Image.new("RGB", (32, 32), (20 * i, 100, 200 - 10 * i)).save(p)
        memes.append(MemeRecord(str(i), p, f"text {i}", i % 2, "test_seen" if i >= 9 else "train"))
        cap.append(MemeCapRecord(f"{i:05d}", p, f"text {i}", ["x"], [f"meaning {i}"], [], "test" if i >= 9 else "trainval"))
        hat.append(ExplanationRecord(str(i), p, ["group"] if i % 2 else [], [f"because {i}"],
                                     "test" if i >= 9 else "train"))
        if i % 2:
            sense.append(MemeSenseRecord(f"{i:05d}", p, f"commonsense {i}", f"intervene {i}"))
    data = build_agent_data(cap, hat, sense, memes)
    torch.cuda.reset_peak_memory_stats()
    rec = train_agent(data["explainer"], tmp_path / "agent", AgentRecipe(base=str(tiny_paligemma), epochs=1, lr=1e-3,
                                                                        batch_size=4, mixed_precision=precision),
                      "explain why {label} {ocr}", progress=False)
    assert np.isfinite(rec["curve"][0]["loss"]) and torch.cuda.max_memory_allocated() > 0   # it ran on the GPU
    chat = agent_chat(tmp_path / "agent", ResponseCache(tmp_path / "c.sqlite"))
    assert chat.backend.device == "cuda" and next(chat.backend.model.parameters()).device.type == "cuda"
    test = [e for e in data["explainer"] if e.split == "test"]
    res = run_agent(chat, "explain why {label} {ocr}", [(e.img_path, e.inputs) for e in test], 5, progress=False)
    assert [r.status for r in res] == ["ok"] * len(test)


def test_the_paper_agent_recipe_at_full_shape_trains_within_its_estimate_or_is_refused(tmp_path):
    """One step of params/paper.yaml's agent recipe on a random PaliGemma-3B-448 (its full shape, bf16) through
    train_agent: on a GPU with room it trains, with a finite loss and a peak within 25% of lib.models.train_memory's
    estimate; on a smaller one it is refused before training, naming settings that fit."""
    _need_cuda()
    from lib.models import smoke as smoke_models
    from lib.sei.agents import AgentRecipe, gpu_free_bytes, train_agent
    from lib.compendium.measure import long_examples
    from lib.compendium.params import load_profile
    from lib.models.train_memory import GIB, RecipeMemoryError
    base = smoke_models.paligemma(tmp_path / "pg3b", full_shape=True, device="cuda")
    torch.cuda.empty_cache()
    examples = long_examples(tmp_path / "memes", 10, words=80)         # about 1,450 of max_len's 1,536 tokens
    section = load_profile("paper")["04_few_shot"]["agent_recipe"]
    recipe = AgentRecipe(base=str(base), **{**section, "epochs": 1, "max_train": section["batch_size"]})
    free = gpu_free_bytes()
    torch.cuda.reset_peak_memory_stats()
    try:
        rec = train_agent(examples, tmp_path / "agent", recipe, "explain why {label} {ocr}", progress=False)
    except RecipeMemoryError as e:
        assert "settings with the same effective batch that fit" in str(e) or "no batch size fits" in str(e)
        pytest.skip(f"refused on a GPU with {free / GIB:.1f} GiB free, as it should be: {e}")
    peak = torch.cuda.max_memory_allocated() / GIB
    print(f"paper agent recipe, one step at full shape: peak {peak:.1f} GiB, estimate {rec['memory_estimate_gib']} GiB, "
          f"{rec['train_s']:.1f} s for {rec['n_train']} examples, torch {torch.__version__}")
    assert np.isfinite(rec["curve"][0]["loss"]) and rec["gradient_checkpointing"]
    assert peak <= 1.25 * rec["memory_estimate_gib"]


def test_clip4dm_from_image_files_is_reported_against_its_floor(tmp_path, capsys):
    """CLIP4DM at B/32's shape from meme-sized PNG files, with the loader's threads and without, against the
    same pairs with the pixels ready: reported as a ratio (a speed is not asserted: it depends on the machine).
    `python -m lib.compendium.costs --measure` writes the same rows for every shape."""
    _need_cuda()
    from lib.compendium.measure import markdown, measure_clip4dm
    rec = measure_clip4dm(shapes=("B/32",), batch_sizes=(256,), n=1024, work=tmp_path)
    workers = [r["workers"] for r in rec["runs"]]
    assert workers[0] >= 1 and workers[-1] == 0
    assert all(r["ratio"] > 0 and r["floor_pairs_per_s"] > 0 for r in rec["runs"])
    with capsys.disabled():
        print("\n" + markdown({"clip4dm": rec}))
