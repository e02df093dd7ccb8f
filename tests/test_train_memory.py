"""A training step's GPU memory from a model's configuration, against what one H100 80GB measured for the
paper's agent recipe (PaliGemma-3B-448, bf16 weights and mixed precision, 1,536 tokens per example)."""
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from lib.models.train_memory import GIB, RecipeMemoryError, check_fits, settings_that_fit, shape_of, step_bytes

#: peak GiB measured through lib.sei.agents.train_agent on one H100 80GB (results/gpu/h100_agent_recipe.json)
RECORD = json.loads((Path(__file__).resolve().parents[1] / "results" / "gpu" / "h100_agent_recipe.json").read_text())
MEASURED = {(r["batch_size"], r["gradient_checkpointing"]): r["peak_gib"] for r in RECORD["runs"] if r["peak_gib"]}
H100_FREE = 79.2 * GIB                      # what torch reports free on an idle H100 80GB


@pytest.fixture(scope="module")
def paligemma_3b():
    """google/paligemma-3b-pt-448's shapes (SigLIP-So400m at 448 px, Gemma-2B with its 257k vocabulary) on
    the meta device: the real parameter count without allocating a byte."""
    import torch
    from transformers import PaliGemmaForConditionalGeneration
    from lib.models.smoke import paligemma_config
    with torch.device("meta"):
        model = PaliGemmaForConditionalGeneration(paligemma_config()).to(torch.bfloat16)
    # the measured run used eager attention: its 71.8 GiB in use at the first forward (no Adam state yet) are
    # weights 5.5 + bf16 logits 5.9 + activations 60.4, i.e. 7.5 GiB of activations per example, which only
    # the eager term (the s x s scores per head) accounts for
    return replace(shape_of(model), eager_attention=True)


def test_the_shape_is_read_from_the_configuration(paligemma_3b):
    s = paligemma_3b
    assert 2.9e9 < s.params < 3.0e9 and s.weight_bytes == 2 and s.vocab == 257_216
    assert (s.decoder.layers, s.decoder.hidden, s.decoder.intermediate, s.decoder.gated_mlp) == (18, 2048, 16_384, True)
    assert s.image_tokens == 1024 and s.vision is not None and not s.vision.gated_mlp and s.vision.layers == 27


@pytest.mark.parametrize("batch,ckpt", sorted(MEASURED))
def test_the_estimate_is_within_ten_percent_of_each_measured_peak(paligemma_3b, batch, ckpt):
    est = step_bytes(paligemma_3b, batch, 1536, gradient_checkpointing=ckpt)["total"] / GIB
    assert est == pytest.approx(MEASURED[batch, ckpt], rel=0.10)


def test_batch_eight_without_checkpointing_exceeds_the_gpu_as_it_did(paligemma_3b):
    oom = next(r for r in RECORD["runs"] if r["peak_gib"] is None)
    assert (oom["batch_size"], oom["gradient_checkpointing"]) == (8, False)
    in_use, requested = (float(x) for x in re.findall(r"(\d+\.\d) GiB", oom["out_of_memory"]))
    assert step_bytes(paligemma_3b, 8, 1536)["total"] / GIB > in_use + requested
    terms = step_bytes(paligemma_3b, 8, 1536)
    assert terms["logits"] / GIB == pytest.approx(8 * 1536 * 257_216 * 10 / GIB)   # bf16 + float32 upcast + log-softmax


