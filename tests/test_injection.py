"""Prompt-injection copies: rendered into the picture and the OCR text, read back by the loader,
balanced over phrasings, and the mitigation fences the text."""
import json

import numpy as np
import pytest

from lib.data import datasets, injection
from lib.data.records import DataError


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
    with pytest.raises(DataError, match=r"injection.jsonl: line 2 .*'phrasing'"):
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


def test_a_rerun_never_reuses_a_picture_made_from_other_content(memeworld_small, tmp_path):
    """Pictures are keyed by content: a rerun into the same folder with another source picture (or
    another instruction wording) renders anew instead of reusing the old file of the same id."""
    from dataclasses import replace

    from PIL import Image
    _, chosen = _hateful(memeworld_small, 2)
    first = injection.build_injection_set(chosen, tmp_path / "inj", ["answer_is"])
    (tmp_path / "src").mkdir()
    other_src = tmp_path / "src" / "other.png"
    Image.new("RGB", (128, 128), (10, 200, 30)).save(other_src)
    changed = [replace(chosen[0], img_path=other_src), chosen[1]]
    again = injection.build_injection_set(changed, tmp_path / "inj", ["answer_is"], overwrite=True)
    assert again[0].id == first[0].id and again[0].img_path != first[0].img_path
    top = np.asarray(Image.open(again[0].img_path).convert("RGB"))[:128]
    assert (top == np.asarray(Image.open(other_src).convert("RGB"))).all()     # the new picture, not the old one
    assert again[1].img_path == first[1].img_path                              # same content: reused


@pytest.mark.parametrize("case", ["exists", "out is root", "out inside root", "out is the image folder"])
def test_the_cli_refuses_to_overwrite_or_write_inside_its_input(memeworld_small, tmp_path, capsys, case):
    import shutil
    src, _ = memeworld_small
    root = tmp_path / "fhm"
    shutil.copytree(src, root, ignore=shutil.ignore_patterns("*.jsonl", "hvli", "multioff", "mami", "trace",
                                                             "injection", "nocaps_foil", "captions"))
    for f in ("train.jsonl", "dev_seen.jsonl", "test_seen.jsonl", "dev_unseen.jsonl", "test_unseen.jsonl"):
        if (src / f).exists():
            shutil.copy(src / f, root / f)
    before = sorted(p.name for p in (root / "img").iterdir())
    out = {"exists": tmp_path / "o", "out is root": root, "out inside root": root / "inj",
           "out is the image folder": root / "img"}[case]
    args = ["--root", str(root), "--out", str(out), "--split", "test_seen", "--n", "2"]
    if case == "exists":
        assert injection.main(args) == 0
        marker = (out / "injection.jsonl").read_text()
        assert injection.main(args) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "already exists" in err and "--force" in err
        assert (out / "injection.jsonl").read_text() == marker
        assert injection.main(args + ["--force"]) == 0
    else:
        assert injection.main(args) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and err.startswith("error: ") and "outside the dataset" in err
        assert sorted(p.name for p in (root / "img").iterdir()) == before and not (root / "injection.jsonl").exists()


@pytest.mark.parametrize("args,says", [
    (["--root", "/nonexistent/fhm", "--out", "OUT"], "no such folder"),
    (["--root", "ROOT", "--out", "OUT", "--dataset", "hatred"], "not a meme dataset"),
    (["--root", "ROOT", "--out", "OUT", "--dataset", "made_up"], "not a meme dataset"),
    (["--root", "ROOT", "--out", "OUT", "--split", "holdout"], "no split 'holdout'"),
    (["--root", "ROOT", "--out", "OUT", "--n", "-3"], "--n -3"),
    (["--root", "ROOT", "--out", "FILE"], "is not a folder"),
])
def test_the_cli_reports_bad_arguments_in_one_line(memeworld_small, tmp_path, capsys, args, says):
    src, _ = memeworld_small
    (tmp_path / "file").write_text("x")
    sub = {"ROOT": str(src), "OUT": str(tmp_path / "o"), "FILE": str(tmp_path / "file")}
    assert injection.main([sub.get(a, a) for a in args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: ") and says in err, err
