"""MemeWorld's image-text misalignment views: FOIL captions (one word swapped for one the image does not
show), nocaps-style novel-object scenes and their foils, HAT / RichHF-style flagged captions and the
SeeTRUE-style aligned and misaligned pairs, each with the gold words an attribution method should find.
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Any

import numpy as np

from lib.data.memeworld import (BACKGROUNDS, BENIGN_OBJECTS, COLOURED_OBJECTS, COLOURS, MemeSpec, NOCAPS_DOMAINS,
                                NOVEL_OBJECTS, POSITIONS, POSITION_PHRASE, SYMBOLS, SceneObject, _fill_text,
                                scene_caption)


def foil_caption(spec: MemeSpec, rng: np.random.Generator) -> tuple[str, str, str]:
    """A FOIL caption of the scene: one word swapped. Returns (foil caption, target word, foil word)."""
    cands = [o for o in spec.objects if o.kind in BENIGN_OBJECTS or o.kind in ("sigil", "defaced")]
    obj = cands[rng.integers(len(cands))]
    new = SceneObject(**asdict(obj))
    if obj.kind in BENIGN_OBJECTS:
        if rng.random() < 0.5:
            target, choices = obj.colour, [c for c in COLOURS if c != obj.colour]
            new.colour = choices[rng.integers(len(choices))]
            foil = new.colour
        else:
            target, choices = obj.kind, [b for b in BENIGN_OBJECTS if b != obj.kind]
            new.kind = choices[rng.integers(len(choices))]
            foil = new.kind
    else:
        target, choices = obj.symbol, [s for s in SYMBOLS if s != obj.symbol]
        new.symbol = choices[rng.integers(len(choices))]
        foil = new.symbol
    objs = [new if o is obj else o for o in spec.objects]
    return scene_caption(objs), str(target), str(foil)


def nocaps_scenes(n_per_domain: int, seed: int) -> list[tuple[MemeSpec, str]]:
    """nocaps-FOIL's scenes: `n_per_domain` benign memes per domain, each with two or three coloured
    objects of which none (in-domain), some but not all (near-domain) or all (out-domain) are
    NOVEL_OBJECTS. Their own random stream: nothing else in MemeWorld moves with them. Ids start
    at 90000, apart from the memes'."""
    rng = np.random.default_rng([seed, 4077])
    out: list[tuple[MemeSpec, str]] = []
    for d, dom in enumerate(NOCAPS_DOMAINS):
        for k in range(n_per_domain):
            n_obj = 2 + int(rng.random() < 0.5)
            n_novel = {0: 0, 1: int(rng.integers(1, n_obj)), 2: n_obj}[d]
            novel = list(rng.choice(NOVEL_OBJECTS, n_novel, replace=False))
            known = list(rng.choice(BENIGN_OBJECTS, n_obj - n_novel, replace=False))
            kinds = novel + known
            rng.shuffle(kinds)
            slots = list(POSITIONS)
            rng.shuffle(slots)
            objs = sorted([SceneObject(str(kd), slots[j], colour=list(COLOURS)[rng.integers(len(COLOURS))])
                           for j, kd in enumerate(kinds)], key=lambda o: POSITIONS[o.position])
            spec = MemeSpec(id=90000 + d * n_per_domain + k, split="nocaps", type="000", text_family="topic",
                            image_family="plain", group=None, text=_fill_text(rng, "topic", None), objects=objs,
                            background=int(rng.integers(len(BACKGROUNDS))), render_seed=int(rng.integers(2**31)))
            out.append((spec, dom))
    return out


def nocaps_foil(spec: MemeSpec, rng: np.random.Generator) -> tuple[str, str, str]:
    """nocaps-FOIL's foil: one object's noun replaced by another of its own vocabulary (a known object
    by a known one, a novel object by a novel one), as nocaps-FOIL swaps object words.
    Returns (foil caption, target word, foil word)."""
    obj = spec.objects[rng.integers(len(spec.objects))]
    pool = NOVEL_OBJECTS if obj.kind in NOVEL_OBJECTS else BENIGN_OBJECTS
    taken = {o.kind for o in spec.objects}
    choices = [k for k in pool if k not in taken]
    new = SceneObject(**asdict(obj))
    new.kind = choices[rng.integers(len(choices))]
    objs = [new if o is obj else o for o in spec.objects]
    return scene_caption(objs), obj.kind, new.kind


#: the edits that make a caption disagree with its picture (HAT, RichHF, SeeTRUE views)
EDITS = ("colour", "kind", "colour+kind", "symbol", "relation")


def _phrase_words(o: SceneObject) -> list[tuple[str, str | None]]:
    """The words of an object's phrase, each with the field it expresses (None: fixed words)."""
    if o.kind in COLOURED_OBJECTS:
        return [("a", None), (str(o.colour), "colour"), (o.kind, "kind")]
    if o.kind == "sigil":
        return [("a", None), (str(o.symbol), "symbol"), ("sigil", None)]
    if o.kind == "defaced":
        return [("a", None), ("crossed-out", None), (str(o.symbol), "symbol"), ("sigil", None)]
    return [(w, None) for w in o.phrase().split()]