def test_a_recipe_that_cannot_fit_is_refused_naming_settings_that_do(paligemma_3b):
    with pytest.raises(RecipeMemoryError) as e:
        check_fits(paligemma_3b, 8, 1, 1536, H100_FREE, gradient_checkpointing=False, where="this GPU")
    msg = str(e.value)
    assert "batch_size 8 x max_len 1536" in msg and "79.2 GiB free" in msg
    assert "batch_size 8, grad_accum 1, gradient_checkpointing true" in msg
    assert "batch_size 4, grad_accum 2, gradient_checkpointing false" in msg
    assert check_fits(paligemma_3b, 8, 1, 1536, H100_FREE, gradient_checkpointing=True)["total"] < H100_FREE / 1.1
    alts = settings_that_fit(paligemma_3b, 8, 1, 1536, 48 * GIB, gradient_checkpointing=False)
    assert alts and all(a["batch_size"] * a["grad_accum"] == 8 and a["gib"] * 1.1 <= 48 for a in alts)
    with pytest.raises(RecipeMemoryError, match="no batch size fits"):
        check_fits(paligemma_3b, 8, 1, 1536, 8 * GIB, gradient_checkpointing=False)


def test_the_paper_profiles_recipe_fits_one_80gb_gpu(paligemma_3b):
    from lib.sei.agents import AgentRecipe
    from lib.compendium.params import load_profile
    rec = AgentRecipe(**load_profile("paper")["04_few_shot"]["agent_recipe"])
    assert rec.gradient_checkpointing and rec.batch_size == 8 and rec.max_len == 1536
    check_fits(paligemma_3b, rec.batch_size, rec.grad_accum, rec.max_len, H100_FREE, rec.gradient_checkpointing)


def test_the_cost_tables_shape_is_the_one_read_from_the_configuration(paligemma_3b):
    from lib.compendium.costs import PALIGEMMA_TRAINING
    assert paligemma_3b.params == pytest.approx(PALIGEMMA_TRAINING.params, rel=0.01)
    assert replace(paligemma_3b, params=0) == replace(PALIGEMMA_TRAINING, params=0)


def test_the_measurement_runs_at_toy_shape_and_reports_every_setting(tmp_path):
    """`python -m lib.compendium.costs --measure --toy`: the GPU measurement's code on the CPU at a tiny shape."""
    from lib.compendium import measure
    path = measure.measure(toy=True, out_dir=tmp_path, batch_sizes=(2,), checkpointing=(False, True), work=tmp_path / "w")
    rec = json.loads(path.read_text())["agent_training"]
    assert rec["device"] == "CPU (toy shape)" and rec["parameters"] > 0 and rec["matmul_tflops"] > 0
    assert [(r["batch_size"], r["gradient_checkpointing"]) for r in rec["runs"]] == [(2, False), (2, True)]
    for r in rec["runs"]:
        # the MFU here divides by a matmul rate measured in the same process: on a loaded machine either can be slowed,
        # so only its sign holds everywhere
        assert r["s_per_example"] > 0 and 1024 < r["tokens_per_example"] <= 1536
        assert r["mfu"] is None and 0 < r["mfu_vs_measured_matmul"] < float("inf")   # a CPU has no datasheet peak
        assert r["update_share"]["sampled"] > 0
    table = measure.markdown({"agent_training": rec})
    assert table.count("\n| 2 |") == 2 and "MFU (datasheet peak)" in table and "measured matmul rate" in table
    with pytest.raises(RuntimeError, match="needs a visible CUDA GPU"):
        measure.measure_agent(toy=False)
    c = json.loads(path.read_text())["clip4dm"]                  # CLIP4DM from files against its floor, same record
    assert c["device"] == "CPU (toy shape)" and [(r["shape"], r["workers"]) for r in c["runs"]] == [("tiny", 0)]
    assert all(r["from_files_pairs_per_s"] > 0 and r["floor_pairs_per_s"] > 0 and r["ratio"] > 0 for r in c["runs"])
    both = measure.markdown(json.loads(path.read_text()))
    assert "MFU" in both and "| tiny | 4 | 0 |" in both
    t = json.loads(path.read_text())["trace"]                     # TRACE's feature cache and one epoch
    assert t["memes"] == 24 and t["train_memes"] > 0 and t["cache_memes_per_s"] > 0 and t["epoch_s_per_1000_train"] > 0
    assert "TRACE" in both and "memes/s" in both
    g = json.loads(path.read_text())["generation"]               # captioning, silver texts, NLI, few-shot via vLLM
    assert {k for k, v in g["parts"].items() if v.get("items_per_s", 0) > 0} == {"captioning", "silver", "nli"}
    assert "--vllm-url" in g["parts"]["few_shot"]["skipped"] and g["commit"] and g["parts"]["silver"]["items"] == 4
    assert "| silver |" in both and "| few_shot |" in both
    again = measure.measure(toy=True, out_dir=tmp_path, only=("clip4dm",))   # one part again: the rest is kept
    assert again == path and set(json.loads(path.read_text())) == {"agent_training", "clip4dm", "trace", "generation"}
    with pytest.raises(RuntimeError, match="no GPU is visible"):
        measure.measure_trace(toy=False)
    with pytest.raises(RuntimeError, match="no GPU is visible"):
        measure.measure_clip4dm(toy=False)


