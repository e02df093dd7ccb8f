"""What a training step of a task agent keeps, computes and leaves behind, on tiny same-architecture models on the
CPU (the paper's PaliGemma recipe: bfloat16 weights, Adam at lr 2e-5, the answer-only loss)."""
import contextlib
import weakref

import numpy as np
import pytest
import torch

from lib.sei import agents as A
from lib.sei.agents import (ANSWER_KEYS, AgentRecipe, _collate, answer_loss, build_agent_data, encode_example,
                            render_prompt, train_agent)

TPL = "explain why {label} {ocr}"
#: the recipe the launch tests train: float32, a batch the two processes split in half; all 9 training examples, so
#: the last batch is short (one example and three answerless fillers in a launch)
RECIPE = dict(epochs=2, lr=1e-3, batch_size=4, threads=1, max_train=0)


def _data(tmp_path):
    from test_sei import _records
    tmp_path.mkdir(parents=True, exist_ok=True)
    memes, cap, hat, sense = _records(tmp_path)
    return build_agent_data(cap, hat, sense, memes)["explainer"]


def _batch(base, tmp_path, dtype="float32"):
    from PIL import Image
    model, proc, _ = A._load_base(str(base), dtype, "sdpa")
    enc = []
    for e in [e for e in _data(tmp_path) if e.split == "train"][:4]:
        with Image.open(e.img_path) as im:
            enc.append(encode_example(proc, im.convert("RGB"), render_prompt(TPL, e.inputs), e.target, 256))
    batch = _collate(enc, 0)
    return model, batch, {k: batch.pop(k) for k in ANSWER_KEYS}


def _host_syncs(fn) -> int:
    """How many times `fn` reads a tensor's value back to Python or sizes a result by its data (the operations
    that make the host wait for a GPU): counted by torch's dispatcher, so it works on the CPU."""
    from torch.utils._python_dispatch import TorchDispatchMode
    waits = {"_local_scalar_dense", "nonzero", "masked_select", "item", "unique_consecutive", "_unique2"}

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.__name__.split(".")[0]
            masks = name in ("index", "index_put", "index_put_") and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else []) or [])
            if name in waits or masks:                  # a boolean mask sizes its result by the data too
                Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.n


def test_the_answer_only_loss_adds_no_host_synchronisation_to_the_models_step(tiny_paligemma, tmp_path):
    """Forward and backward of the answer-only loss wait on the device no more often than the model's own loss
    does (whatever the model itself does, e.g. checking its image tokens): the answer positions come from the
    collate function, on the CPU."""
    model, batch, answer = _batch(tiny_paligemma, tmp_path)
    model.train()
    own = _host_syncs(lambda: model(**batch).loss.backward())
    mine = _host_syncs(lambda: answer_loss(model, batch, answer, model.get_output_embeddings(),
                                           contextlib.nullcontext, chunk=3).backward())
    assert mine <= own


def test_the_collate_function_indexes_every_answer_token(tiny_paligemma, tmp_path):
    _, batch, answer = _batch(tiny_paligemma, tmp_path)
    lab = batch["labels"]
    got = sorted(zip(answer["_answer_rows"].tolist(), (answer["_answer_cols"] + 1).tolist()))
    assert got == sorted(map(tuple, (lab != -100).nonzero().tolist()))
    assert answer["_answer_targets"].tolist() == [lab[r, c].item() for r, c in got]


def test_train_agent_leaves_nothing_of_its_model_alive(tiny_paligemma, tmp_path, monkeypatch):
    """In bf16 mixed precision (accelerate binds a forward of the model to the model itself): once train_agent
    returns, nothing holds the trained model, so its weights, gradients and Adam state are free for the next
    agent (this test calls no garbage collection itself)."""
    refs = []
    load = A._load_base

    def watched(*a, **k):
        m, p, s = load(*a, **k)
        refs.append(weakref.ref(m))
        return m, p, s

    monkeypatch.setattr(A, "_load_base", watched)
    rec = train_agent(_data(tmp_path), tmp_path / "agent", AgentRecipe(
        base=str(tiny_paligemma), epochs=1, lr=1e-3, batch_size=4, threads=1, dtype="bfloat16", mixed_precision="bf16",
        answer_logits_only=True), TPL, progress=False)
    assert np.isfinite(rec["curve"][0]["loss"]) and len(refs) == 1
    assert refs[0]() is None


