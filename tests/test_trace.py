"""TRACE building blocks on a tiny CLIP: cached frozen-prefix features equal the full backbone,
the classifier and its losses follow the specification, thresholds come from validation."""
import re
import numpy as np
import pytest
import torch

from lib.data.records import MemeRecord
from lib.models.encoders import load_encoder
from lib.evaluation.metrics import best_threshold, mcnemar, metrics_at
from lib.trace.model import CLIPClassifier, TrainConfig, focal_bce, gumbel_tau, trace_loss
from lib.trace.training import Trainer
from lib.trace.features import FeatureCache, MemeBatchData, batch_features


def _cached_equals_uncached(enc, data, rows, cache):
    with torch.no_grad():
        a = batch_features(enc, data, rows, cache)
        b = batch_features(enc, data, rows, None)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)
    return a


def test_cached_features_equal_the_full_backbone(tiny):
    enc, data = tiny
    cache = FeatureCache(enc, data, lowest_unfrozen=2, batch_size=7, progress=False)
    rows = np.arange(10)
    a = _cached_equals_uncached(enc, data, rows, cache)
    assert a[4][:, 1].tolist() == [bool(i % 3) for i in range(10)]      # missing captions are masked


@pytest.mark.parametrize("workers", [1, 3])
def test_the_feature_cache_reads_images_on_loader_threads_with_the_same_features(tiny, workers):
    """On a GPU the cache decodes the next memes' files on threads while the encoder runs: the same
    features, bit for bit, as reading them in line (what a CPU does by default)."""
    enc, data = tiny
    inline = FeatureCache(enc, data, lowest_unfrozen=2, batch_size=7, progress=False, loader_workers=0)
    threaded = FeatureCache(enc, data, lowest_unfrozen=2, batch_size=7, progress=False, loader_workers=workers)
    assert torch.equal(inline.image_feat, threaded.image_feat) and torch.equal(inline.image_emb, threaded.image_emb)


def test_half_precision_cache_halves_the_hidden_states_and_stays_close(tiny):
    enc, data = tiny
    full = FeatureCache(enc, data, lowest_unfrozen=1, progress=False)
    half = FeatureCache(enc, data, lowest_unfrozen=1, progress=False, store_dtype="float16")
    assert half.hidden.dtype == torch.float16
    assert half.hidden.shape == full.hidden.shape and 2 * half.hidden.element_size() == full.hidden.element_size()
    assert half.nbytes < full.nbytes
    rows = np.arange(10)
    with torch.no_grad():
        a = batch_features(enc, data, rows, full)
        b = batch_features(enc, data, rows, half)
    torch.testing.assert_close(b[2], a[2], rtol=1e-2, atol=1e-2)          # caption features
    assert not torch.equal(b[2], a[2])                                    # rounded, not the same path
    with pytest.raises(ValueError, match="store_dtype"):
        FeatureCache(enc, data, lowest_unfrozen=1, progress=False, store_dtype="int8")


def test_classifier_selects_one_caption_in_training_and_softmax_at_inference():
    m = CLIPClassifier(8, 6, hidden=32, heads=4)
    img, caps = torch.randn(5, 8), torch.randn(5, 3, 6)
    mask = torch.tensor([[1, 1, 0]] * 5, dtype=torch.bool)
    m.train()
    out = m(img, caps, mask, tau=0.5)
    assert torch.all(out["weights"].sum(-1) == 1) and torch.all(out["weights"][:, 2] == 0)
    assert set(out["weights"].unique().tolist()) <= {0.0, 1.0}              # hard Gumbel selection
    m.eval()
    out = m(img, caps, mask)
    assert torch.all(out["weights"][:, 2] < 1e-6) and torch.all((out["weights"] > 0).sum(-1) >= 2)
    assert out["logit"].shape == (5,) and m.log_vars.shape == (3,)


def test_losses_follow_the_specification():
    logit, y = torch.tensor([2.0, -1.0]), torch.tensor([1.0, 0.0])
    p = torch.sigmoid(logit)
    bce = -(torch.log(p[0]) + torch.log(1 - p[1])) / 2
    focal = (0.25 * (1 - p[0]) ** 2 * -torch.log(p[0]) + 0.75 * p[1] ** 2 * -torch.log(1 - p[1])) / 2
    assert focal_bce(logit, y).item() == pytest.approx((0.9 * focal + 0.1 * bce).item(), rel=1e-5)
    assert gumbel_tau(0, 30) == 1.0 and gumbel_tau(29, 30) == pytest.approx(max(1 - 0.9 * 29 / 30, 0.1))
    assert gumbel_tau(40, 30) == 0.1
    assert gumbel_tau(5, 10, start=2.0, decay=1.0, floor=0.5) == pytest.approx(1.5)
    out = {"logit": logit, "scores": torch.tensor([[1.0, 3.0], [0.0, -2.0]]), "img_proj": torch.randn(2, 4),
           "txt_proj": torch.randn(2, 4)}
    mask = torch.tensor([[True, True], [True, False]])
    s = torch.tensor([0.3, -0.2, 0.0])
    total, parts = trace_loss(out, y, mask, ("cls", "rel"), s)
    rel = focal_bce(torch.tensor([2.0, 0.0]), y)
    expect = torch.exp(-s[0]) * parts["cls"] + 0.5 * s[0] + torch.exp(-s[1]) * rel + 0.5 * s[1]
    assert total.item() == pytest.approx(expect.item(), rel=1e-5)
    fixed, _ = trace_loss(out, y, mask, ("cls", "con", "rel"), None, {"cls": 1.0, "con": 0.3, "rel": 0.7},
                          contrastive_features="head")
    assert fixed.item() > 0