def test_the_full_shape_clip_stand_ins_have_the_checkpoints_shapes(tmp_path):
    from transformers import CLIPConfig
    from lib.models.smoke import CLIP_SHAPES, clip_full_shape
    with pytest.raises(ValueError, match="unknown shape 'G/99'"):
        clip_full_shape(tmp_path / "x", "G/99")
    cfg = CLIPConfig.from_pretrained(clip_full_shape(tmp_path / "b32", "B/32"))
    assert (cfg.vision_config.hidden_size, cfg.vision_config.num_hidden_layers, cfg.vision_config.patch_size) == (768, 12, 32)
    assert (cfg.text_config.hidden_size, cfg.projection_dim) == (512, 512) and set(CLIP_SHAPES) == {"B/32", "L/14", "H/14"}


def test_the_optimizer_step_is_a_floor_under_every_batch_size(paligemma_3b):
    """Weights, gradients, Adam's two moments and the multi-tensor Adam's one weights-sized temporary: 10 bytes
    per parameter in bf16, about 27 GiB for PaliGemma-3B. With fused attention, the answer's logits alone and
    checkpointing the forward/backward peak is under it at batch 2 to 8, so the estimate is the step's."""
    from lib.models.train_memory import optimizer_bytes
    sdpa = replace(paligemma_3b, eager_attention=False)
    floor = optimizer_bytes(sdpa)["total"]
    assert floor == pytest.approx(10 * sdpa.params) and 26.5 < floor / GIB < 27.5
    for batch in (2, 4, 8):
        est = step_bytes(sdpa, batch, 1536, gradient_checkpointing=True, logit_tokens=64)
        assert est["forward_backward"] < est["optimizer_step"] == est["total"] == floor
    fused, loop = optimizer_bytes(sdpa, "fused")["total"], optimizer_bytes(sdpa, "for-loop")["total"]
    assert fused == pytest.approx(8 * sdpa.params) and fused < loop < floor       # one tensor's copy, not all
    assert loop - fused == pytest.approx(2 * sdpa.vocab * sdpa.decoder.hidden)      # the token embedding's
    with pytest.raises(ValueError, match="expected one of"):
        optimizer_bytes(sdpa, "lion")


def test_accumulated_gradients_live_through_the_next_forward(paligemma_3b):
    one = step_bytes(paligemma_3b, 2, 1536, grad_accum=1)
    two = step_bytes(paligemma_3b, 2, 1536, grad_accum=4)
    assert two["forward_backward"] - one["forward_backward"] == pytest.approx(2 * paligemma_3b.params)
    assert one["accumulated_gradients"] == 0


def test_a_refusal_names_the_optimizer_step_when_it_is_the_peak(paligemma_3b):
    sdpa = replace(paligemma_3b, eager_attention=False)
    with pytest.raises(RecipeMemoryError) as e:                  # a 24 GB card: the step cannot fit at any batch
        check_fits(sdpa, 8, 1, 1536, 22.5 * GIB, gradient_checkpointing=True, logit_tokens=64)
    assert "optimizer step 27." in str(e.value) and "no batch size fits" in str(e.value)


