"""The paper profile's cost table (lib/compendium/costs.py): token counts, memory formulas and the settings the README prints."""
import re
from dataclasses import replace
from pathlib import Path

import pytest

from lib.compendium import costs
from lib.compendium.costs import CHECKPOINTS, GIB, Assumptions, image_tokens

ROOT = Path(__file__).resolve().parents[1]


def test_image_tokens_follow_each_models_processor():
    assert image_tokens("paligemma", 300, 2000) == 1024                    # fixed 448-px grid
    assert image_tokens("internvl", 500, 500) == 2 + 256                  # one tile, no thumbnail
    assert image_tokens("internvl", 800, 800) == 2 + 256 * 5              # 2 x 2 tiles + thumbnail
    assert image_tokens("internvl", 4000, 4000) == 2 + 256 * 10           # a square: at most 3 x 3 of the 12 tiles
    assert image_tokens("internvl", 3000, 4000) == 2 + 256 * 13           # 3 x 4 = 12 tiles + thumbnail
    # Pixtral: 16-px patches of the image scaled to a 1024-px longest edge, one break token per row;
    # width and height are not interchangeable
    assert image_tokens("pixtral", 1000, 500) == (63 + 1) * 32
    assert image_tokens("pixtral", 500, 1000) == (32 + 1) * 63
    assert image_tokens("pixtral", 2048, 2048) == (64 + 1) * 64
    with pytest.raises(ValueError, match="unknown rule"):
        image_tokens("llava", 10, 10)


def test_kv_and_weights_follow_the_configs():
    ivl = CHECKPOINTS["internvl3.5-8b"]
    assert costs.kv_bytes_per_token(ivl) == 2 * 36 * 8 * 128 * 2          # K and V, bf16
    assert costs.kv_bytes_per_token(CHECKPOINTS["paligemma-3b-pt-448"]) == 2 * 18 * 1 * 256 * 2
    a = Assumptions()
    u1 = costs.vllm_utilization(ivl, 8192, 1, a)
    u2 = costs.vllm_utilization(ivl, 32768, 1, a)
    assert 0 < u1 < u2 < 1
    need = costs.weight_bytes(ivl) + a.vllm_overhead_gib * GIB + 32768 * costs.kv_bytes_per_token(ivl)
    assert u2 * a.gpu_gib * GIB >= need > (u2 - 0.01) * a.gpu_gib * GIB


def test_the_feature_cache_estimate_is_the_caches_own_size(tiny):
    from lib.trace.features import FeatureCache
    enc, data = tiny
    for store in ("float32", "float16"):
        cache = FeatureCache(enc, data, lowest_unfrozen=1, progress=False, store_dtype=store)
        seq, width = cache.hidden.shape[1:]
        est = costs.feature_cache_bytes(len(data.ids), len(data.texts), seq, width, cache.image_feat.shape[1],
                                        cache.image_emb.shape[1], token_fields=len(cache.tokens),
                                        store_bytes=cache.hidden.element_size())
        assert est == cache.nbytes


def test_the_agent_row_fits_80gb_with_checkpointing_and_names_a_48gb_setting():
    from lib.models.train_memory import step_bytes
    pg = costs.PALIGEMMA_TRAINING
    assert step_bytes(pg, 8, 1536)["total"] > 80 * GIB > step_bytes(pg, 8, 1536, gradient_checkpointing=True)["total"]
    row = next(r for r in costs.cost_rows("paper") if r.stage == "04 agents: training")
    assert "gradient checkpointing" in row.work and row.gpu_gib * 1.1 <= Assumptions().gpu_gib
    assert "a 48 GB GPU: batch_size" in row.settings


def test_the_table_covers_every_stage_and_says_what_kind_each_number_is():
    rows = costs.cost_rows("paper")
    stages = {r.stage.split()[0] for r in rows}
    assert stages == {"00", "01", "02", "03", "04", "05", "06", "07"}
    assert all(r.kind in {"exact", "estimated", "cited", "measured", "measured, other settings", "none"} for r in rows)
    assert all(r.gpu_gib <= Assumptions().gpu_gib for r in rows), "a stage does not fit the named GPU"
    servers = [r for r in rows if r.stage.startswith("04 few-shot")]
    assert len(servers) == 2 and "both servers at once" in servers[-1].settings
    smaller = costs.cost_rows("paper", replace(Assumptions(), image_size=(500, 500)))
    assert sum(r.gpu_hours for r in smaller) < sum(r.gpu_hours for r in rows)
    md = costs.markdown(rows, Assumptions())
    assert md.count("\n") == len(rows) + 1


