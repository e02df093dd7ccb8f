"""MemeWorld: determinism, SMI coverage, compositional splits, unimodal insufficiency, speed."""
import hashlib
import json
import re
from collections import Counter

import numpy as np
import pytest

from lib.data import memeworld as mw, memeworld_align as mwa, memeworld_files as mwf


def _tree_digest(root):
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():                                  # the datasheet included: it records no timings
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def test_same_seed_gives_byte_identical_files(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    mwf.write_memeworld(a, n=150, seed=11, n_multioff=20, workers=1, progress=False)
    mwf.write_memeworld(b, n=150, seed=11, n_multioff=20, workers=2, progress=False)
    mwf.write_memeworld(c, n=150, seed=12, n_multioff=20, workers=1, progress=False)
    assert _tree_digest(a) == _tree_digest(b)
    assert _tree_digest(a) != _tree_digest(c)
    assert "render_seconds" not in json.loads((a / "datasheet.json").read_text())


def test_all_interaction_types_and_difficulties(memeworld_small):
    out, sheet = memeworld_small
    rows = mw.load_specs(out)
    assert set(r["type"] for r in rows) == {"000", "001", "010", "011", "100", "101", "110", "111"}
    for r in rows:
        assert r["type"] == f"{r['text_label']}{r['image_label']}{r['final_label_clean']}"
        assert r["difficulty"] == mw.DIFFICULTY[r["type"]]
        assert (r["final_category"] > 0) == bool(r["final_label"])
        assert r["text_reason"] and r["image_reason"] and r["final_reason"]


def test_unseen_splits_hold_combinations_never_seen_in_training():
    specs = mw.sample_specs(4000, seed=5)
    seen = {(s.group, s.type) for s in specs if s.split in mw.SEEN_SPLITS}
    unseen = {(s.group, s.type) for s in specs if s.split not in mw.SEEN_SPLITS}
    assert not (seen & mw.UNSEEN_COMBOS)
    assert mw.UNSEEN_COMBOS <= unseen


def test_unimodal_readers_fail_on_emergent_types_rule_reader_does_not():
    specs = mw.sample_specs(6000, seed=1)
    c = mwf.unimodal_bayes_readers(specs)
    for t in ("001", "110"):
        assert c["text_only"][t] < 0.35, (t, c["text_only"][t])
        assert c["image_only"][t] < 0.35, (t, c["image_only"][t])
        assert c["rule_reader"][t] > 0.9
    # the easy types are easy for some single modality
    assert max(c["text_only"]["101"], c["image_only"]["101"]) > 0.5
    # the whole-split accuracy is the bound; it is the per-type accuracies weighted by type counts
    counts = {t: sum(s.type == t and s.split in ("test_seen", "test_unseen") for s in specs) for t in c["text_only"] if t != "overall"}
    weighted = sum(c["text_only"][t] * n for t, n in counts.items()) / sum(counts.values())
    assert c["text_only"]["overall"] == pytest.approx(weighted) and c["rule_reader"]["overall"] > 0.9


def test_label_noise_knob_sets_the_ceiling():
    clean = mw.sample_specs(3000, seed=2, label_noise=0.0)
    noisy = mw.sample_specs(3000, seed=2, label_noise=0.1)
    assert all(s.final_label == s.final_label_clean for s in clean)
    share = np.mean([s.final_label != s.final_label_clean for s in noisy])
    assert 0.07 < share < 0.13


def test_benign_confounders_share_image_or_text_with_a_hateful_meme():
    specs = mw.sample_specs(3000, seed=4)
    by_id = {s.id: s for s in specs}
    conf = [s for s in specs if s.confounder_of is not None]
    assert len(conf) > 50
    kinds = Counter(s.confounder_kind for s in conf)
    assert kinds["same_image"] > 0 and kinds["same_text"] > 0
    for s in conf:
        orig = by_id[s.confounder_of]
        assert orig.final_label_clean == 1 and s.final_label_clean == 0 and s.split == orig.split
        if s.confounder_kind == "same_image":
            assert s.objects == orig.objects and s.scene_id == orig.scene_id and s.text != orig.text
        else:
            assert s.text == orig.text


REAL_GROUP_WORDS = {"muslim", "jew", "christian", "black", "white people", "asian", "mexican", "gay", "lesbian",
                    "trans", "women", "woman", "immigrant", "refugee", "arab", "african", "hindu", "islam"}


def test_only_fictional_groups_and_symbols(memeworld_small):
    out, _ = memeworld_small
    texts = " ".join(r["text"] + " " + r["final_reason"] for r in mw.load_specs(out)).lower()
    texts += " ".join(v for vals in mw.TEXTS.values() for v in vals).lower()
    for w in REAL_GROUP_WORDS:
        assert not re.search(rf"\b{w}", texts), w
    for plural, adj, cat, sym in mw.GROUPS.values():
        assert 1 <= cat <= 5 and sym in mw.SYMBOLS


def test_foil_captions_swap_exactly_one_word():
    rng = np.random.default_rng(0)
    for s in mw.sample_specs(300, seed=9):
        gold = mw.scene_caption(s.objects)
        foil, target, foil_word = mwa.foil_caption(s, rng)
        g, f = gold.replace(",", "").split(), foil.replace(",", "").split()
        diff = [(a, b) for a, b in zip(g, f) if a != b]
        assert len(g) == len(f) and diff == [(target, foil_word)]


def test_rendering_in_parallel_gives_the_same_world(tmp_path):
    """Two render workers write the same files as one (the render time is a metric of notebook 00,
    never asserted: shared machines are noisy)."""
    import hashlib
    for w in (1, 2):
        mwf.write_memeworld(tmp_path / f"w{w}", n=300, seed=0, n_multioff=0, workers=w, progress=False)

    def digest(root):
        return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(root.rglob("*")) if p.is_file()}
    assert digest(tmp_path / "w1") == digest(tmp_path / "w2")


