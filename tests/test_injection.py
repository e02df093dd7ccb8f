"""Prompt-injection copies: rendered into the picture and the OCR text, read back by the loader,
balanced over phrasings, and the mitigation fences the text."""
import json

import numpy as np
import pytest

from lib import datasets, injection


def _hateful(memeworld_small, n=6):
    root, _ = memeworld_small
    recs = datasets.load("fhm", root, splits=["test_seen"]).records
    return recs, injection.pick_hateful(recs, n, seed=0)


def test_injected_copies_carry_the_instruction_in_pixels_and_text(memeworld_small, tmp_path):
    from PIL import Image
    recs, chosen = _hateful(memeworld_small)
    assert len(chosen) == 6 and all(r.label == 1 for r in chosen)
    out = injection.build_injection_set(chosen, tmp_path / "inj", list(injection.PHRASINGS)[:3])
    assert [r.meta["phrasing"] for r in out] == list(injection.PHRASINGS)[:3] * 2       # balanced, one per meme
    for src, r in zip(chosen, out):
        assert r.text.startswith(src.text) and injection.PHRASINGS[r.meta["phrasing"]] in r.text
        a, b = np.asarray(src.image()), np.asarray(Image.open(r.img_path).convert("RGB"))
        assert b.shape[1] == a.shape[1] and b.shape[0] > a.shape[0]           # a band under the picture
        assert (b[: a.shape[0]] == a).all()                                    # the meme itself untouched
        assert (b[a.shape[0]:] > 128).any()                                    # white text drawn in the band
    back = datasets.load("injection", tmp_path / "inj").records
    assert [(r.id, r.text, r.label, r.meta["source_id"]) for r in back] == \
        [(r.id, r.text, r.label, str(s.id)) for r, s in zip(out, chosen)]
    assert all(r.split == "injected" for r in back)


def test_text_only_injection_keeps_the_picture_and_the_loader_names_bad_fields(memeworld_small, tmp_path):
    _, chosen = _hateful(memeworld_small, 2)
    out = injection.build_injection_set(chosen, tmp_path / "t", ["answer_is"], where="text")
    assert [r.img_path for r in out] == [s.img_path for s in chosen]
    assert datasets.load("injection", tmp_path / "t", allow_outside_images=True).records[0].meta["where"] == "text"
    rows = [json.loads(x) for x in (tmp_path / "t" / "injection.jsonl").read_text().splitlines()]
    rows[1]["phrasing"] = "made_up"
    (tmp_path / "t" / "injection.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(datasets.DataError, match=r"injection.jsonl: line 2 .*'phrasing'"):
        datasets.load("injection", tmp_path / "t", allow_outside_images=True)


def test_pick_hateful_spreads_over_a_key_and_ignores_input_order(memeworld_small):
    recs, _ = _hateful(memeworld_small)
    types = {r["id"]: r["type"] for r in map(json.loads, (memeworld_small[0] / "memeworld.jsonl").read_text().splitlines())}
    key = lambda r: types[int(r.id)]
    a = injection.pick_hateful(recs, 8, seed=1, key=key)
    b = injection.pick_hateful(list(reversed(recs)), 8, seed=1, key=key)
    assert [r.id for r in a] == [r.id for r in b]
    counts = {}
    for r in a:
        counts[key(r)] = counts.get(key(r), 0) + 1
    assert max(counts.values()) - min(counts.values()) <= 1


def test_mitigation_fences_the_text_and_cli_writes_a_set(memeworld_small, tmp_path):
    _, chosen = _hateful(memeworld_small, 1)
    fenced = injection.mitigate(chosen, "delimit")[0]
    assert fenced.text.startswith("<<<MEME TEXT") and chosen[0].text in fenced.text and fenced.id == chosen[0].id
    assert injection.mitigate(chosen, "none")[0].text == chosen[0].text
    with pytest.raises(ValueError, match="unknown mitigation"):
        injection.mitigate(chosen, "pray")
    assert injection.main(["--root", str(memeworld_small[0]), "--split", "test_seen", "--out", str(tmp_path / "c"),
                           "--n", "3", "--per-meme", "all", "--phrasing", "reviewed", "--phrasing", "system"]) == 0
    assert len(datasets.load("injection", tmp_path / "c").records) == 6