def test_threshold_from_validation_and_mcnemar():
    pv, yv = np.array([0.1, 0.4, 0.6, 0.9]), np.array([0, 0, 1, 1])
    t = best_threshold(pv, yv)
    assert metrics_at(pv, yv, t)["accuracy"] == 1.0 and 0.4 < t <= 0.6
    r = mcnemar([True] * 30 + [False] * 10, [True] * 20 + [False] * 20)
    assert r["b"] == 10 and r["c"] == 0 and r["pvalue"] < 0.05


def test_trainer_runs_cached_and_reports_honest_thresholds(tiny):
    enc, data = tiny
    cache = FeatureCache(enc, data, lowest_unfrozen=2, progress=False)
    cfg = TrainConfig(hidden=32, epochs=2, batch_size=4, grad_accum=2, lr=1e-3, unfreeze_text_layers=(-1,))
    before = enc.text_layers()[-1].mlp.fc1.weight.detach().clone()
    frozen = enc.text_layers()[0].mlp.fc1.weight.detach().clone()
    tr = Trainer(enc, data, cfg, cache, progress=False)
    sp = np.array(data.splits)
    tr.fit(np.where(sp == "train")[0], np.where(sp == "dev_seen")[0])
    ev = tr.evaluate(np.where(sp == "dev_seen")[0], {"test_seen": np.where(sp == "test_seen")[0]})
    assert len(tr.curve) >= 1 and "accuracy_optimistic_threshold_on_test" in ev["splits"]["test_seen"]
    assert {p["threshold"] for p in ev["predictions"]} == {ev["threshold"]}
    assert not torch.equal(before, enc.text_layers()[-1].mlp.fc1.weight)      # the unfrozen layer trained
    assert torch.equal(frozen, enc.text_layers()[0].mlp.fc1.weight)           # the frozen one did not


def test_lora_trains_only_adapters_on_the_chosen_layers(tiny):
    enc, data = tiny
    cache = FeatureCache(enc, data, lowest_unfrozen=2, progress=False)
    cfg = TrainConfig(hidden=32, epochs=1, batch_size=4, lr=1e-2, unfreeze_text_layers=(-1,), lora_rank=2)
    base = {n: p.detach().clone() for n, p in enc.model.named_parameters()}
    tr = Trainer(enc, data, cfg, cache, progress=False)
    trainable = [n for n, p in enc.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n and "encoder.layers.2." in n for n in trainable)
    assert {n.split(".self_attn.")[1].split(".")[0] for n in trainable} == {"q_proj", "v_proj"}
    tr.epoch(np.where(np.array(data.splits) == "train")[0], 0)
    after = {n.replace(".base_layer", ""): p for n, p in enc.model.named_parameters()}
    assert all(torch.equal(base[n], after[n]) for n in base)                # the pretrained weights are untouched
    assert any(not torch.equal(p, torch.zeros_like(p)) for n, p in after.items() if "lora_B" in n)


@pytest.mark.parametrize("arch", ["open_clip_hf_text", "open_clip", "hf_siglip2"])
def test_other_backbones_train_cached_with_the_same_features(arch, tiny, tmp_path):
    """CLIP-(XLM-)RoBERTa (open_clip HF tower), native open_clip and SigLIP2 go through the same
    cache and trainer: cached batch features equal the full backbone's, one epoch trains."""
    from test_encoders import _hf_siglip2, _open_clip_hf_text, _open_clip_native
    from lib.models.embedded import build_clip_tokenizer
    from lib.trace.model import lora_targets
    _, data = tiny
    enc = {"open_clip_hf_text": lambda: _open_clip_hf_text(tmp_path)[0], "open_clip": lambda: _open_clip_native()[0],
           "hf_siglip2": lambda: _hf_siglip2(build_clip_tokenizer())[0]}[arch]()
    cache = FeatureCache(enc, data, lowest_unfrozen=1, batch_size=5, progress=False)
    _cached_equals_uncached(enc, data, np.arange(9), cache)
    tr = Trainer(enc, data, TrainConfig(hidden=16, epochs=1, batch_size=6, lr=1e-3, unfreeze_text_layers=(-1,),
                                        sigmoid_contrastive=arch == "hf_siglip2", loss_config="all"),
                 cache, progress=False)
    before = [p.detach().clone() for p in enc.text_layers()[-1].parameters()]
    assert np.isfinite(tr.epoch(np.where(np.array(data.splits) == "train")[0], 0)["loss"])
    assert any(not torch.equal(x, y) for x, y in zip(before, enc.text_layers()[-1].parameters()))
    assert lora_targets(enc, [1])                                             # LoRA finds its targets here too