def flagged_caption(objects: list[SceneObject], changed: list[set[str]] | None = None) -> list[tuple[str, int]]:
    """The scene caption as (word, is_misaligned) with "," its own word; `changed[i]` names the
    fields of object i that disagree with the picture ("colour", "kind", "symbol", "position")."""
    changed = changed or [set() for _ in objects]
    parts = []
    for o, ch in zip(objects, changed):
        words = [(w, int(f is not None and f in ch)) for w, f in _phrase_words(o)]
        pw = POSITION_PHRASE[o.position].split()
        words += [(w, 0) for w in pw[:-1]] + [(pw[-1], int("position" in ch))]
        parts.append(words)
    out = list(parts[0])
    for k, p in enumerate(parts[1:], start=1):
        out += ([("and", 0)] if k == len(parts) - 1 else [(",", 0)]) + p
    return out


def caption_text(words: list[tuple[str, int]]) -> str:
    return " ".join(w for w, _ in words).replace(" ,", ",")


def misalign(spec: MemeSpec, rng: np.random.Generator, n_edits: int = 1
             ) -> tuple[list[SceneObject], list[set[str]], list[str]]:
    """Up to `n_edits` edits on distinct objects of the scene (never the picture itself): a colour,
    an object kind, both (a two-word phrase), a sigil's symbol, or a swapped relation (two objects
    trade positions in the caption). Returns the described objects, the changed fields per object
    and the edit kinds applied."""
    objs = [SceneObject(**asdict(o)) for o in spec.objects]
    changed: list[set[str]] = [set() for _ in objs]
    kinds: list[str] = []
    for _ in range(n_edits):
        free = [i for i, ch in enumerate(changed) if not ch]
        options = []
        for i in free:
            o = objs[i]
            if o.kind in BENIGN_OBJECTS:
                options += [("colour", i), ("kind", i), ("colour+kind", i)]
            elif o.kind in ("sigil", "defaced"):
                options.append(("symbol", i))
        if len(free) >= 2:
            options.append(("relation", -1))
        if not options:
            break
        kind, i = options[rng.integers(len(options))]
        if kind == "relation":
            a, b = rng.choice(free, 2, replace=False)
            objs[a].position, objs[b].position = objs[b].position, objs[a].position
            changed[a].add("position")
            changed[b].add("position")
        else:
            o = objs[i]
            if "colour" in kind:
                o.colour = [c for c in COLOURS if c != o.colour][rng.integers(len(COLOURS) - 1)]
                changed[i].add("colour")
            if "kind" in kind:
                o.kind = [b for b in BENIGN_OBJECTS if b != o.kind][rng.integers(len(BENIGN_OBJECTS) - 1)]
                changed[i].add("kind")
            if kind == "symbol":
                o.symbol = [x for x in SYMBOLS if x != o.symbol][rng.integers(len(SYMBOLS) - 1)]
                changed[i].add("symbol")
        kinds.append(kind)
    return objs, changed, kinds


def _grounding(words: list[tuple[str, int]]) -> list[list]:
    """HAT's [token, is_misaligned] list, punctuation attached to the word before it."""
    out: list[list] = []
    for w, m in words:
        if w in (",", ".") and out:
            out[-1][0] += w
        else:
            out.append([w, m])
    return out


def misalignment_views(specs: list[MemeSpec], rng: np.random.Generator, img_rel: dict[int, str]
                       ) -> dict[str, Any]:
    """HAT, RichHF and SeeTRUE-Feedback rows for `specs`, labelled by position: every meme gives an
    aligned caption and a misaligned one (HAT), a prompt with 0-3 edits whose score is its number
    of misaligned words (RichHF), and a misaligned caption with the misaligned phrase as feedback
    (SeeTRUE, which has misaligned pairs only)."""
    hat, richhf, seetrue = [], [], []
    for s in specs:
        img = img_rel[s.id]
        gold = flagged_caption(s.objects)
        objs, ch, kinds = misalign(s, rng, 1)
        words = flagged_caption(objs, ch)
        hat.append({"sample_id": f"{s.id}_mis", "image_path": img, "caption": caption_text(words),
                    "references": [caption_text(gold)], "grounding": _grounding(words), "edit": kinds[0] if kinds else ""})
        hat.append({"sample_id": f"{s.id}_orig", "image_path": img, "caption": caption_text(gold),
                    "references": [caption_text(gold)], "grounding": _grounding(gold), "edit": ""})
        n = int(rng.integers(0, 4))
        objs, ch, _ = misalign(s, rng, n)
        words = flagged_caption(objs, ch)
        toks = [(w, m) for w, m in words if w not in (",", ".")]
        richhf.append({"filename": img, "prompt": caption_text(words),
                       "prompt_misalignment_label": " ".join("0" if m else "1" for _, m in toks),
                       "misalignment_score": float(sum(m for _, m in toks))})
        objs, ch, _ = misalign(s, rng, 1)
        words = flagged_caption(objs, ch)
        if any(m for _, m in words):
            # feedback: the misaligned object as a phrase ("blue cup", "zigzag sigil", "red sun on the left")
            # (the edited object's phrase without its article, with its claimed position for a relation)
            k = next(i for i, c in enumerate(ch) if c)
            o = objs[k]
            fb = " ".join(w for w, _ in _phrase_words(o)[1:])
            if "position" in ch[k]:
                fb = f"{fb} {POSITION_PHRASE[o.position]}"
            seetrue.append({"image_path": img, "image_caption": caption_text(words), "caption_misalignment": fb,
                            "id_in_source_dataset": str(s.id), "dataset_source": "memeworld"})
    return {"hat": hat, "richhf": richhf, "seetrue": seetrue}
