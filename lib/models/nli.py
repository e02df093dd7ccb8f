"""memeworld-nli: a small NLI cross-encoder, so that SeeTRUE-Feedback's score can be computed offline.

SeeTRUE-Feedback scores a predicted misaligned phrase by the entailment probability that an NLI
model gives to (premise = the annotated misalignment, hypothesis = the predicted phrase); the
paper uses facebook/bart-large-mnli, which no package ships. The embedded profile fine-tunes the
packaged all-MiniLM-L6-v2 encoder as a two-label cross-encoder (contradiction / entailment) on
pairs built from MemeWorld's scene facts:

- premise: one object's misalignment-style phrase ("blue cup", "zigzag sigil", "red sun on the left");
- entailment: a span of it that starts and ends on a content word ("blue", "cup on the left");
- contradiction: the same span with one content word changed (another colour, kind, symbol or
  position), or a span of another object of the same scene ("green house").

Training pairs come from training memes, the held-out accuracy from the dev memes, never test.
The folder is a standard `BertForSequenceClassification` (id2label names both labels), so
`nli_entailment` (here; CLIP4DM's SeeTRUE scorer) loads it exactly as it loads bart-large-mnli from a local folder.
The task is lexical by construction (MemeWorld's phrases are templated): the model measures whether
the predicted phrase names the annotated fact, not general inference.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from lib.compendium.artifacts import write_json, write_with
from lib.data.memeworld import BENIGN_OBJECTS, COLOURS, POSITION_PHRASE, POSITIONS, SYMBOLS, SceneObject, load_specs
from lib.data.memeworld_align import _phrase_words
from lib.compendium.artifacts import save_weights
from lib.models.memeworld_vlm import fit
from lib.compendium.presets import resolve_model_path
from lib.evaluation.textmetrics import resolve_text_model

LABELS = {0: "contradiction", 1: "entailment"}
FUNCTION_WORDS = {"a", "on", "the", "in"}


@dataclass
class NliConfig:
    """memeworld-nli's recipe (about 40 s of training on one CPU thread)."""
    base: str = "minilm"          # lib.evaluation.textmetrics.resolve_text_model name: the packaged all-MiniLM-L6-v2
    epochs: int = 1
    batch_size: int = 32
    lr: float = 2e-4
    weight_decay: float = 0.01
    train_memes: int = 1000       # training memes that give pairs (two per meme)
    heldout_memes: int = 500      # dev memes for the held-out accuracy
    seed: int = 0
    threads: int = 2


def _object_words(obj: dict[str, Any], with_position: bool) -> list[tuple[str, str | None]]:
    """An object's phrase without its article, each word with the field it expresses."""
    o = SceneObject(**obj)
    words = [(w, f) for w, f in _phrase_words(o)[1:]]
    if with_position:
        pos = POSITION_PHRASE[o.position].split()
        words += [(w, None) for w in pos[:-1]] + [(pos[-1], "position")]
    return words


def _content_spans(words: list[tuple[str, str | None]]) -> list[tuple[int, int]]:
    n = len(words)
    return [(i, j) for i in range(n) for j in range(i + 1, n + 1)
            if words[i][0] not in FUNCTION_WORDS and words[j - 1][0] not in FUNCTION_WORDS]


def _changed(word: str, fieldname: str, rng: np.random.Generator) -> str:
    pool = {"colour": list(COLOURS), "kind": BENIGN_OBJECTS, "symbol": SYMBOLS, "position": list(POSITIONS)}[fieldname]
    choices = [w for w in pool if w != word]
    return choices[rng.integers(len(choices))]


def nli_pairs(rows: Sequence[dict[str, Any]], rng: np.random.Generator, per_meme: int = 2
              ) -> list[tuple[str, str, int]]:
    """(premise, hypothesis, label) pairs from memes' scene objects (memeworld.jsonl rows), half
    entailment, half contradiction. Label ids as LABELS."""
    out: list[tuple[str, str, int]] = []
    for r in rows:
        objs = r["objects"]
        for _ in range(per_meme):
            k = int(rng.integers(len(objs)))
            words = _object_words(objs[k], with_position=bool(rng.random() < 0.3))
            premise = " ".join(w for w, _ in words)
            spans = _content_spans(words)
            i, j = spans[rng.integers(len(spans))]
            span = list(words[i:j])
            if rng.random() < 0.5:
                out.append((premise, " ".join(w for w, _ in span), 1))
                continue
            editable = [t for t, (_, f) in enumerate(span) if f is not None]
            if editable and (len(objs) == 1 or rng.random() < 0.6):
                t = editable[rng.integers(len(editable))]
                span[t] = (_changed(span[t][0], str(span[t][1]), rng), span[t][1])
                out.append((premise, " ".join(w for w, _ in span), 0))
            else:
                others = [q for q in range(len(objs)) if q != k]
                q = others[rng.integers(len(others))] if others else k
                ow = _object_words(objs[q], with_position=bool(rng.random() < 0.3))
                cand = [" ".join(w for w, _ in ow[a:b]) for a, b in _content_spans(ow)]
                hyp = [c for c in cand if c not in premise.split() and c not in premise]
                if not hyp:                       # the other object says nothing the premise does not
                    continue
                out.append((premise, hyp[rng.integers(len(hyp))], 0))
    return out


