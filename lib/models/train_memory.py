"""The GPU memory of one full fine-tuning step of a vision-language decoder, from its configuration.

Used twice: `lib.sei.agents.train_agent` refuses, before loading anything onto the GPU, a recipe whose
step cannot fit the visible GPU (with a margin) and names settings that fit; `lib.compendium.costs` prints the
same estimate in the cost table. The terms, in bytes, for `b` examples of `s` tokens:

- **states**: the weights and Adam's two moments in the weights' dtype (`6 P` in 16-bit). In the
  forward and backward passes the gradients are not added: they are created during the backward pass
  while the activations they replace are freed, and `zero_grad(set_to_none=True)` drops them before the
  next forward (with gradient accumulation they live through the next micro-batch's forward: `+ 2 P`);
- **decoder activations** per layer and token: the attention block's saved inputs and outputs
  (`12 h`), a gated MLP's four `f`-wide tensors (gate, up, activation, product: `8 f` in 16-bit;
  Gemma's MLP is 8x its width, so this term dominates), plus eager attention's scores and
  probabilities (`4 a s`: the quadratic term, absent with SDPA/flash attention);
- **vision-tower activations**, the same per layer and image token with a non-gated MLP (`4 f`);
- **logits**: 16-bit logits, their float32 upcast in the loss and its float32 log-softmax, over
  the whole vocabulary (`10 V` per token): PaliGemma's 257k vocabulary makes this the largest
  per-example term;
- **gradient checkpointing** (non-reentrant) keeps only each layer's input (`2 h`) and recomputes
  one layer at a time during the backward pass;
- **the optimizer step**, a peak of its own once the activations are gone: the weights, every gradient,
  Adam's two moments and the update's temporaries (`OPTIMIZER_TEMPORARIES`): torch's multi-tensor Adam,
  the default on a GPU, builds one weights-sized temporary at a time (the square root of the second
  moment, and before it the gradient plus weight decay for Adam's coupled decay), the fused Adam none,
  the one-tensor-at-a-time loop one copy of the largest tensor. In 16-bit that is `10 P` for the
  multi-tensor Adam: 27.2 GiB for PaliGemma-3B, a floor under every batch size.

The step's peak is the larger of the two (`total`); the terms are returned beside it.

Checked against measurements of PaliGemma-3B-448 (bf16, eager attention, 1,536 tokens) on one
H100 80GB: batch 2 peaked at 37.2 GiB, batch 4 at 58.0, batch 8 ran out of memory (71.8 GiB in use
before an 11.8 GiB allocation), batch 8 with gradient checkpointing peaked at 53.4 GiB
(results/gpu/h100_agent_recipe.json). The estimate is within 10% of each, and above the failed batch's
lower bound (tests/test_train_memory.py); at those settings the forward/backward peak is the larger, while
with SDPA, the answer's logits alone and checkpointing the optimizer step is.

Free memory is what the device has free plus what torch's caching allocator holds reserved but unused
(`free_bytes`): `torch.cuda.mem_get_info` counts those cached blocks as used.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GIB = 1024 ** 3


@dataclass(frozen=True)
class TowerShape:
    layers: int
    hidden: int
    intermediate: int
    heads: int
    gated_mlp: bool


@dataclass(frozen=True)
class ModelShape:
    """What a training step's memory depends on."""
    params: float                      # every parameter (vision tower included)
    decoder: TowerShape
    vocab: int
    image_tokens: int = 0              # tokens the vision tower sees per image (0: no vision tower)
    vision: TowerShape | None = None
    weight_bytes: int = 2              # 2: bf16/fp16 weights; 4: float32
    eager_attention: bool = True       # eager attention materialises the s x s scores per head


def _tower(cfg: Any, gated: bool) -> TowerShape:
    return TowerShape(int(cfg.num_hidden_layers), int(cfg.hidden_size), int(cfg.intermediate_size),
                      int(cfg.num_attention_heads), gated)


