"""One step of an agent's training, apart from the recipe and the data (lib.sei.agents): the answer-only loss and
what `_collate` computes for it, the examples that make their pixels per batch, agreement between the processes of
a launch, the share of weights an update changed, and what training leaves behind. Part of the agents' training
code (`lib.sei.agents.TRAINING_CODE`): a change here retrains them."""
from __future__ import annotations

import gc
from typing import Any, Callable

import torch
from PIL import Image

from lib.models.train_memory import RecipeMemoryError


class TrainingDataError(ValueError):
    """Training data that cannot be trained on as given."""


#: what `_collate` adds for `answer_loss`, all computed on the CPU so that the loss needs no host synchronisation:
#: the (row, position) of every position that predicts an answer token, its target, and their number
ANSWER_KEYS = ("_answer_rows", "_answer_cols", "_answer_targets", "_answer_count")


def _answer_index(lab: "torch.Tensor") -> dict[str, Any]:
    rows, cols = (lab[:, 1:] != -100).nonzero(as_tuple=True)      # position p predicts the token at p + 1
    return {"_answer_rows": rows, "_answer_cols": cols, "_answer_targets": lab[rows, cols + 1],
            "_answer_count": int(rows.numel())}


#: above this many bytes of pixels (every training example's, in float32), and in every process of a launch, the
#: examples keep their tokens and make their pixels when a batch asks (LazyExamples): on HatReDAug at 448 px that is
#: about 20 GB per process, where the embedded agents' few hundred examples hold well under this
LAZY_PIXEL_BYTES = 2 * 1024 ** 3


class LazyExamples(torch.utils.data.Dataset):
    """Encoded training examples whose pixels are made when a batch asks for them: `encode` (the agents'
    `encode_example` with the processor and max_len bound) again on the
    example's image, prompt and target (`_src`), its tokens checked against the first encoding. The same tensors as
    encoding everything first; memory for one batch's pixels instead of every example's, per process."""

    def __init__(self, encoded: list[dict[str, Any]], encode: Callable[[Any, str, str], dict[str, Any]]):
        self.encoded, self.encode = encoded, encode

    def __len__(self) -> int:
        return len(self.encoded)

    def __getitem__(self, i: int) -> dict[str, Any]:
        x = self.encoded[i]
        path, prompt, target = x["_src"]
        with Image.open(path) as im:
            enc = self.encode(im.convert("RGB"), prompt, target)
        if enc["input_ids"] != x["input_ids"]:
            raise TrainingDataError(f"training example {x['_id']} ({path}) encodes differently than when it was read: "
                                 "its image or the processor changed during training")
        return {**x, **{k: v for k, v in enc.items() if isinstance(v, torch.Tensor)}}


class PaddedExamples(torch.utils.data.Dataset):
    """Examples, and at index -(j + 1) an answerless copy of example j (every label -100: no token of it counts)."""

    def __init__(self, base):
        self.base = base

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> dict[str, Any]:
        if i >= 0:
            return self.base[i]
        x = self.base[-i - 1]
        return {**x, "labels": [-100] * len(x["labels"]), "_id": f"{x['_id']} (filler)"}