def test_two_processes_stay_in_sync(tiny_clip_dir, tmp_path):
    """Multi-process training (accelerate, gloo on CPU): each process trains on its share of every
    batch and gradients are averaged, so both processes end with identical weights that moved."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = Path(__file__).resolve().parents[1]
    # torch elastic writes its run folders under the temp dir: keep them inside this test's
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path / "tmp")}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        "--master_addr", "127.0.0.1", "--master_port", str(port),
                        str(root / "tests" / "dist_train_worker.py"), str(tiny_clip_dir), str(tmp_path)],
                       cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    assert a["world"] == b["world"] == 2
    assert a["state"].keys() == b["state"].keys()
    for k in a["state"]:
        torch.testing.assert_close(a["state"][k], b["state"][k], rtol=0, atol=1e-6)
    init = load_encoder(tiny_clip_dir, device="cpu").text_layers()[-1].mlp.fc1.weight
    assert not torch.equal(a["state"]["enc.text_model.encoder.layers.2.mlp.fc1.weight"], init)


def test_the_same_run_twice_gives_the_same_model(tiny):
    enc0, data = tiny
    cache = FeatureCache(enc0, data, lowest_unfrozen=2, progress=False)
    rows = np.where(np.array(data.splits) == "train")[0]
    probs = []
    for _ in range(2):
        enc = load_encoder(enc0.preset.model, device="cpu")
        tr = Trainer(enc, data, TrainConfig(hidden=16, epochs=1, batch_size=4, lr=1e-2, unfreeze_text_layers=(-1,)),
                     cache, progress=False)
        tr.epoch(rows, 0)
        probs.append(tr.predict(np.arange(len(data.ids)))[0])
    assert np.array_equal(probs[0], probs[1])


def test_importing_trace_fixes_the_cublas_workspace_for_deterministic_gpu_runs():
    import os
    import subprocess
    import sys
    code = "import os, lib.trace.model; print(os.environ['CUBLAS_WORKSPACE_CONFIG'])"
    env = {k: v for k, v in os.environ.items() if k != "CUBLAS_WORKSPACE_CONFIG"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ":4096:8"
    out = subprocess.run([sys.executable, "-c", code], env={**env, "CUBLAS_WORKSPACE_CONFIG": ":16:8"},
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ":16:8"                                  # a user's own setting is kept


def test_run_config_layers_section_recipe_and_overrides():
    from lib.trace.model import MULTIOFF_RECIPE
    from lib.trace.runs import run_config
    section = {"backbones": ["a", "b"], "recipes": {"b": {"weight_decay": 0.05, "unfreeze_text_layers": [-2, -5]}},
               "multioff": {"backbone": "c", "epochs": 3}, "lr": 0.5, "unfreeze_text_layers": [-1], "device": None}
    bb, cfg = run_config(section)
    assert bb == "a" and cfg.lr == 0.5 and cfg.weight_decay == 0.01 and cfg.unfreeze_text_layers == (-1,)
    bb, cfg = run_config(section, "b", loss_config="all")
    assert bb == "b" and cfg.weight_decay == 0.05 and cfg.unfreeze_text_layers == (-2, -5) and cfg.loss_config == "all"
    bb, cfg = run_config(section, dataset="multioff")
    assert bb == "c" and cfg.epochs == 3 and cfg.fixed_weights == MULTIOFF_RECIPE["fixed_weights"]
    assert cfg.select_on == "macro_f1" and cfg.lr == 0.5
    assert (cfg.scorer_arch, cfg.gumbel_over, cfg.contrastive_caption, cfg.grad_clip) == ("small", "probs", "argmax", 2.0)
    assert run_config(section, "b", dataset="multioff")[0] == "b"
    with pytest.raises(ValueError, match=r"02_finetuning.recipes.b: unknown key\(s\) epoch "):
        run_config({**section, "recipes": {"b": {"epoch": 3}}}, "b")             # a typo is not dropped silently
    with pytest.raises(ValueError, match=r"02_finetuning.multioff: unknown key\(s\) hiden"):
        run_config({**section, "multioff": {"hiden": 5}}, dataset="multioff")


def test_load_trace_data_reads_notebook_01s_absolute_image_paths(tmp_path):
    """Notebook 01 writes absolute image paths into its TRACE JSON; the loaders' path rule (no
    absolute paths in a dataset file) must not reject the compendium's own artifact."""
    import json
    from PIL import Image
    from lib.trace.runs import load_trace_data
    rows = []
    for i, split in enumerate(["train", "dev_seen", "test_seen"]):
        p = tmp_path / "img" / f"{i}.png"
        p.parent.mkdir(exist_ok=True)
        Image.new("RGB", (8, 8)).save(p)
        rows.append({"id": str(i), "img": str(p.resolve()), "text": f"t{i}", "label": i % 2, "split": split,
                     "cap": f"c{i}"})
    (tmp_path / "trace.json").write_text(json.dumps(rows))
    data = load_trace_data(tmp_path / "trace.json", ["cap"])
    assert list(data.splits) == ["train", "dev_seen", "test_seen"]