def shape_of(model: Any) -> ModelShape:
    """The shape of a loaded transformers vision-language model (PaliGemma, LLaVA-style, or a text-only
    causal LM). Gated MLPs are recognised by a `gate_proj` module in the decoder."""
    cfg = model.config
    text = getattr(cfg, "text_config", None) or cfg
    vision = getattr(cfg, "vision_config", None)
    gated = any(name.endswith("gate_proj") for name, _ in model.named_modules())
    img_tokens = 0
    if vision is not None:
        img_tokens = int(getattr(cfg, "image_seq_length", 0) or getattr(vision, "num_image_tokens", 0) or
                         (int(vision.image_size) // int(vision.patch_size)) ** 2)
    p = next(model.parameters())
    attn = getattr(cfg, "_attn_implementation", None) or "eager"
    return ModelShape(params=float(sum(t.numel() for t in model.parameters())), decoder=_tower(text, gated),
                      vocab=int(text.vocab_size), image_tokens=img_tokens,
                      vision=_tower(vision, False) if vision is not None else None,
                      weight_bytes=int(p.element_size()), eager_attention=attn == "eager")


def _layer_bytes_per_token(t: TowerShape, seq: int, eager: bool, act_bytes: int) -> float:
    mlp = (4 if t.gated_mlp else 2) * t.intermediate
    attn_scores = 2 * t.heads * seq if eager else 0
    return act_bytes * (6 * t.hidden + mlp + attn_scores)


#: Adam's temporaries in the optimizer step, in parameters' worth of the weights' dtype, by implementation:
#: "foreach" (torch's multi-tensor Adam, its default on a GPU) holds one weights-sized temporary at a time,
#: "fused" none, "for-loop" one copy of the largest tensor (counted by `optimizer_bytes`)
OPTIMIZER_TEMPORARIES = {"foreach": 1.0, "fused": 0.0, "for-loop": None}


def largest_tensor(shape: ModelShape) -> float:
    """Elements of the largest weight: the token embedding (vocab x hidden), or an MLP matrix."""
    d = shape.decoder
    sizes = [shape.vocab * d.hidden, d.hidden * d.intermediate]
    if shape.vision is not None:
        sizes.append(shape.vision.hidden * shape.vision.intermediate)
    return float(max(sizes))


def optimizer_bytes(shape: ModelShape, optimizer: str = "foreach", shards: int = 1) -> dict[str, float]:
    """The optimizer step's peak, by term: weights, gradients, Adam's two moments (all in the weights' dtype,
    as torch keeps them) and the update's temporaries (`OPTIMIZER_TEMPORARIES`). `shards`: the processes a fully
    sharded model (FSDP) splits all of them over; each holds its share."""
    if optimizer not in OPTIMIZER_TEMPORARIES:
        raise ValueError(f"optimizer {optimizer!r}: expected one of {sorted(OPTIMIZER_TEMPORARIES)}")
    if shards < 1:
        raise ValueError(f"shards must be at least 1, got {shards}")
    per = shape.weight_bytes
    temp = OPTIMIZER_TEMPORARIES[optimizer]
    temp_bytes = (largest_tensor(shape) if temp is None else temp * shape.params) * per
    terms = {"weights": shape.params * per, "gradients": shape.params * per, "moments": 2 * shape.params * per,
             "temporaries": temp_bytes}
    terms = {k: v / shards for k, v in terms.items()}
    return {**terms, "total": sum(terms.values())}


def step_bytes(shape: ModelShape, batch: int, seq_len: int, gradient_checkpointing: bool = False,
               act_bytes: int = 2, logit_tokens: int | None = None, grad_accum: int = 1,
               optimizer: str = "foreach", shards: int = 1, ddp: bool = False) -> dict[str, float]:
    """Peak bytes of one training step with Adam, by term (see the module docstring): the forward/backward
    peak (`states` + `activations` + `logits`, plus the gradients kept between micro-batches when
    `grad_accum` > 1) and the optimizer step's (`optimizer_step`); `total` is the larger. `logit_tokens`: the
    positions whose logits are computed (default all `seq_len`; the answer span with `answer_logits_only`).
    `shards`: a fully sharded model (FSDP) over that many processes holds its share of the weights, gradients and
    Adam state, plus one layer's full weights while it runs (counted as the largest tensor twice); activations and
    logits are each process's own. `ddp`: DistributedDataParallel's gradient buckets, a second copy of every
    gradient (its default; bucket views would make an unused weight's missing gradient a zero one, which Adam's
    weight decay then moves), held from the backward pass through the optimizer step."""
    states = shape.params * shape.weight_bytes * 3 / shards
    if shards > 1:
        states += 2 * largest_tensor(shape) * shape.weight_bytes
    d = shape.decoder
    layer = _layer_bytes_per_token(d, seq_len, shape.eager_attention, act_bytes) * seq_len * batch
    vis_layer = 0.0
    if shape.vision is not None and shape.image_tokens:
        vis_layer = (_layer_bytes_per_token(shape.vision, shape.image_tokens, shape.eager_attention, act_bytes)
                     * shape.image_tokens * batch)
    if gradient_checkpointing:
        kept = act_bytes * batch * (d.layers * d.hidden * seq_len
                                    + (shape.vision.layers * shape.vision.hidden * shape.image_tokens
                                       if shape.vision is not None else 0))
        acts = kept + max(layer, vis_layer)
    else:
        acts = layer * d.layers + vis_layer * (shape.vision.layers if shape.vision is not None else 0)
    logits = batch * (logit_tokens or seq_len) * shape.vocab * (act_bytes + 4 + 4)
    kept_grads = shape.params * shape.weight_bytes / shards if grad_accum > 1 else 0.0
    forward_backward = states + kept_grads + acts + logits
    buckets = shape.params * shape.weight_bytes if ddp else 0.0
    opt = optimizer_bytes(shape, optimizer, shards)["total"] + buckets
    return {"states": states, "activations": acts, "logits": logits, "accumulated_gradients": kept_grads,
            "ddp_buckets": buckets, "forward_backward": forward_backward + buckets, "optimizer_step": opt,
            "total": max(forward_backward + buckets, opt)}


def free_bytes(device: Any = None) -> float:
    """What a CUDA device can still give this process: its free memory plus the blocks torch's caching
    allocator holds reserved but unused (`mem_get_info` counts them as used)."""
    import torch
    free, _ = torch.cuda.mem_get_info(device)
    return float(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))


def fits(total_bytes: float, available_bytes: float, margin: float = 0.10) -> bool:
    return total_bytes * (1 + margin) <= available_bytes


def settings_that_fit(shape: ModelShape, batch: int, grad_accum: int, seq_len: int, available_bytes: float,
                      gradient_checkpointing: bool, margin: float = 0.10,
                      logit_tokens: int | None = None, shards: int = 1, ddp: bool = False) -> list[dict[str, Any]]:
    """Settings with the same effective batch (batch x grad_accum) that fit, best first: the same batch with
    gradient checkpointing, then smaller batches with more accumulation, with and without checkpointing."""
    effective = batch * grad_accum
    out = []
    for ckpt in ([gradient_checkpointing] if gradient_checkpointing else [True, False]):
        b = batch
        while b >= 1:
            if effective % b == 0:
                need = step_bytes(shape, b, seq_len, ckpt, logit_tokens=logit_tokens,
                                  grad_accum=effective // b, shards=shards, ddp=ddp)["total"]
                if fits(need, available_bytes, margin):
                    out.append({"batch_size": b, "grad_accum": effective // b, "gradient_checkpointing": ckpt,
                                "gib": need / GIB})
                    break
            b //= 2
    return sorted(out, key=lambda r: (-r["batch_size"], r["gradient_checkpointing"]))


class RecipeMemoryError(RuntimeError):
    """A training recipe that cannot fit the GPU it would run on."""


def check_fits(shape: ModelShape, batch: int, grad_accum: int, seq_len: int, available_bytes: float,
               gradient_checkpointing: bool, where: str = "the GPU", margin: float = 0.10,
               logit_tokens: int | None = None, shards: int = 1, ddp: bool = False) -> dict[str, float]:
    """Raise RecipeMemoryError, naming settings that fit, when one step's estimated peak (plus `margin`)
    exceeds `available_bytes`; otherwise return the estimate's terms."""
    est = step_bytes(shape, batch, seq_len, gradient_checkpointing, logit_tokens=logit_tokens, grad_accum=grad_accum,
                     shards=shards, ddp=ddp)
    if fits(est["total"], available_bytes, margin):
        return est
    alts = settings_that_fit(shape, batch, grad_accum, seq_len, available_bytes, gradient_checkpointing, margin,
                             logit_tokens, shards, ddp)
    terms = ", ".join(f"{k.replace('_', ' ')} {v / GIB:.1f}" for k, v in est.items() if k != "total" and v)
    hint = ("; settings with the same effective batch that fit: " + "; ".join(
        f"batch_size {a['batch_size']}, grad_accum {a['grad_accum']}, gradient_checkpointing "
        f"{str(a['gradient_checkpointing']).lower()} (~{a['gib']:.0f} GiB)" for a in alts)) if alts else (
        "; no batch size fits: use a GPU with more memory or a shorter max_len")
    raise RecipeMemoryError(
        f"batch_size {batch} x max_len {seq_len} (gradient_checkpointing {str(gradient_checkpointing).lower()}) "
        f"needs about {est['total'] / GIB:.1f} GiB per step ({terms} GiB) plus a {margin:.0%} margin; "
        f"{where} has {available_bytes / GIB:.1f} GiB free{hint}")