class FullBatches:
    """The batches one process's shuffled DataLoader makes of `n` examples, a new order each epoch from the same
    sampler and generator, the last batch filled up to `batch_size` with answerless copies of its own first
    example (PaddedExamples' negative indices): a launch splits every batch evenly, and nothing is trained twice.
    A batch sampler (accelerate's split_batches reads its `batch_size`)."""

    def __init__(self, n: int, batch_size: int, generator: "torch.Generator"):
        self.n, self.batch_size, self._generator, self.drop_last = n, batch_size, generator, False

    def __len__(self) -> int:
        return -(-self.n // self.batch_size)

    def __iter__(self):
        # a DataLoader draws its workers' base seed from the generator before the sampler's order: so do we
        torch.empty((), dtype=torch.int64).random_(generator=self._generator)
        order = list(torch.utils.data.RandomSampler(range(self.n), generator=self._generator))
        for s in range(0, self.n, self.batch_size):
            b = order[s:s + self.batch_size]
            yield b + [-(b[0] + 1)] * (self.batch_size - len(b))


def full_batches(n: int, batch_size: int, generator: "torch.Generator") -> FullBatches:
    return FullBatches(n, batch_size, generator)


def _every_rank_or_none(acc, error: Exception | None) -> None:
    """Raise on every process of a launch when any process has an error (its own error where it has one, else
    one naming the ranks that do); one process alone does nothing but raise its own. Keeps ranks in step: a
    rank that stopped alone would leave the others waiting in a collective until its timeout."""
    if acc.num_processes == 1:
        if error is not None:
            raise error
        return
    from accelerate.utils import gather_object
    msgs = gather_object([None if error is None else f"{type(error).__name__}: {error}"])
    failed = [(r, m) for r, m in enumerate(msgs) if m]
    if failed:            # every rank raises the same account of every rank's error (the earliest rank first)
        kind = type(error) if error is not None else (
            FloatingPointError if all(m.startswith("FloatingPointError") for _, m in failed) else RecipeMemoryError)
        raise kind(f"rank {acc.process_index} of {acc.num_processes} stops with the launch: "
                   + "; ".join(f"rank {r}: {m}" for r, m in failed))


def _global_count(acc, answer: dict[str, Any]) -> "torch.Tensor":
    """The whole batch's answer tokens, summed over the processes it was split across (a device tensor: no host
    synchronisation)."""
    n = torch.full((), float(answer["_answer_count"]), device=acc.device)     # filled there: no copy from the host
    return acc.reduce(n, reduction="sum")


def release_training(acc, model) -> None:
    """Drop what keeps a trained model alive after its training: accelerate's lists of prepared objects, and
    the forward it bound to the model itself for mixed precision (a bound method of the model stored on the
    model: a reference cycle only the garbage collector would break, holding the weights, and through the
    optimizer the gradients and Adam's state, until it ran). Then collect, so that the memory is free when
    `train_agent` returns: a second agent trained in the same process gets the whole device."""
    for m in {id(x): x for x in (model, acc.unwrap_model(model, keep_fp32_wrapper=False))}.values():
        m.__dict__.pop("forward", None)
        m.__dict__.pop("_original_forward", None)
    acc.free_memory()
    gc.collect()


def empty_device_cache() -> None:
    """Return the caching allocator's unused blocks to the device (a no-op without CUDA)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


class UpdateProbe:
    """The share of weights one optimizer step changes, measured on a fixed random sample of each weight tensor
    (`sample` elements, or all of a smaller one) copied before the step and compared after it. In bfloat16 a step
    under half a unit in the last place of a weight is rounded away: at the paper's lr of 2e-5 that is any weight
    above about 8e-3 in magnitude (2^-7), so most of a trained model's weights do not move."""

    def __init__(self, model, sample: int = 4096, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        # a sharded (FSDP) weight is sampled in this process's shard
        self.params = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters() if p.requires_grad]
        self.index = [(torch.arange(p.numel()) if p.numel() <= sample else
                       torch.randint(0, p.numel(), (sample,), generator=g)).to(p.device) for p in self.params]
        self.before_values: list["torch.Tensor"] = []
        self.measured: list[dict[str, float]] = []

    def before(self) -> None:
        self.before_values = [p.detach().reshape(-1)[i].clone() for p, i in zip(self.params, self.index)]

    def after(self) -> None:
        changed = torch.stack([(p.detach().reshape(-1)[i] != b).sum() for p, i, b in
                               zip(self.params, self.index, self.before_values)]).sum()
        n = sum(int(i.numel()) for i in self.index)
        self.measured.append({"changed": changed, "sampled": n})  # a device tensor: read once, at the end
        self.before_values = []

    def shares(self) -> dict[str, Any]:
        """{"first_step": share, "last_step": share, "sampled": n, "dtype": the weights' dtype}."""
        if not self.measured:
            return {}
        vals = [float(m["changed"]) / m["sampled"] for m in self.measured]
        return {"first_step": round(vals[0], 6), "last_step": round(vals[-1], 6), "sampled": self.measured[0]["sampled"],
                "dtype": str(self.params[0].dtype).removeprefix("torch.") if self.params else None}


def answer_loss(model, batch: dict[str, Any], answer: dict[str, Any], head, autocast, chunk: int = 1024,
                denominator=None) -> "torch.Tensor":
    """The causal-LM loss on the answer tokens (mean cross-entropy over labels != -100, in float32) without the
    vocabulary-wide logits: the model runs with a hook on its output layer (`head`) that keeps the final hidden
    states and lets the layer compute one position; the answer positions (`answer`: `_collate`'s indices,
    computed on the CPU, so nothing here waits on the device) are gathered and the output layer, the float32
    upcast and the cross-entropy run on `chunk` of them at a time, each chunk recomputed in the backward pass
    rather than kept (torch.utils.checkpoint). `autocast`: the accelerator's autocast context, so the chunks
    compute as the model's own output layer would. The same value and gradients as the model's own loss."""
    kept: list[Any] = []

    def keep_hidden(_module, args):
        kept.append(args[0])
        return (args[0][:, -1:],)             # the model's own logits: one position, unused

    hook = head.register_forward_pre_hook(keep_hidden)
    try:
        model(**{k: v for k, v in batch.items() if k != "labels"})
    finally:
        hook.remove()
    hidden = kept[0][answer["_answer_rows"], answer["_answer_cols"]]
    cap = _softcap(model)
    targets = answer["_answer_targets"]

    def chunk_loss(h, t):
        with autocast():
            logits = head(h)
        logits = logits.float()
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return torch.nn.functional.cross_entropy(logits, t, reduction="sum")

    from torch.utils.checkpoint import checkpoint
    total = sum(checkpoint(chunk_loss, hidden[i:i + chunk], targets[i:i + chunk], use_reentrant=False)
                for i in range(0, answer["_answer_count"], chunk))
    if not answer["_answer_count"]:          # this process's share of the batch has no answer token
        total = hidden.sum() * 0.0
    return total / (max(1, answer["_answer_count"]) if denominator is None else denominator)


def _softcap(model) -> float | None:
    """The final logit soft-capping of Gemma-2 decoders (PaliGemma 2), applied after the output layer."""
    cfg = getattr(model, "config", None) or getattr(getattr(model, "module", None), "config", None)
    text = getattr(cfg, "text_config", None) or cfg
    return getattr(text, "final_logit_softcapping", None)