# ----------------------------------------------------------------------------- the official code's behaviour
def test_scorer_reads_the_caption_alone_by_default_and_image_plus_caption_as_an_option():
    torch.manual_seed(0)
    m = CLIPClassifier(8, 6, hidden=32, heads=4)
    assert m.caption_scorer[0].in_features == 6                               # the caption feature alone
    m.eval()
    caps, mask = torch.randn(3, 2, 6), torch.ones(3, 2, dtype=torch.bool)
    a, b = m(torch.randn(3, 8), caps, mask), m(torch.randn(3, 8), caps, mask)
    assert torch.equal(a["scores"], b["scores"])                              # the image does not move the scores
    m2 = CLIPClassifier(8, 6, hidden=32, heads=4, scorer_input="image+caption")
    assert m2.caption_scorer[0].in_features == 14


def test_xavier_init_only_on_the_scorer():
    import torch.nn as nn
    torch.manual_seed(0)
    m = CLIPClassifier(8, 6, hidden=32, heads=4)
    scorer = [x for x in m.caption_scorer.modules() if isinstance(x, nn.Linear)]
    assert len(scorer) == 5 and all(torch.count_nonzero(x.bias) == 0 for x in scorer)
    assert torch.count_nonzero(m.image_proj[0].bias) > 0 and torch.count_nonzero(m.head[1].bias) > 0  # PyTorch's default init
    m_all = CLIPClassifier(8, 6, hidden=32, heads=4, xavier="all")
    assert torch.count_nonzero(m_all.image_proj[0].bias) == 0 and torch.count_nonzero(m_all.head[1].bias) == 0


def test_cosine_selection_uses_the_raw_cosine_and_the_temperature_is_an_option():
    """Relevance off: softmax over raw cosines. img [1, 0], captions [1, 0] and [0, 1]: cos 1 and 0,
    weights e/(e+1) = 0.7311 and 0.2689; divided by 0.07 the first takes 1 - 6.2e-7."""
    img_emb = torch.tensor([[1.0, 0.0]])
    cemb = torch.tensor([[[2.0, 0.0], [0.0, 3.0]]])
    caps, mask = torch.randn(1, 2, 6), torch.ones(1, 2, dtype=torch.bool)
    m = CLIPClassifier(8, 6, hidden=32, heads=4).eval()
    w = m(torch.randn(1, 8), caps, mask, cemb, img_emb, relevance=False)["weights"][0]
    assert w.tolist() == pytest.approx([0.7311, 0.2689], abs=1e-4)
    m7 = CLIPClassifier(8, 6, hidden=32, heads=4, selection_temperature=0.07).eval()
    w7 = m7(torch.randn(1, 8), caps, mask, cemb, img_emb, relevance=False)["weights"][0]
    assert w7[1].item() == pytest.approx(1 / (1 + np.exp(1 / 0.07)), rel=1e-3)


def test_contrastive_loss_compares_clips_embeddings_of_image_and_selected_caption():
    """Official: InfoNCE between the backbone's image embedding and the selected caption's text
    embedding at tau 0.07. a = [[1,0],[0,1]], selected b = [[1,0],[1,0]]: row logits [1/.07, 1/.07]
    and [0, 0] -> CE log 2 each; columns [1/.07, 0] -> ~0 and [1/.07, 0] against target 1 -> 1/.07 + log(1+e^-1/.07)."""
    k = 1 / 0.07
    out = {"logit": torch.zeros(2), "scores": torch.zeros(2, 2), "img_proj": torch.randn(2, 4), "txt_proj": torch.randn(2, 4),
           "img_emb": torch.tensor([[1.0, 0.0], [0.0, 1.0]]), "sel_emb": torch.tensor([[1.0, 0.0], [1.0, 0.0]]),
           "argmax_emb": torch.tensor([[1.0, 0.0], [0.0, 1.0]])}
    y, mask = torch.tensor([1.0, 0.0]), torch.ones(2, 2, dtype=torch.bool)
    _, parts = trace_loss(out, y, mask, ("cls", "con"), torch.zeros(3))
    rows = np.log(2) + np.log(2)
    cols = np.log1p(np.exp(-k)) + (k + np.log1p(np.exp(-k)))
    assert parts["con"] == pytest.approx(0.5 * (rows / 2 + cols / 2), rel=1e-5)
    _, am = trace_loss(out, y, mask, ("cls", "con"), torch.zeros(3), contrastive_caption="argmax")
    assert am["con"] == pytest.approx(np.log1p(np.exp(-k)), abs=1e-7) and am["con"] < parts["con"] / 100  # MultiOFF: argmax pick
    # SigLIP backbones: BCE-with-logits on cos / 0.07 against the identity, over all B^2 pairs
    _, sg = trace_loss(out, y, mask, ("cls", "con"), torch.zeros(3), sigmoid=True)
    sp = lambda x: np.log1p(np.exp(x))                                         # noqa: E731
    assert sg["con"] == pytest.approx((sp(-k) + sp(k) + 2 * np.log(2)) / 4, rel=1e-5)
    _, head = trace_loss(out, y, mask, ("cls", "con"), torch.zeros(3), contrastive_features="head")
    assert head["con"] != pytest.approx(parts["con"])                          # the other features are an option