def test_a_committed_gpu_record_is_the_rows_time_and_is_named(tmp_path, monkeypatch):
    """The agents' training row takes its time from the committed H100 record (results/gpu/) closest to the recipe
    (batch 8 with checkpointing), says where it comes from and keeps the FLOP estimate beside it; without a
    record for the table's GPU it is an estimate; a record's MFU against the datasheet replaces the assumed one."""
    row = next(r for r in costs.cost_rows("paper") if r.stage == "04 agents: training")
    # the record ran eager attention, the recipe asks for SDPA: a measurement, of other settings
    assert row.kind == "measured, other settings" and "results/gpu/h100_agent_recipe.json" in row.settings
    assert costs._gpu_family("NVIDIA H100 PCIe") != costs._gpu_family("NVIDIA H100 80GB HBM3") == "H100"
    assert row.gpu_hours == pytest.approx(costs.PAPER_SIZES["agent_examples"] * 2 * 0.56 / 3600)
    assert "at batch 8 with checkpointing" in row.settings and "the FLOP estimate at an assumed 30% MFU" in row.settings
    a100 = next(r for r in costs.cost_rows("paper", replace(Assumptions(), gpu="NVIDIA A100 80GB"))
                if r.stage == "04 agents: training")
    assert a100.kind == "estimated" and "measured" not in a100.settings
    import json
    (tmp_path / "a100.json").write_text(json.dumps({"agent_training": {
        "what": "the recipe", "device": "NVIDIA A100-SXM4-80GB", "torch": "2.14.1", "commit": "abc123", "date": "2026-12-05",
        "runs": [{"batch_size": 8, "gradient_checkpointing": True, "s_per_example": 1.0, "mfu": 0.2,
                  "mfu_vs_measured_matmul": 0.3}]}}))
    monkeypatch.setattr(costs, "MEASURED_DIR", tmp_path)
    row = next(r for r in costs.cost_rows("paper", replace(Assumptions(), gpu="NVIDIA A100 80GB"))
               if r.stage == "04 agents: training")
    assert row.kind == "measured" and "commit abc123" in row.settings and "the measured MFU of 20%" in row.settings
    assert row.gpu_hours == pytest.approx(costs.PAPER_SIZES["agent_examples"] * 2 / 3600)


def test_measured_generation_and_clip4dm_records_replace_their_rows_estimates(tmp_path, monkeypatch):
    import json
    dev = {"device": "NVIDIA H100 80GB HBM3", "torch": "2.14.1", "date": "2026-12-05", "commit": "c0ffee"}
    (tmp_path / "h100.json").write_text(json.dumps({
        "generation": {**dev, "parts": {"captioning": {"what": "cap", "items_per_s": 2.0},
                                        "silver": {"what": "sil", "items_per_s": 10.0},
                                        "few_shot": {"skipped": "no server"}}},
        "clip4dm": {**dev, "runs": [{"shape": "B/32", "from_files_pairs_per_s": 400.0},
                                    {"shape": "H/14", "from_files_pairs_per_s": 100.0},
                                    {"shape": "H/14", "from_files_pairs_per_s": 120.0}]}}))
    monkeypatch.setattr(costs, "MEASURED_DIR", tmp_path)
    rows = {r.stage: r for r in costs.cost_rows("paper")}
    memes = costs.PAPER_SIZES["fhm"] + costs.PAPER_SIZES["multioff"]
    assert rows["01 captioning"].kind == "measured" and "commit c0ffee" in rows["01 captioning"].settings
    assert rows["01 captioning"].gpu_hours == pytest.approx(memes / 2.0 / 3600 + 0.1)
    assert rows["04 agents: silver texts"].kind == "measured" and "10.00 generations/s" in rows["04 agents: silver texts"].settings
    assert rows["03 CLIP4DM"].kind == "measured" and rows["03 CLIP4DM"].gpu_hours == pytest.approx(10_000 / 120.0 / 3600)
    assert rows["04 agents: training"].kind == "estimated"                       # no agent record in this folder
    monkeypatch.setattr(costs, "MEASURED_DIR", tmp_path / "none")
    assert {r.kind for r in costs.cost_rows("paper")} <= {"estimated", "cited", "none", "exact"}


def test_documented_vllm_commands_hold_the_longest_few_shot_prompt():
    """The serve commands docs/models-and-serving.md prints must fit the profile's 8-shot prompts (default meme size)."""
    from lib.compendium.params import load_profile
    section = load_profile("paper")["04_few_shot"]
    text = (ROOT / "docs" / "models-and-serving.md").read_text(encoding="utf-8")
    for name, served in (("internvl3.5-8b", "internvl3.5-8b"), ("pixtral-12b", "pixtral-12b")):
        need = costs.vllm_settings(name, section, Assumptions().image_size, Assumptions())
        cmds = [ln for ln in text.splitlines() if ln.startswith("vllm serve") and f"--served-model-name {served}" in ln]
        assert cmds, f"docs/models-and-serving.md prints no vllm serve command for {served}"
        for cmd in cmds:
            m = re.search(r"--max-model-len (\d+)", cmd)
            assert m and int(m.group(1)) >= need["longest_prompt"], f"{cmd!r}: needs --max-model-len >= {need['longest_prompt']}"
            assert f"--gpu-memory-utilization {need['utilization']:.2f}" in cmd, cmd


def test_tensor_parallel_servers_need_their_share_of_each_gpu():
    from lib.compendium.params import load_profile
    section = load_profile("paper")["04_few_shot"]
    one = costs.vllm_settings("pixtral-12b", section, (1000, 1000), Assumptions())
    two = costs.vllm_settings("pixtral-12b", section, (1000, 1000), Assumptions(), tensor_parallel=2)
    assert two["max_model_len"] == one["max_model_len"] and two["utilization"] < one["utilization"]
    ck = costs.CHECKPOINTS["paligemma-3b-pt-448"]                 # one KV head: each GPU keeps it whole
    a = Assumptions()
    kv_only = costs.vllm_utilization(ck, 32768, 4, a, 2) - costs.vllm_utilization(ck, 32768, 0, a, 2)
    assert kv_only == pytest.approx(costs.vllm_utilization(ck, 32768, 4, a) - costs.vllm_utilization(ck, 32768, 0, a), abs=0.011)
    text = (ROOT / "docs" / "models-and-serving.md").read_text(encoding="utf-8")
    assert text.count("--tensor-parallel-size 2") == 2