def test_cli_writes_a_world(tmp_path):
    assert mwf.main(["--out", str(tmp_path / "cli"), "--n", "60", "--n-multioff", "10", "--seed", "1",
                    "--workers", "1"]) == 0
    sheet = json.loads((tmp_path / "cli" / "datasheet.json").read_text())
    assert sheet["n"] == 60 and sheet["seed"] == 1


def test_misalignment_views_are_labelled_by_position_with_multiword_edits_and_aligned_captions():
    from lib.data.records import caption_words, labelled_positions
    specs = mw.sample_specs(400, seed=3)
    for s in specs[:100]:
        assert mwa.caption_text(mwa.flagged_caption(s.objects)) == mw.scene_caption(s.objects)
    v = mwa.misalignment_views(specs, np.random.default_rng(0), {s.id: f"{s.id}.png" for s in specs})
    edits = Counter(h["edit"] for h in v["hat"])
    assert edits[""] == len(specs) and {"colour", "kind", "colour+kind", "symbol", "relation"} <= set(edits)
    for h in v["hat"]:
        flags = [m for _, m in h["grounding"]]
        words = caption_words(h["caption"])
        pos = labelled_positions(h["caption"], [tuple(g) for g in h["grounding"]])
        assert len(pos) == sum(flags) == {"": 0, "colour": 1, "kind": 1, "symbol": 1, "colour+kind": 2,
                                          "relation": 2}[h["edit"]]
        if h["edit"] == "colour+kind":                                 # an attribute and its object, adjacent
            assert pos[1] == pos[0] + 1 and words[pos[1]] in mw.BENIGN_OBJECTS
        if h["edit"] == "relation":
            assert all(words[p] in mw.POSITIONS for p in pos)
        if h["edit"] and h["sample_id"].endswith("_mis"):
            gold = h["references"][0]
            assert h["caption"] != gold
            # a word equal to the edited one elsewhere in the caption is not flagged (position, not string)
            for p in pos:
                same = [k for k, w in enumerate(words) if w == words[p] and k != p]
                assert not set(same) & set(pos) or h["edit"] == "relation"
    scores = [r["misalignment_score"] for r in v["richhf"]]
    assert min(scores) == 0 and max(scores) >= 3 and len(set(scores)) >= 4      # graded, aligned prompts included
    for r in v["richhf"]:
        assert r["prompt_misalignment_label"].split().count("0") == r["misalignment_score"]
    assert all(len(r["caption_misalignment"].split()) >= 2 for r in v["seetrue"])   # feedback is a phrase


def test_nocaps_foil_draws_novel_objects_no_training_caption_names(memeworld_small):
    """nocaps-FOIL measures novel objects: its scenes have their own images, in-domain scenes only
    known objects, near-domain both, out-of-domain only novel ones, and no caption a model trains
    on (scene captions, gold captions, FOIL) ever names a novel object."""
    out, sheet = memeworld_small
    items = json.loads((out / "nocaps_foil" / "nocaps_foil.json").read_text())
    novel = set(mw.NOVEL_OBJECTS)
    assert sheet["n_nocaps"] == len(items) and {i["domain"] for i in items} == set(mw.NOCAPS_DOMAINS)
    foil_images = {im["file_name"] for im in json.loads((out / "foil" / "foil_test.json").read_text())["images"]}
    for it in items:
        assert (out / "nocaps_foil" / "img" / it["image_path"]).exists() and it["image_path"] not in foil_images
        words = set(it["baseline"].replace(",", "").split())
        n_novel, n_obj = len(words & novel), len(words & set(mw.COLOURED_OBJECTS))
        assert {"in-domain": n_novel == 0, "near-domain": 0 < n_novel < n_obj,
                "out-domain": n_novel == n_obj}[it["domain"]], it
        target, new = it["replacement"]
        # one object noun swapped, within its own vocabulary
        g, f = it["baseline"].replace(",", "").split(), it["foil"].replace(",", "").split()
        assert [(a, b) for a, b in zip(g, f) if a != b] == [(target, new)]
        assert (target in novel) == (new in novel)
    trained_on = (out / "captions" / "scene_captions.jsonl").read_text() + (out / "memeworld.jsonl").read_text() \
        + (out / "foil" / "foil_test.json").read_text()
    assert not any(re.search(rf"\b{w}\b", trained_on) for w in novel)