def test_gumbel_over_sigmoid_probabilities_and_the_small_scorer_for_multioff():
    import torch.nn as nn
    torch.manual_seed(0)
    m = CLIPClassifier(8, 6, hidden=32, heads=4, scorer_arch="small", gumbel_over="probs").eval()
    assert sum(isinstance(x, nn.Linear) for x in m.caption_scorer.modules()) == 3
    caps, mask = torch.randn(2, 3, 6), torch.ones(2, 3, dtype=torch.bool)
    out = m(torch.randn(2, 8), caps, mask)
    torch.testing.assert_close(out["weights"], out["scores"].sigmoid().softmax(-1))


def test_padded_slots_masked_by_default_selectable_as_in_the_official_code():
    caps = torch.zeros(1, 3, 6)
    caps[0, :2] = torch.randn(2, 6)
    mask = torch.tensor([[True, True, False]])
    torch.manual_seed(0)
    m = CLIPClassifier(8, 6, hidden=32, heads=4).eval()
    assert m(torch.randn(1, 8), caps, mask)["weights"][0, 2] < 1e-6
    torch.manual_seed(0)
    m_off = CLIPClassifier(8, 6, hidden=32, heads=4, mask_padded=False).eval()
    assert m_off(torch.randn(1, 8), caps, mask)["weights"][0, 2] > 0.01


def test_official_threshold_is_the_best_f1_point_of_the_pr_curve():
    """probs [0.1, 0.4, 0.35, 0.8], labels [0, 0, 1, 1]: the PR curve's points at 0.1 / 0.35 / 0.4 / 0.8
    have F1 0.667 / 0.8 / 0.5 / 0.667, so the official threshold is 0.35 (best accuracy would tie
    0.35, 0.5 and 0.8 and pick the lowest candidate)."""
    from lib.evaluation.metrics import pr_best_f1_threshold
    p, y = np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1])
    assert pr_best_f1_threshold(p, y) == pytest.approx(0.35)
    assert metrics_at(p, y, 0.35)["accuracy"] == 0.75


def test_train_config_carries_the_method_and_official_optimiser(tiny):
    from lib.trace.runs import run_config
    enc, data = tiny
    cfg = TrainConfig(hidden=16, epochs=1, batch_size=4)
    assert cfg.weight_decay == 0.01 and cfg.min_lr == 1e-7 and cfg.scorer_input == "caption"
    assert cfg.selection_temperature is None and cfg.contrastive_features == "clip"
    tr = Trainer(enc, data, cfg, None, progress=False)
    assert tr.opt.param_groups[0]["weight_decay"] == 0.01 and tr.sched.min_lrs == [1e-7]
    assert tr.inputs == "pooled" and sum(type(x).__name__ == "Dropout" for x in tr.model.head) == 4
    _, c2 = run_config({"method": {"focal_alpha": 0.5, "tau_min": 0.3, "scorer_input": "image+caption"}})
    assert (c2.focal_alpha, c2.tau_min, c2.scorer_input) == (0.5, 0.3, "image+caption")
    with pytest.raises(ValueError, match=r"02_finetuning.method: unknown key\(s\) focal_alfa"):
        run_config({"method": {"focal_alfa": 0.5}})
    with pytest.raises(ValueError, match="modality"):
        TrainConfig(modality="audio")


def test_open_clip_heads_read_projected_features_without_final_dropout(tmp_path):
    from test_encoders import _open_clip_native
    from PIL import Image
    enc = _open_clip_native()[0]
    recs = []
    for i in range(6):
        p = tmp_path / f"{i}.png"
        Image.new("RGB", (32, 32), (i * 40, 0, 0)).save(p)
        recs.append(MemeRecord(str(i), p, f"text {i}", i % 2, ["train", "dev_seen", "test_seen"][i % 3], captions={}))
    data = MemeBatchData.from_records(recs, [])
    tr = Trainer(enc, data, TrainConfig(hidden=16, epochs=1, batch_size=4), None, progress=False)
    emb = enc.project_image(torch.zeros(1, enc.image_dim)).shape[-1]
    assert tr.inputs == "projected" and emb != enc.image_dim                  # the tiny tower projects 32 -> 16
    assert tr.model.image_proj[0].in_features == emb and tr.model.caption_scorer[0].in_features == emb
    assert sum(type(x).__name__ == "Dropout" for x in tr.model.head) == 3     # no Dropout before the last Linear