def test_model_flops_utilisation_is_counted_against_the_datasheet_peak(paligemma_3b):
    """The conventional MFU: 6 x parameters x tokens plus attention, against the GPU's dense bf16 peak by name."""
    from lib.compendium.measure import datasheet_tflops, markdown, training_flops
    assert datasheet_tflops("NVIDIA H100 80GB HBM3") == 989.4 and datasheet_tflops("NVIDIA H100 PCIe") == 756.0
    assert datasheet_tflops("NVIDIA A100-SXM4-80GB") == 312.0 and datasheet_tflops("NVIDIA A10") == 125.0
    assert datasheet_tflops("NVIDIA L40S") == 362.1 and datasheet_tflops("NVIDIA L4") == 121.0
    assert datasheet_tflops("NVIDIA A10G") is None and datasheet_tflops("Some GPU") is None
    t = 1450
    d = paligemma_3b.decoder
    embedding = paligemma_3b.vocab * d.hidden                  # the tied embedding / output layer: left out
    assert training_flops(paligemma_3b, t) == pytest.approx(6 * (paligemma_3b.params - embedding) * t
                                                            + 12 * d.layers * d.hidden * t * t)
    # the record committed before this column: its "mfu" was against the measured matmul rate, so it lands there
    old = {"what": "x", "device": "H100", "torch": "2", "cuda": "13", "matmul_tflops": 700.0,
           "runs": [{"batch_size": 2, "gradient_checkpointing": False, "peak_gib": 37.2, "estimate_gib": 36.0,
                     "s_per_example": 0.54, "mfu": 0.06}]}
    row = markdown({"agent_training": old}).splitlines()[-1]
    assert row.endswith("| — | 6.0% |")


def test_the_few_shot_measurement_times_calls_to_a_served_model(tmp_path):
    """The few-shot part's client against a loopback OpenAI-compatible server (what a vLLM server on the GPU is)."""
    from lib.compendium import measure
    from lib.models.chat import loopback
    srv = loopback.start()
    try:
        rec = measure.measure_generation(parts=("few_shot",), toy=True, work=tmp_path,
                                         vllm_url=f"http://127.0.0.1:{srv.server_address[1]}/v1", vllm_model="served")
    finally:
        srv.shutdown()
        srv.server_close()
    fs = rec["parts"]["few_shot"]
    assert fs["items"] == 4 and fs["items_per_s"] > 0 and "served by vLLM" in fs["what"]


def test_a_fully_sharded_step_holds_each_processes_share(paligemma_3b):
    """FSDP over N processes: weights, gradients and Adam state split N ways (plus one layer gathered whole);
    activations and logits are each process's own."""
    from lib.models.train_memory import largest_tensor, optimizer_bytes
    one = step_bytes(paligemma_3b, 8, 1536, gradient_checkpointing=True)
    four = step_bytes(paligemma_3b, 8, 1536, gradient_checkpointing=True, shards=4)
    assert four["activations"] == one["activations"] and four["logits"] == one["logits"]
    assert four["states"] == pytest.approx(one["states"] / 4 + 2 * largest_tensor(paligemma_3b) * 2)
    assert optimizer_bytes(paligemma_3b, shards=4)["total"] == pytest.approx(optimizer_bytes(paligemma_3b)["total"] / 4)
    assert four["total"] < one["total"]
    with pytest.raises(ValueError, match="at least 1"):
        optimizer_bytes(paligemma_3b, shards=0)
    sdpa = replace(paligemma_3b, eager_attention=False)        # DDP's buckets: one more copy of the gradients
    d = step_bytes(sdpa, 4, 1536, gradient_checkpointing=True, logit_tokens=64, ddp=True)
    assert d["optimizer_step"] - optimizer_bytes(sdpa)["total"] == pytest.approx(2 * sdpa.params) == d["ddp_buckets"]
