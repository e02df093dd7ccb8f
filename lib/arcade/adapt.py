"""ARCADE's judge adapted to MemeWorld: the served model with a LoRA adapter trained on verdicts of train-split
posts, so that a judge that cannot weigh a debate (SmolLM2-135M writes one label for every post, and with
debaters that state the true cue it scores below the direct judge) is replaced by one that can, and
ARCADE's claims are tested again on a judge that meets its precondition (lib.evaluation.preconditions).

Each training post gives the judge's three requests exactly as the served model reads them (the court's
own prompts, the picture replaced by the captioner's caption), written with debates that state the truth
(lib.arcade.oracle: the prosecutor brings MemeWorld's true cue, the defender the true benign account or a
concession):
- Track I's verdict (`judge`: the accusations and the rebuttals);
- Track II's verdict (`judge_indirect`: the transcript of `rounds` rounds; none for a post without a cue,
  which the court dismisses before any verdict);
- the direct judge's answer (`baseline`: the post alone), so the direct baseline of the claims is adapted too;
and as the answer the post's gold label in the stage's schema (label, label string, the generator's reason
cut to the schema's length), compact JSON as the constrained decoder writes it.

The held-out check that the adapter learned the debate and not only the answer format is the same recipe
on the same posts with each post's answer moved to another post (`shuffle_labels`): the format and the
label rate without their tie to the debate. Both are scored on test posts the adapter never saw.

    posts = training_posts(records, n=32, seed=2024)          # the train split's posts, balanced by type
    ex = verdict_examples(CourtConfig(gate=False), posts, accounts, chat.backend.describe)
    info = train_judge(spec["adapter"], ex, LoraRecipe(epochs=2), spec["base"])   # spec: llm_adapt.served_adapter
"""
from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Sequence

from lib.arcade.court import Court, CourtConfig
from lib.arcade.oracle import oracle_cues, oracle_rebuttals
from lib.arcade.scoring import balanced_sample, sampler_items
from lib.models import llm_adapt
from lib.models.llm_adapt import AdaptError, LoraRecipe, clip_words, text_messages

#: the judge's requests each training post gives, in order (the court's stage names)
JUDGE_STAGES = ("judge", "judge_indirect", "baseline")


def training_posts(records: Sequence[Any], n: int, seed: int = 0, split: str = "train") -> list[Any]:
    """`n` posts of `split` (the train split), drawn by the official balanced sampler over interaction types
    with `seed`. Only records of that split are looked at: no test post decides what trains the judge."""
    pool = [r for r in records if getattr(r, "split", None) == split]
    if not pool:
        raise AdaptError(f"no post of split {split!r} to train the judge on (splits present: "
                         f"{sorted({str(getattr(r, 'split', None)) for r in records})})")
    by_id = {str(r.id): r for r in pool}
    return [by_id[i] for i in balanced_sample(sampler_items(pool), min(n, len(pool)), seed)]


def gold_label(post: Any, class_mode: str) -> int:
    """The post's gold label in the court's class mode (0-5, or 0/1 for binary)."""
    y = post.meta.get("final_label_multiclass", post.label)
    if y is None:
        raise AdaptError(f"post {post.id}: no gold label (meta.final_label_multiclass) to train the judge on")
    y = int(y)
    return int(y > 0) if class_mode == "binary" else y


def verdict_answer(schema: dict[str, Any], label: int, reason: str, max_len: int | None) -> str:
    """The answer as the compact-JSON grammar writes it for `schema` (a verdict or the baseline's): its keys
    in the schema's order, the label string from the schema's enum, the reason cut at a word boundary."""
    props = schema.get("properties") or {}
    out: dict[str, Any] = {}
    for key, spec in props.items():
        if key == "label":
            out[key] = label
        elif key == "label_str":
            enum = spec.get("enum") or []
            if not 0 <= label < len(enum):
                raise AdaptError(f"label {label} has no label_str in the schema's enum {enum}")
            out[key] = enum[label]
        elif key == "reason":
            cap = min(x for x in (max_len, spec.get("maxLength")) if x) if (max_len or spec.get("maxLength")) else None
            out[key] = clip_words(reason, cap)
        else:
            raise AdaptError(f"the verdict schema has a field {key!r} the adapter cannot fill")
    return json.dumps(out, separators=(",", ":"), ensure_ascii=False)


def verdict_examples(cfg: CourtConfig, posts: Sequence[Any], accounts: dict[str, dict[str, Any]],
                     describe: Callable[[Sequence[dict[str, Any]]], list[dict[str, Any]]] | None,
                     stages: Sequence[str] = JUDGE_STAGES, shuffle_labels: bool = False,
                     seed: int = 0) -> list[tuple[list[dict[str, str]], str]]:
    """(messages, answer) for each post and judge stage: the request as the court builds it under `cfg`
    (its prompts, layout, class mode, rounds and string cap) with truthful debaters, the picture described
    by `describe` (None: the post has no image file, the court's placeholder stays), and the gold verdict.
    `shuffle_labels`: each post's answers go to another post (seeded permutation), the control."""
    bad = [s for s in stages if s not in JUDGE_STAGES]
    if bad:
        raise AdaptError(f"judge stages {bad}: the adapter answers only {', '.join(JUDGE_STAGES)}")
    court = Court(None, cfg)                  # only its prompts and message layout: nothing is asked
    truth = []
    for p in posts:
        account = accounts.get(str(p.id))
        if account is None:
            raise AdaptError(f"post {p.id}: no generator account (MemeWorld's memeworld.jsonl) to write its debate")
        truth.append((gold_label(p, cfg.class_mode), str(account.get("final_reason") or "")))
    answers = list(truth)
    if shuffle_labels:
        random.Random(seed).shuffle(answers)
    out = []
    for p, (label, reason) in zip(posts, answers):
        account = accounts[str(p.id)]
        cues, rebuttals = oracle_cues(account), oracle_rebuttals(account)
        for stage in stages:
            if stage == "judge":
                fields = {"accusations": court._dumps(cues), "rebuttals": court._dumps(rebuttals)}
            elif stage == "judge_indirect":
                if not cues:                  # the court dismisses such a post: no Track II verdict is asked
                    continue
                history = [{"round": r, "prosecutor": cues, "defense": rebuttals} for r in range(1, cfg.rounds + 1)]
                fields = {"transcript": court._dumps(history)}
            else:
                fields = {}
            conv = court._messages(stage, p, court.prompts.user(stage).text.format(**fields))
            if describe is not None:
                conv = describe(conv)
            out.append((text_messages(conv), verdict_answer(court.prompts.schema(stage), label, reason,
                                                            cfg.string_max_length)))
    return out


def label_counts(examples: Sequence[tuple[Sequence[dict[str, str]], str]]) -> dict[str, int]:
    """How many training answers carry each label (a string key per label)."""
    c = Counter(json.loads(a)["label"] for _, a in examples)
    return {str(k): int(v) for k, v in sorted(c.items())}


def train_judge(adapter: str | Path, examples: Sequence[tuple[Sequence[dict[str, str]], str]], recipe: LoraRecipe,
                base_gguf: str, progress: bool = True) -> dict[str, Any]:
    """The judge's adapter (llm_adapt.train_cached), its training.json also giving the answers' labels."""
    return llm_adapt.train_cached(adapter, examples, recipe, base_gguf, progress,
                                  summary=lambda ex: {"label_counts": label_counts(ex)})