def test_unimodal_baselines_see_only_their_modality():
    """text-only: the meme text only (no caption, no image); caption-only: the captions, no meme text
    and no image; image-only: no text at all. Changing what a baseline must not see changes nothing."""
    from lib.trace.model import allowed_columns
    cols = ["text", "vlm_caption", "tag_caption"]
    assert allowed_columns(cols, "text") == [True, False, False]
    assert allowed_columns(cols, "caption") == [False, True, True]
    torch.manual_seed(0)
    m = CLIPClassifier(8, 6, hidden=32, heads=4).eval()
    img, caps, mask = torch.randn(4, 8), torch.randn(4, 3, 6), torch.ones(4, 3, dtype=torch.bool)
    caps2 = caps.clone()
    caps2[:, 1:] = torch.randn(4, 2, 6)
    txt = torch.tensor(allowed_columns(cols, "text"))
    a = m(img, caps, mask, modality="text", allowed=txt)
    b = m(torch.randn(4, 8), caps2, mask, modality="text", allowed=txt)
    assert torch.all(a["weights"][:, 1:] < 1e-6)
    torch.testing.assert_close(a["logit"], b["logit"])
    cap = torch.tensor(allowed_columns(cols, "caption"))
    caps3 = caps.clone()
    caps3[:, 0] = torch.randn(4, 6)
    c = m(img, caps, mask, modality="caption", allowed=cap)
    d = m(torch.randn(4, 8), caps3, mask, modality="caption", allowed=cap)
    assert torch.all(c["weights"][:, 0] < 1e-6)
    torch.testing.assert_close(c["logit"], d["logit"])
    e = m(img, caps, mask, modality="image")
    f = m(img, torch.randn(4, 3, 6), mask, modality="image")
    torch.testing.assert_close(e["logit"], f["logit"])
    # image_text (the default without captions): the captions change nothing, the image and the meme text do
    assert allowed_columns(cols, "image_text") == [True, False, False]
    g = m(img, caps, mask, modality="image_text", allowed=txt)
    h = m(img, caps2, mask, modality="image_text", allowed=txt)
    torch.testing.assert_close(g["logit"], h["logit"])
    assert not torch.allclose(g["logit"], m(torch.randn(4, 8), caps, mask, modality="image_text", allowed=txt)["logit"])
    assert not torch.allclose(g["logit"], a["logit"])                     # not the text-only model: it sees the image


def test_a_killed_run_resumes_to_the_same_metrics(tiny, tmp_path):
    """A run killed after epoch 2 of 4 resumes from its checkpoint and ends with exactly the metrics,
    curve and predictions of an uninterrupted run; a finished run is read back, not retrained."""
    from lib.trace.runs import run_variant
    enc0, data = tiny
    model = enc0.preset.model
    cfg = TrainConfig(hidden=16, epochs=4, batch_size=4, lr=1e-2, patience=10, loss_config="all")
    make = lambda: load_encoder(model, device="cpu")                          # noqa: E731
    cache = lambda e: FeatureCache(e, data, lowest_unfrozen=2, progress=False)  # noqa: E731
    full = run_variant(tmp_path / "full", data, "tiny", cfg, make, cache, progress=False)

    class Killed(Exception):
        pass

    def kill(rec):
        if rec["epoch"] == 2:
            raise Killed
    with pytest.raises(Killed):
        run_variant(tmp_path / "killed", data, "tiny", cfg, make, cache, progress=False, on_epoch_end=kill)
    assert (tmp_path / "killed" / "checkpoint.pt").exists() and not (tmp_path / "killed" / "result.json").exists()
    resumed = run_variant(tmp_path / "killed", data, "tiny", cfg, make, cache, progress=False)
    assert resumed["resumed_after_epoch"] == 2 and len(resumed["curve"]) == 4
    assert resumed["eval"]["splits"] == full["eval"]["splits"]
    assert [c["loss"] for c in resumed["curve"]] == [c["loss"] for c in full["curve"]]
    assert [p["probability"] for p in resumed["eval"]["predictions"]] == [p["probability"] for p in full["eval"]["predictions"]]
    again = run_variant(tmp_path / "killed", data, "tiny", cfg, make, cache, progress=False)
    assert again["trained"] is False and again["eval"]["splits"] == full["eval"]["splits"]
    # a finished run scores memes it never saw (notebook 06's injected copies) with the restored weights:
    # on its own test memes it gives back the probabilities it wrote
    from lib.trace.runs import load_trained
    trainer, thr = load_trained(tmp_path / "full", data, make)
    rows = np.array([data.ids.index(p["id"]) for p in full["eval"]["predictions"]])
    probs, _ = trainer.predict(rows)
    np.testing.assert_allclose(probs, [p["probability"] for p in full["eval"]["predictions"]], atol=1e-5)
    assert thr == full["eval"]["threshold"]
    with pytest.raises(ValueError, match="trained with candidates"):
        load_trained(tmp_path / "full", MemeBatchData.from_records([], ["other_caption"]), make)
    # another configuration in the same folder: the old run is moved aside, not lost
    other = run_variant(tmp_path / "killed", data, "tiny", TrainConfig(**{**cfg.__dict__, "epochs": 1}), make, cache,
                        progress=False)
    assert other["trained"] and len(list((tmp_path / ".superseded").iterdir())) == 1


def test_quick_look_subsample_keeps_every_split_and_remaps_captions(tmp_path):
    from lib.trace.runs import subsample
    recs = [MemeRecord(str(i), tmp_path / f"{i}.png", f"text {i}", i % 2, ["train", "dev_seen", "test_seen"][i % 3],
                       captions={"vlm_caption": f"cap {i % 5}"} if i % 4 else {}) for i in range(120)]
    data = MemeBatchData.from_records(recs, ["vlm_caption"])
    sub = subsample(data, 30, seed=0)
    assert 24 <= len(sub.ids) <= 36 and len(sub.texts) < len(data.texts)
    assert len(sub.ids) < len(data.ids) and set(sub.splits) == set(data.splits)
    assert subsample(data, 0) is data
    row = {i: k for k, i in enumerate(data.ids)}
    for k, i in enumerate(sub.ids):                                   # every candidate text survives the remap
        for j in range(sub.cap_index.shape[1]):
            a, b = sub.cap_index[k, j], data.cap_index[row[i], j]
            assert (a < 0) == (b < 0) and (a < 0 or sub.texts[a] == data.texts[b])


