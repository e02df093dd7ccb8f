"""MemeWorld written to disk in the real formats (FHM, MultiOFF, H-VLI, MAMI, HatReD, MemeCap, MemeSense,
FOIL, nocaps-FOIL, HAT, RichHF, SeeTRUE), with its datasheet and the unimodal Bayes readers' ceilings.

    python -m lib.data.memeworld_files --out DIR --seed S --n N
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import time
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from lib.compendium.artifacts import write_json, write_jsonl, write_text
from lib.data.records import MemeRecord
from lib.data.injection import build_injection_set
from lib.data.memeworld_draw import render_to_file
from lib.data.memeworld_align import foil_caption, misalignment_views, nocaps_foil, nocaps_scenes
from lib.data.memeworld import (CATEGORY_NAMES, DIFFICULTY, GROUPS, HVLI_LABEL_STR, MemeSpec, NOVEL_OBJECTS,
                                SPLIT_SHARES, UNSEEN_COMBOS, category, commonsense, explanation, intervention,
                                observed_final_category, observed_type, reasons, sample_specs, scene_caption)


# ----------------------------------------------------------------------------- writing
def _write_json(path: Path, obj: Any) -> None:
    write_json(path, obj, indent=None)


def _write_csv(path: Path, header: list[str], rows: list[list], delimiter: str = ",") -> None:
    buf = io.StringIO()
    w = csv.writer(buf, delimiter=delimiter, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    write_text(path, buf.getvalue())


def unimodal_bayes_readers(specs: list[MemeSpec], train_splits=("train",), eval_splits=("test_seen", "test_unseen")
                           ) -> dict[str, dict[str, float]]:
    """Accuracy of the Bayes-optimal reader of one modality, on the whole evaluation split and
    restricted to each interaction type.

    Each reader sees the label-relevant content of one modality: the text reader the text's family
    and the group it names (if it names one), the image reader the picture's family and the
    targeted group where the picture is a defaced sigil. Keying on this content rather than on the
    exact string lets the reader generalise as a model can (an unseen text of a seen family is
    read like its family). Each predicts the majority final label of its input in the train split
    (the overall majority for an input never seen there). Its `overall` accuracy bounds, up to
    estimation noise from the train split, any reader of that modality on the whole split. Its per-type accuracies are *not* per-type bounds:
    a model that trades whole-split accuracy for one type (always answering "hateful" scores 1.0
    on type 001) can beat them on that type. `rule_reader` is the generator's own rules: its
    accuracy is limited only by label noise.
    """
    def key_text(s):
        named = s.group is not None and any(n in s.text for n in GROUPS[s.group][:2])
        return (s.text_family, s.group if named else None)
    def key_image_family(s): return (s.image_family, s.group if s.image_family == "defaced" else None)
    out: dict[str, dict[str, float]] = {}
    train = [s for s in specs if s.split in train_splits]
    overall = int(np.mean([s.final_label for s in train]) >= 0.5)
    for name, keyf in (("text_only", key_text), ("image_only", key_image_family)):
        votes: dict[Any, Counter] = defaultdict(Counter)
        for s in train:
            votes[keyf(s)][s.final_label] += 1
        per_type: dict[str, list[int]] = defaultdict(list)
        for s in specs:
            if s.split not in eval_splits:
                continue
            v = votes.get(keyf(s))
            pred = v.most_common(1)[0][0] if v else overall
            per_type[s.type].append(int(pred == s.final_label))
        out[name] = {t: float(np.mean(v)) for t, v in sorted(per_type.items())}
        out[name]["overall"] = float(np.mean([x for v in per_type.values() for x in v]))
    per_type = defaultdict(list)
    for s in specs:
        if s.split in eval_splits:
            per_type[s.type].append(int(s.final_label_clean == s.final_label))
    out["rule_reader"] = {t: float(np.mean(v)) for t, v in sorted(per_type.items())}
    out["rule_reader"]["overall"] = float(np.mean([x for v in per_type.values() for x in v]))
    return out


def write_memeworld(out: Path | str, n: int = 10000, seed: int = 0, image_size: int = 128,
                    label_noise: float = 0.02, confounder_rate: float = 0.15, n_multioff: int = 800,
                    nocaps_per_domain: int | None = None, workers: int | None = None, progress: bool = True) -> dict[str, Any]:
    """Generate MemeWorld and write every dataset view in its real format under `out`.

    Returns a summary (counts, ceilings, and the render time) that is also written to `out/datasheet.json`
    (all but the render time, so that the files depend on the parameters only). nocaps-FOIL gets
    `nocaps_per_domain` scenes per domain (default 6% of `n`: 600 for the 10,000-meme world).
    """
    t0 = time.time()
    out = Path(out)
    (out / "img").mkdir(parents=True, exist_ok=True)
    specs = sample_specs(n, seed, label_noise=label_noise, confounder_rate=confounder_rate)
    mo_specs = sample_specs(n_multioff, seed + 7919, label_noise=label_noise, confounder_rate=0.0) if n_multioff else []
    (out / "multioff" / "Labelled Images").mkdir(parents=True, exist_ok=True)
    jobs = [(asdict(s), str(out / "img" / f"{s.id:05d}.png"), image_size, "fhm") for s in specs]
    jobs += [(asdict(s), str(out / "multioff" / "Labelled Images" / f"mo_{s.id:05d}.png"), image_size, "multioff")
             for s in mo_specs]
    if nocaps_per_domain is None:
        nocaps_per_domain = max(1, round(0.06 * n))
    nc_specs = nocaps_scenes(nocaps_per_domain, seed) if nocaps_per_domain else []
    (out / "nocaps_foil" / "img").mkdir(parents=True, exist_ok=True)
    jobs += [(asdict(s), str(out / "nocaps_foil" / "img" / f"nc_{s.id:05d}.png"), image_size, "fhm")
             for s, _ in nc_specs]
    workers = workers or min(4, os.cpu_count() or 1)
    if workers > 1:
        with ProcessPoolExecutor(workers) as ex:
            for _ in tqdm(ex.map(render_to_file, jobs, chunksize=64), total=len(jobs), desc="render memes",
                          disable=not progress):
                pass
    else:
        for j in tqdm(jobs, desc="render memes", disable=not progress):
            render_to_file(j)
    t_render = time.time() - t0
    rng = np.random.default_rng(seed + 1)
    img_rel = {s.id: f"img/{s.id:05d}.png" for s in specs}

    # master file: every latent field, for analyses that need the generator's truth
    master = []
    for s in specs:
        d = {"id": s.id, "img": img_rel[s.id], "text": s.text, "split": s.split, "type": s.type,
             "difficulty": DIFFICULTY[s.type], "text_label": s.text_label, "image_label": s.image_label,
             "final_label": s.final_label, "final_label_clean": s.final_label_clean,
             "text_category": category(s, "text"), "image_category": category(s, "image"),
             "final_category": observed_final_category(s), "observed_type": observed_type(s),
             "text_family": s.text_family, "image_family": s.image_family, "group": s.group,
             "scene_id": s.scene_id, "confounder_of": s.confounder_of, "confounder_kind": s.confounder_kind,
             "gold_caption": scene_caption(s.objects), "objects": [asdict(o) for o in s.objects], **reasons(s)}
        master.append(d)
    write_jsonl(out / "memeworld.jsonl", master)

    # Facebook Hateful Memes: one jsonl per split, {id, img, label, text}
    for split in SPLIT_SHARES:
        write_jsonl(out / f"{split}.jsonl", [{"id": s.id, "img": img_rel[s.id], "label": s.final_label,
                                               "text": s.text} for s in specs if s.split == split])
    # TRACE JSON: one list with caption columns (gold caption; notebook 01 adds model captions)
    _write_json(out / "trace" / "fhm_gold_captions.json",
                [{"id": s.id, "img": img_rel[s.id], "text": s.text, "label": s.final_label,
                  "gold_caption": scene_caption(s.objects), "split": s.split} for s in specs])
    # H-VLI: dict keyed by sample id
    def hvli(ss):
        rows = {}
        for s in ss:
            fc = observed_final_category(s)
            rows[str(s.id)] = {"tweet_text": s.text, "image_path": img_rel[s.id],
                               "text_label": category(s, "text"), "text_label_str": HVLI_LABEL_STR[category(s, "text")],
                               "image_label": category(s, "image"),
                               "image_label_str": HVLI_LABEL_STR[category(s, "image")],
                               "final_label": fc, "final_label_str": HVLI_LABEL_STR[fc],
                               "type": observed_type(s), "difficulty": DIFFICULTY[observed_type(s)]}
        return rows
    _write_json(out / "hvli" / "train_set.json", hvli([s for s in specs if s.split in ("train", "dev_seen")]))
    _write_json(out / "hvli" / "test_set.json", hvli([s for s in specs if s.split in ("test_seen", "test_unseen")]))
    # HatReD (+ HatReDAug for benign memes): {id, img, target[], reasonings[]}
    for part, splits in (("train", ("train", "dev_seen", "dev_unseen")), ("test", ("test_seen", "test_unseen"))):
        write_jsonl(out / "hatred" / f"fhm_{part}_reasonings.jsonl",
                     [{"id": s.id, "img": f"{s.id:05d}.png",
                       "target": [CATEGORY_NAMES[category(s, 'final')]] if s.final_label_clean else [],
                       "reasonings": [explanation(s)]} for s in specs if s.split in splits])
    # MemeCap: {img_fname, img_captions[], title, meme_captions[], metaphors}
    for part, splits in (("memes-trainval", ("train", "dev_seen", "dev_unseen")),
                         ("memes-test", ("test_seen", "test_unseen"))):
        _write_json(out / "memecap" / f"{part}.json",
                    [{"img_fname": f"{s.id:05d}.png", "img_captions": [scene_caption(s.objects)], "title": s.text,
                      "meme_captions": [reasons(s)["final_reason"]],
                      "metaphors": ([{"metaphor": "sludge rat", "meaning": GROUPS[s.group][0]}]
                                    if s.type == "001" else [])} for s in specs if s.split in splits])
    # MemeSense: CSV of hateful memes with commonsense and intervention
    _write_csv(out / "memesense" / "memesense.csv",
               ["image_id", "image_link", "description_with_commonsense_parameters", "intervention"],
               [[f"{s.id:05d}", img_rel[s.id], commonsense(s), intervention(s)] for s in specs if s.final_label_clean])
    # MAMI-format stand-in (tab separated): the binary label plus sub-labels by text family
    mami_header = ["file_name", "misogynous", "shaming", "stereotype", "objectification", "violence",
                   "Text Transcription"]
    for fname, splits in (("training.csv", ("train", "dev_seen", "dev_unseen")),
                          ("test.csv", ("test_seen", "test_unseen"))):
        _write_csv(out / "mami" / fname, mami_header,
                   [[f"{s.id:05d}.png", s.final_label, int(s.final_label and s.text_family == "hate"),
                     int(s.final_label and s.text_family in ("pointer", "mention")), 0,
                     int(s.final_label and "out" in s.text or "rid" in s.text), s.text] for s in specs if s.split in splits],
                   delimiter="\t")
    # MultiOFF-style second dataset: its own images and style, three CSVs
    mo_split = {"train": "Training", "dev_seen": "Validation", "dev_unseen": "Validation", "test_seen": "Testing",
                "test_unseen": "Testing"}
    for part in ("Training", "Validation", "Testing"):
        _write_csv(out / "multioff" / "Split Dataset" / f"{part}_meme_dataset.csv", ["image_name", "sentence", "label"],
                   [[f"mo_{s.id:05d}.png", s.text, "offensive" if s.final_label else "Non-offensiv"]
                    for s in mo_specs if mo_split[s.split] == part])
    # misalignment benchmarks from the test memes: FOIL (one swapped word), then HAT, RichHF and
    # SeeTRUE-Feedback (position-exact labels, multi-word edits, aligned captions) from their own
    # generator, so the FOIL draws (and the training pairs after them) stay put; nocaps-FOIL from
    # scenes of its own, with objects no meme has (in- / near- / out-of-domain by how many)
    test_specs = [s for s in specs if s.split in ("test_seen", "test_unseen")]
    images, anns = [], []
    for s in test_specs:
        gold = scene_caption(s.objects)
        foil, target, foil_word = foil_caption(s, rng)
        images.append({"id": s.id, "file_name": f"{s.id:05d}.png"})
        anns.append({"id": 2 * s.id, "image_id": s.id, "caption": gold, "foil": False, "target_word": "ORIG",
                     "foil_word": "ORIG"})
        anns.append({"id": 2 * s.id + 1, "image_id": s.id, "caption": foil, "foil": True, "target_word": target,
                     "foil_word": foil_word})
    nrng = np.random.default_rng([seed, 4078])
    nocaps = []
    for s, dom in nc_specs:
        gold = scene_caption(s.objects)
        foil, target, foil_word = nocaps_foil(s, nrng)
        nocaps.append({"foil": foil, "baseline": gold, "replacement": [target, foil_word], "references": [gold],
                       "image_path": f"nc_{s.id:05d}.png", "domain": dom})
    mrng = np.random.default_rng([seed, 20261122])
    names = {s.id: f"{s.id:05d}.png" for s in specs}
    views = misalignment_views(test_specs, mrng, names)
    # a validation copy of HAT from the dev memes: epsilon is chosen there, never on test
    val = misalignment_views([s for s in specs if s.split in ("dev_seen", "dev_unseen")], mrng, names)
    _write_json(out / "foil" / "foil_test.json", {"images": images, "annotations": anns})
    _write_json(out / "nocaps_foil" / "nocaps_foil.json", nocaps)
    _write_json(out / "hat" / "hat.json", views["hat"])
    _write_json(out / "hat" / "hat_val.json", val["hat"])
    write_jsonl(out / "richhf" / "richhf.jsonl", views["richhf"])
    _write_json(out / "seetrue" / "seetrue_feedback.json", views["seetrue"])
    # prompt injection: every hateful test meme once with an instruction to the moderator drawn under
    # the picture and appended to its text (phrasings cycled), once with the neutral control sentence
    hateful = [MemeRecord(str(s.id), out / img_rel[s.id], s.text, 1, s.split) for s in test_specs if s.final_label]
    build_injection_set(hateful, out / "injection", control="neutral", overwrite=True)
    # scene-caption training pairs (train split only) with one FOIL hard negative each
    pairs = []
    for s in specs:
        if s.split in ("train", "dev_seen"):
            foil, target, foil_word = foil_caption(s, rng)
            pairs.append({"id": s.id, "img": img_rel[s.id], "caption": scene_caption(s.objects), "foil": foil,
                          "split": s.split})
    write_jsonl(out / "captions" / "scene_captions.jsonl", pairs)

    readers = unimodal_bayes_readers(specs)
    counts = {split: dict(sorted(Counter(s.type for s in specs if s.split == split).items())) for split in SPLIT_SHARES}
    sheet = {
        "generator": "MemeWorld", "seed": seed, "n": len(specs), "n_multioff": len(mo_specs),
        "n_nocaps": len(nc_specs), "nocaps_novel_objects": list(NOVEL_OBJECTS),
        "image_size": image_size, "label_noise": label_noise, "confounder_rate": confounder_rate,
        "counts_by_split_and_type": counts,
        "hateful_share": float(np.mean([s.final_label for s in specs])),
        "n_confounders": sum(s.confounder_of is not None for s in specs),
        "unseen_combos": sorted([list(c) for c in UNSEEN_COMBOS]),
        "bayes_readers": readers,
        "rule_reader_acc_test": float(np.mean([s.final_label_clean == s.final_label for s in test_specs])),
    }
    _write_json(out / "datasheet.json", sheet)     # no timings: same seed, byte-identical files
    return {**sheet, "render_seconds": round(t_render, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Write the MemeWorld benchmark in the real datasets' formats.")
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n", type=int, default=10000, help="memes in the FHM-style world (confounders included)")
    ap.add_argument("--n-multioff", type=int, default=800, help="memes in the MultiOFF-style second dataset")
    ap.add_argument("--image-size", type=int, default=128)
    ap.add_argument("--label-noise", type=float, default=0.02, help="probability of flipping a final label")
    ap.add_argument("--confounder-rate", type=float, default=0.15,
                    help="share of hateful seen-split memes that get benign confounders")
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args(argv)
    t0 = time.time()
    sheet = write_memeworld(args.out, n=args.n, seed=args.seed, image_size=args.image_size,
                            label_noise=args.label_noise, confounder_rate=args.confounder_rate,
                            n_multioff=args.n_multioff, workers=args.workers)
    print(json.dumps({k: sheet[k] for k in ("n", "n_multioff", "hateful_share", "n_confounders")}),
          f"written to {args.out} in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