def test_bfloat16_weights_lose_most_of_an_adam_step_at_the_papers_lr_and_float32_master_weights_keep_it(
        tiny_paligemma, tmp_path):
    """The paper's recipe (bfloat16 weights, Adam, lr 2e-5): a step under half a bfloat16 unit of a weight is
    rounded away, so the first update changes a small share of the weights; the `float32_master_weights` option
    changes every weight whose gradient is not zero (the float32 recipe's share), and saves the agent in bfloat16."""
    import json
    shares = {}
    for name, kw in {"paper": {}, "master": {"float32_master_weights": True},
                     "float32": {"dtype": "float32", "mixed_precision": "no"}}.items():
        rec = train_agent(_data(tmp_path), tmp_path / name, AgentRecipe(
            base=str(tiny_paligemma), epochs=1, lr=2e-5, batch_size=4, threads=1, **{
                "dtype": "bfloat16", "mixed_precision": "bf16", **kw}), TPL, progress=False)
        shares[name] = rec["update_share"]
        assert shares[name]["sampled"] > 1000 and 0 <= shares[name]["first_step"] <= 1
    assert shares["paper"]["dtype"] == "bfloat16" and shares["master"]["dtype"] == "float32"
    assert shares["master"]["first_step"] == pytest.approx(shares["float32"]["first_step"], abs=0.01)
    assert shares["paper"]["first_step"] < 0.5 * shares["master"]["first_step"]
    assert json.loads((tmp_path / "master" / "config.json").read_text())["dtype"] == "bfloat16"
    other = A.agent_key("b", AgentRecipe(float32_master_weights=True), [], TPL)
    assert other != A.agent_key("b", AgentRecipe(), [], TPL)                          # another agent
    assert A.agent_key("b", AgentRecipe(loss_chunk=7), [], TPL) == A.agent_key("b", AgentRecipe(), [], TPL)


def _launch(mode: str, base, out, timeout: int = 300):
    """tests/dist_agent_worker.py on two CPU processes (torch.distributed.run, gloo); each rank's record."""
    import json
    import os
    import socket
    from tests.conftest import run_launch
    import sys
    from lib import ROOT
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (out / "tmp").mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TMPDIR": str(out / "tmp")}
    r = run_launch([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
                    "127.0.0.1", "--master_port", str(port), str(ROOT / "tests" / "dist_agent_worker.py"), mode,
                    str(base), str(out)], timeout, env, cwd=ROOT, capture_output=True, text=True)
    ranks = [json.loads((out / f"rank{k}.json").read_text()) for k in range(2) if (out / f"rank{k}.json").exists()]
    r.stderr = "\n".join(ln for ln in r.stderr.splitlines() if "PaliGemmaProcessor" not in ln)   # the processor's advice
    return r, ranks