def test_parallel_runs_match_a_sequential_run_and_are_collected(tiny_clip_dir, tmp_path):
    """run_variants trains in two single-thread processes; on a short training a run matches the
    same seed trained in this process (longer ones drift by float rounding: replicates, not copies),
    and a second call only collects the finished runs."""
    import json
    import time
    from PIL import Image
    from lib.trace.runs import run_variant, run_variants
    rng = np.random.default_rng(1)
    rows = []
    for i in range(30):
        p = tmp_path / f"{i}.png"
        Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(p)
        rows.append({"id": str(i), "img": str(p), "text": f"meme text {i} about zorblins", "label": i % 2,
                     "split": ["train", "dev_seen", "test_seen"][i % 3], "vlm_caption": f"a red sun number {i % 5}"})
    src = tmp_path / "trace.json"
    src.write_text(json.dumps(rows))
    jobs = [(tmp_path / "runs" / f"s{s}", str(tiny_clip_dir), TrainConfig(hidden=16, epochs=3, batch_size=4, lr=1e-2, seed=s))
            for s in (1, 2)]
    par = run_variants(jobs, src, ["vlm_caption"], workers=2, progress=False)
    assert [r["trained"] for r in par] == [False, False]          # trained by the workers, collected here
    from lib.trace.runs import load_trace_data
    data = load_trace_data(src, ["vlm_caption"])
    make = lambda: load_encoder(tiny_clip_dir, device="cpu")       # noqa: E731
    cache = lambda e: FeatureCache(e, data, lowest_unfrozen=2, progress=False)   # noqa: E731
    seq = run_variant(tmp_path / "seq", data, str(tiny_clip_dir), jobs[0][2], make, cache, progress=False)
    np.testing.assert_allclose([p["probability"] for p in par[0]["eval"]["predictions"]],
                               [p["probability"] for p in seq["eval"]["predictions"]], atol=1e-5)
    assert par[0]["eval"]["predictions"] != par[1]["eval"]["predictions"]       # another seed, another run
    t0 = time.time()
    again = run_variants(jobs, src, ["vlm_caption"], workers=2, progress=False)
    assert [r["trained"] for r in again] == [False, False] and time.time() - t0 < 30