def _split_rows(memeworld: Path, cfg: NliConfig) -> tuple[list[dict], list[dict]]:
    rows = load_specs(memeworld)
    train = [r for r in rows if r["split"] == "train"][: cfg.train_memes]
    held = [r for r in rows if r["split"] in ("dev_seen", "dev_unseen")][: cfg.heldout_memes]
    return train, held


def train_memeworld_nli(memeworld: Path | str, out_dir: Path | str, cfg: NliConfig = NliConfig(),
                        progress: bool = True) -> dict[str, Any]:
    """Fine-tune the cross-encoder on training memes' pairs; save it; return metrics and curve."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    memeworld, out_dir = Path(memeworld), Path(out_dir)
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    rng = np.random.default_rng([cfg.seed, 31])
    train_rows, held_rows = _split_rows(memeworld, cfg)
    train, held = nli_pairs(train_rows, rng), nli_pairs(held_rows, np.random.default_rng([cfg.seed, 32]))
    base = resolve_text_model(cfg.base)
    tok = AutoTokenizer.from_pretrained(base)
    from transformers.utils import logging as hf_logging
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()          # the new classifier head is meant to be missing from the base
    try:
        model = AutoModelForSequenceClassification.from_pretrained(
            base, num_labels=2, id2label=LABELS, label2id={v: k for k, v in LABELS.items()})
    finally:
        hf_logging.set_verbosity(level)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    steps = cfg.epochs * int(np.ceil(len(train) / cfg.batch_size))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, steps // 10))
                                              * max(0.0, 1 - s / steps))
    model.train()

    def losses(epoch: int):
        order = torch.randperm(len(train)).tolist()
        for s in range(0, len(order), cfg.batch_size):
            b = [train[i] for i in order[s:s + cfg.batch_size]]
            enc = tok([p for p, _, _ in b], [h for _, h, _ in b], padding=True, truncation=True, return_tensors="pt")
            yield model(**enc, labels=torch.tensor([y for _, _, y in b])).loss
    curve, train_s = fit(model, opt, sched, cfg.epochs, steps, losses, "train memeworld-nli", progress)
    model.eval()
    metrics = {"nli_heldout_acc": heldout_accuracy((model, tok), held), "nli_heldout_pairs": len(held),
               "nli_heldout_majority": float(max(np.mean([y for *_, y in held]), 1 - np.mean([y for *_, y in held]))),
               "nli_train_pairs": len(train), "nli_train_s": train_s}
    out_dir.mkdir(parents=True, exist_ok=True)
    write_with(out_dir / "model.safetensors", lambda p: save_weights(model, p))
    model.config.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    write_json(out_dir / "training.json", {"config": asdict(cfg), "curve": curve, "metrics": metrics,
                                           "heldout_examples": [list(x) for x in held[:12]]})
    return {"metrics": metrics, "curve": curve}


def heldout_accuracy(nli_model, pairs: Sequence[tuple[str, str, int]]) -> float:
    """Accuracy of P(entailment) > 0.5 (over entailment and contradiction, as SeeTRUE reads it)."""
    if not pairs:
        return float("nan")
    p = nli_entailment([a for a, _, _ in pairs], [b for _, b, _ in pairs], nli_model)
    return float(np.mean((p > 0.5) == np.array([y == 1 for *_, y in pairs])))


def nli_entailment(premises: Sequence[str], hypotheses: Sequence[str], nli_model, device: str | None = None,
                   batch_size: int = 32) -> np.ndarray:
    """P(entailment) of each (premise, hypothesis) from a sequence-classification NLI model (a
    local folder or a loaded (model, tokenizer) pair): the softmax over the entailment and
    contradiction logits only (neutral dropped), as the official SeeTRUE evaluation does."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    if isinstance(nli_model, (tuple, list)):
        model, tok = nli_model
    else:
        path = resolve_model_path(str(nli_model))          # `{artifacts}/...` for the model trained here
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForSequenceClassification.from_pretrained(path)
    model = model.eval()
    if device:
        model.to(device)
    label2id = {k.lower(): v for k, v in model.config.label2id.items()}
    ent, con = label2id.get("entailment"), label2id.get("contradiction")
    if ent is None or con is None:
        raise ValueError(f"NLI model: needs 'entailment' and 'contradiction' labels in its config "
                         f"(labels: {sorted(label2id)})")
    out = []
    with torch.no_grad():
        for k in range(0, len(premises), batch_size):
            enc = tok(list(premises[k:k + batch_size]), list(hypotheses[k:k + batch_size]), padding=True,
                      truncation=True, return_tensors="pt").to(model.device)
            logits = model(**enc).logits[:, [ent, con]]
            out += logits.softmax(-1)[:, 0].tolist()
    return np.asarray(out, dtype=float)
