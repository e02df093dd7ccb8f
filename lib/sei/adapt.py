"""The few-shot moderator adapted to MemeWorld: the served text-only model with a LoRA adapter trained on
the train split's memes, so that a component which cannot moderate (SmolLM2-135M copies labels) is
replaced by one that can, and See, Explain, Intervene's claims are tested on a moderator that meets its
precondition (lib.evaluation.preconditions).

Each training example is exactly what the served model reads for a zero-shot request (the system turn
with the definitions, the meme's turn with its image replaced by the captioner's caption: the captioned
adapter's `describe`) and the answer the constrained decoder would write for the meme's gold label: the
compact JSON of the answer schema, the explanation from the dataset's gold reasoning and, for a hateful
meme, the intervention from its gold intervention, each cut to the schema's length at a word boundary.

The held-out check that the adapter learned the world and not only the answer format is the same recipe
on the same memes with the labels shuffled (`shuffle_labels`): the format without the labels' relation to
the memes. Both are scored on memes the adapter never saw.

    spec = served_adapter("smollm2-135m-instruct-compact-moderator+memeworld-captions")
    memes = training_memes(pool, gold, n=400, seed=0)        # then each meme's caption set, as for a query
    examples = adaptation_examples(memes, tpl, "memeworld", chat.backend.describe, string_max_length=64)
    info = train_adapter(spec["adapter"], examples, LoraRecipe(epochs=1), spec["base"])
    # then serve(spec["served"]) starts llama.cpp with the base and the adapter
"""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Callable, Sequence

from lib.models import llm_adapt
from lib.models.llm_adapt import (AdaptError, LoraRecipe, clip_words, examples_digest, served_adapter,  # noqa: F401
                                  text_messages)                   # examples_digest, served_adapter: re-exported
from lib.sei.fewshot import LABELS, Meme, SeiTemplates, balanced_subset, build_conversation


def compact_answer(label: int, explanation: str, intervention: str, max_len: int | None) -> str:
    """The answer as the compact-JSON grammar writes it: the schema's keys in order, no whitespace between
    tokens; the intervention only for a hateful meme."""
    if label not in (0, 1):
        raise AdaptError(f"an answer needs a gold label 0 or 1, got {label!r}")
    return json.dumps({"label": LABELS[label], "explanation": clip_words(explanation, max_len),
                       "intervention": clip_words(intervention, max_len) if label == 1 else ""},
                      separators=(",", ":"), ensure_ascii=False)


def training_memes(pool: Sequence[Meme], gold: dict[str, dict[str, list[str]]], n: int, seed: int = 0) -> list[Meme]:
    """The adapter's training memes: `n` of the pool's memes (the train split), drawn seeded and balanced over
    interaction types where the pool has them, among those with a gold label and a gold explanation
    (`gold["explanation"]`: meme id -> texts), a hateful one also a gold intervention; each with the first
    gold text of each kind. The draw looks at nothing but the pool: no test meme decides which memes train
    the adapter. Their captions (what a prompt shows beside the image) are the notebook's to set."""
    usable = []
    for m in pool:
        expl = (gold.get("explanation") or {}).get(m.id) or []
        interv = (gold.get("intervention") or {}).get(m.id) or []
        if m.label not in (0, 1) or not expl or (m.label == 1 and not interv):
            continue
        usable.append(Meme(**{**m.__dict__, "explanation": expl[0], "intervention": interv[0] if m.label == 1 else ""}))
    if not usable:
        raise AdaptError("no training meme has a gold label and a gold explanation")
    by = "type" if all(m.type for m in usable) else "label"
    return balanced_subset(usable, min(n, len(usable)), seed, by=by) if n < len(usable) else usable


def adaptation_examples(memes: Sequence[Meme], tpl: SeiTemplates, definitions: str,
                        describe: Callable[[Sequence[dict[str, Any]]], list[dict[str, Any]]] | None,
                        string_max_length: int | None = None, images: bool = True,
                        shuffle_labels: bool = False, seed: int = 0) -> list[tuple[list[dict[str, str]], str]]:
    """(messages, answer) for each meme: its zero-shot conversation as the served model reads it
    (`describe` replaces images by captions; None when `images` is False) and its gold answer. Each meme
    needs a label and an explanation (`Meme.explanation`), a hateful one an intervention. `shuffle_labels`:
    the labels (with their texts) permuted over the memes, seeded: the control that keeps the format and
    the label rate and drops what ties a label to its meme."""
    for m in memes:
        if m.label not in (0, 1):
            raise AdaptError(f"meme {m.id}: no gold label to train on")
        if not m.explanation.strip():
            raise AdaptError(f"meme {m.id}: no gold explanation (Meme.explanation) to train on")
        if m.label == 1 and not m.intervention.strip():
            raise AdaptError(f"meme {m.id}: hateful, with no gold intervention (Meme.intervention) to train on")
    answers = [compact_answer(m.label, m.explanation, m.intervention, string_max_length) for m in memes]
    if shuffle_labels:
        random.Random(seed).shuffle(answers)
    out = []
    for m, a in zip(memes, answers):
        conv = build_conversation(m, [], tpl, definitions, images)
        if images:
            if describe is None:
                raise AdaptError("images are shown but no describe() turns them into text for a text-only model")
            conv = describe(conv)
        out.append((text_messages(conv), a))
    return out


def train_adapter(adapter: str | Path, examples: Sequence[tuple[Sequence[dict[str, str]], str]],
                  recipe: LoraRecipe, base_gguf: str, progress: bool = True) -> dict[str, Any]:
    """The moderator's adapter (llm_adapt.train_cached), its training.json also giving the share of hateful
    answers it was trained on."""
    return llm_adapt.train_cached(adapter, examples, recipe, base_gguf, progress, summary=lambda ex: {
        "hateful_share": round(sum('"label":"hateful"' in a for _, a in ex) / len(ex), 4)})