def test_two_processes_train_the_agent_one_process_trains(tiny_paligemma, tmp_path):
    """`accelerate launch` on two processes (here CPU and gloo) splits the recipe's batch between them and weighs
    each answer token as one process does: the same losses (float32, within 1e-5 relative), the same weights
    within float32 rounding and the same greedy answers."""
    import json
    from lib.models.chat import ResponseCache
    from lib.sei.agents import agent_chat, run_agent
    one = train_agent(_data(tmp_path / "one" / "data"), tmp_path / "one" / "agent", AgentRecipe(
        base=str(tiny_paligemma), **RECIPE), TPL, progress=False)
    r, ranks = _launch("train", tiny_paligemma, tmp_path / "two")
    assert r.returncode == 0 and len(ranks) == 2 and all(x["ok"] for x in ranks), r.stderr[-2000:] + str(ranks)[:2000]
    assert ranks[0]["world"] == 2
    for a, b in zip(one["curve"], ranks[0]["curve"]):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
    assert [c["loss"] for c in ranks[0]["curve"]] == [c["loss"] for c in ranks[1]["curve"]]
    from safetensors.torch import load_file
    w1 = load_file(str(tmp_path / "one" / "agent" / "model.safetensors"))
    w2 = load_file(str(tmp_path / "two" / "agent" / "model.safetensors"))
    assert w1.keys() == w2.keys()
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], atol=1e-5, rtol=1e-4, msg=k)
    test = [e for e in _data(tmp_path / "one" / "data") if e.split == "test"]
    answers = [[x.text for x in run_agent(agent_chat(tmp_path / d / "agent", ResponseCache(tmp_path / f"{d}.sqlite")),
                                          TPL, [(e.img_path, e.inputs) for e in test], 6, progress=False)]
               for d in ("one", "two")]
    assert answers[0] == answers[1]
    assert json.loads((tmp_path / "two" / "agent" / "training.json").read_text())["n_train"] == one["n_train"] == 9


@pytest.mark.parametrize("mode, error", [("nan", "FloatingPointError"), ("refuse", "RecipeMemoryError")])
def test_one_ranks_failure_stops_every_rank(tiny_paligemma, tmp_path, mode, error):
    """A non-finite loss on one rank, or one rank's memory check refusing, stops both ranks at once with an error
    naming the rank (neither waits in a collective for a timeout); nothing is saved."""
    r, ranks = _launch(mode, tiny_paligemma, tmp_path / mode, timeout=240)
    assert len(ranks) == 2 and not any(x["ok"] for x in ranks), r.stderr[-3000:]
    assert all(x["error"].startswith(error) for x in ranks), ranks
    assert "rank 1" in ranks[0]["error"] and "rank 1" in ranks[1]["error"]
    assert not (tmp_path / mode / "agent" / "config.json").exists()


def test_a_launchs_batches_are_one_processs_with_the_last_filled_by_answerless_copies():
    import torch
    from lib.sei.training_step import PaddedExamples, full_batches
    loader = torch.utils.data.DataLoader(list(range(9)), batch_size=4, shuffle=True,
                                         generator=torch.Generator().manual_seed(3))
    batches = full_batches(9, 4, torch.Generator().manual_seed(3))
    for _ in range(2):                                             # each epoch its own order, the same in both
        one, padded = [b.tolist() for b in loader], list(batches)
        assert one == [[i for i in b if i >= 0] for b in padded] and len(batches) == 3
        assert all(len(b) == 4 for b in padded) and padded[-1][1:] == [-(padded[-1][0] + 1)] * 3
    assert [b.tolist() for b in loader] != one                     # (a third epoch differs from the second)
    data = PaddedExamples([{"labels": [5, 6], "_id": "a"}])
    assert data[-1] == {"labels": [-100, -100], "_id": "a (filler)"} and data[0]["labels"] == [5, 6]


def test_fsdp_is_a_gpu_option_and_an_unknown_sharding_is_refused(tiny_paligemma, tmp_path):
    with pytest.raises(ValueError, match="'fsdp' splits a model over GPUs"):
        train_agent(_data(tmp_path), tmp_path / "a", AgentRecipe(base=str(tiny_paligemma), sharding="fsdp", **RECIPE),
                    TPL, progress=False)
    with pytest.raises(ValueError, match="expected 'ddp' or 'fsdp'"):
        train_agent(_data(tmp_path), tmp_path / "b", AgentRecipe(base=str(tiny_paligemma), sharding="zero", **RECIPE),
                    TPL, progress=False)