class _RunsCode:
    """A pickle payload that would create a file when unpickled (what a crafted checkpoint does)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("kind", ["code", "truncated", "garbage", "empty", "not a dict", "numpy state"])
def test_a_crafted_or_corrupt_checkpoint_is_refused_naming_the_file(tiny, tmp_path, kind):
    """Checkpoints load with torch's weights_only loader: a file that would run code is refused
    without running it, and a corrupt one is an error that names it and says how to resume."""
    import torch
    from lib.trace.training import CheckpointError
    from lib.trace.runs import run_variant
    enc0, data = tiny
    model = enc0.preset.model
    cfg = TrainConfig(hidden=16, epochs=2, batch_size=4, lr=1e-2, patience=10, loss_config="all")
    make = lambda: load_encoder(model, device="cpu")                          # noqa: E731
    run = tmp_path / "run"
    run_variant(run, data, "tiny", cfg, make, None, progress=False)
    ck = run / "checkpoint.pt"
    (run / "result.json").unlink()                                             # unfinished: the checkpoint is read
    marker = tmp_path / "code-ran"
    if kind == "code":
        torch.save({"epoch": 0, "payload": _RunsCode(marker)}, ck)
    elif kind == "truncated":
        ck.write_bytes(ck.read_bytes()[: ck.stat().st_size // 2])
    elif kind == "garbage":
        ck.write_bytes(b"\x80\x04not a checkpoint" * 10)
    elif kind == "empty":
        ck.write_bytes(b"")
    elif kind == "not a dict":
        torch.save([1, 2, 3], ck)
    else:                                                                      # the old format: numpy arrays
        torch.save({"epoch": 0, "rng": {"numpy": np.random.get_state()}}, ck)
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(ck))}: not a .*delete it and run again"):
        run_variant(run, data, "tiny", cfg, make, None, progress=False)
    assert not marker.exists()                                                 # nothing in the file ran


def test_a_checkpoint_holds_only_tensors_and_plain_values(tiny, tmp_path):
    import torch
    from lib.trace.runs import run_variant
    enc0, data = tiny
    cfg = TrainConfig(hidden=16, epochs=2, batch_size=4, lr=1e-2, patience=10, loss_config="all")
    run_variant(tmp_path / "run", data, "tiny", cfg, lambda: load_encoder(enc0.preset.model, device="cpu"), None,
                progress=False)
    ck = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert ck["version"] == 2 and isinstance(ck["rng"]["numpy"][1], list)


def test_ablation_variants_name_every_run_and_its_folder_tag():
    from lib.trace.report import ablation_variants, predictions_file
    v = ablation_variants(["cls+rel", "all"], ["text"], {"cls+con (cos/0.07)": {"loss_config": "cls+con"}},
                          ["enc-a", "enc-b"])
    assert list(v) == ["cls+rel", "all", "text_only", "cls+con (cos/0.07)", "cls+rel@enc-b"]
    assert v["text_only"] == ("enc-a", {"loss_config": "cls+rel", "modality": "text"}, "")
    assert v["cls+con (cos/0.07)"] == ("enc-a", {"loss_config": "cls+con"}, "cos_0_07")   # the extra's own loss wins
    assert v["cls+rel@enc-b"] == ("enc-b", {"loss_config": "cls+rel"}, "")
    # the file names notebook 06 and the README know
    assert predictions_file("cls+rel") == "predictions_cls_rel.csv"
    assert predictions_file("cls+con (cos/0.07)", "cos_0_07") == "predictions_cls_con_cos_0_07.csv"
    assert predictions_file("cls+rel@enc-b") == "predictions_cls_rel_enc-b.csv"


def test_seed_replicates_and_the_caption_benefit_test():
    """Every seed variant (a loss config, a baseline or an extra) gets its own folder per seed; the
    caption benefit pairs the default with the no-caption run on the same memes and seeds."""
    from pathlib import Path
    import pandas as pd
    from lib.trace.model import TrainConfig
    from lib.trace.report import ablation_variants, caption_benefit, seed_replicates

    class Stage:
        def job(self, backbone, over, tag):
            cfg = TrainConfig(**over)
            return (Path("runs") / f"{cfg.modality}_{cfg.loss_config}_{tag}", backbone, cfg)
    v = ablation_variants(["cls+rel"], ["image_text"], {"cls+rel (x)": {"scorer_input": "image+caption"}}, ["enc"])
    reps = seed_replicates(Stage(), v, ["cls+rel", "image_text_only", "cls+rel (x)"], [1, 2])
    assert [(n, j[2].seed) for n, j in reps] == [("cls+rel", 1), ("cls+rel", 2), ("image_text_only", 1),
                                                  ("image_text_only", 2), ("cls+rel (x)", 1), ("cls+rel (x)", 2)]
    assert reps[2][1][2].modality == "image_text" and reps[4][1][0].name.endswith("_x_seed1")
    assert len({j[0] for _, j in reps}) == 6                                # one folder per run
    with pytest.raises(ValueError, match="not among the runs"):
        seed_replicates(Stage(), v, ["cls+con"], [1])

    def run(correct):
        preds = [{"id": str(i), "split": "test_seen", "prediction": int(c), "label": 1} for i, c in enumerate(correct)]
        return {"eval": {"predictions": preds, "splits": {"test_seen": {"accuracy": float(np.mean(correct))}}}}
    runs = {"cls+rel": run([1] * 18 + [0] * 2), "image_text_only": run([1] * 10 + [0] * 10)}
    tab = pd.DataFrame({"variant": ["cls+rel"] * 3 + ["image_text_only"] * 3, "seed": [0, 1, 2] * 2,
                        "accuracy": [0.9, 0.8, 0.6, 0.5, 0.7, 0.65]})
    b = caption_benefit(runs, "cls+rel", tab)
    assert b["caption_benefit_acc"] == pytest.approx(0.4) and b["caption_benefit_n"] == 20
    assert b["caption_benefit_ci_low"] < 0.4 < b["caption_benefit_ci_high"]
    assert b["caption_benefit_only_default_right"] == 8 and b["caption_benefit_mcnemar_p"] < 0.05
    assert b["caption_benefit_seeds_positive"] == 2 and b["caption_benefit_n_seeds"] == 3
    assert b["caption_benefit_seeds_mean"] == pytest.approx((0.4 + 0.1 - 0.05) / 3)
    assert caption_benefit({"cls+rel": runs["cls+rel"]}, "cls+rel", tab) == {}


def test_a_runs_caption_columns_come_from_the_run(tmp_path):
    """Notebook 06 loads the captions a run was trained with, so the real TRACE JSON's column names
    (ivl_8b_new_caption, gemini_caption) work as MemeWorld's do."""
    import json
    from lib.trace.runs import run_caption_columns
    (tmp_path / "result.json").write_text(json.dumps({"selected_share": {
        "test_seen": {"text": 0.2, "ivl_8b_new_caption": 0.5, "gemini_caption": 0.3}}}))
    assert run_caption_columns(tmp_path) == ["ivl_8b_new_caption", "gemini_caption"]
    with pytest.raises(FileNotFoundError, match="not finished"):
        run_caption_columns(tmp_path / "missing")


def test_one_backbones_feature_cache_in_memory_at_a_time(tiny):
    """Runs are grouped by backbone and a cache of another backbone is dropped before the next is
    built: the paper profile's three backbones would otherwise hold their caches' sum of host memory."""
    from lib.trace.runs import by_backbone, shared_cache
    assert by_backbone(["l14", "xlmr", "l14", "siglip", "xlmr"]) == [0, 2, 1, 4, 3]
    assert by_backbone([]) == []
    enc, data = tiny
    caches = {}
    first = shared_cache(caches, data, "backbone-a", TrainConfig(), enc)
    assert shared_cache(caches, data, "backbone-a", TrainConfig(), enc) is first        # shared, not rebuilt
    shared_cache(caches, data, "backbone-b", TrainConfig(), enc)
    assert {k[0] for k in caches} == {"backbone-b"}
