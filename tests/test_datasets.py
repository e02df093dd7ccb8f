"""Every registered loader reads MemeWorld's files in the real formats, and rejects bad input
with a message naming the file, the record and the field."""
import json
import re
import shutil
from pathlib import Path

import pytest

from lib.data.datasets import REGISTRY, load, load_source, memeworld_sources
from lib.data.records import DataError

NAMES = sorted(REGISTRY)


@pytest.fixture
def world(memeworld_small, tmp_path):
    """A private copy of the small MemeWorld, so a test may break files."""
    src, _ = memeworld_small
    dst = tmp_path / "mw"
    shutil.copytree(src, dst)
    return dst


@pytest.fixture
def world_text(memeworld_small, tmp_path):
    """A private copy of the small MemeWorld's files with its image folders linked, not copied:
    for tests that break text files only (a copy of every image costs most of a test's time)."""
    src, _ = memeworld_small
    dst = tmp_path / "mw"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("img", "Labelled Images"))
    (dst / "img").symlink_to(src / "img", target_is_directory=True)
    (dst / "multioff" / "Labelled Images").symlink_to(src / "multioff" / "Labelled Images", target_is_directory=True)
    return dst


@pytest.mark.parametrize("name", NAMES)
def test_loader_reads_memeworld(memeworld_small, name):
    out, _ = memeworld_small
    ds = load_source(name, memeworld_sources(out)[name], check_images="decode")
    assert len(ds) > 0 and ds.report == []
    rec = ds.records[0]
    assert rec.img_path.is_file()
    img = rec.image()  # decoded lazily, on use
    if name == "injection":     # the instruction is a band under the 128 x 128 meme
        assert img.size[0] == 128 and img.size[1] > 128 and img.mode == "RGB"
    else:
        assert img.size == (128, 128) and img.mode == "RGB"


def test_every_dataset_view_is_written(memeworld_small):
    out, _ = memeworld_small
    assert set(memeworld_sources(out)) == set(REGISTRY)


@pytest.mark.parametrize("name", NAMES)
def test_missing_image_strict_fails_lenient_reports(world, name):
    src = memeworld_sources(world)[name]
    ds = load_source(name, src)
    victim = ds.records[0].img_path
    victim.unlink()
    with pytest.raises(DataError) as e:
        load_source(name, src, strict=True)
    assert str(victim) in str(e.value) and "'img'" in str(e.value)
    lenient = load_source(name, src, strict=False)
    assert lenient.report and "skipped" in lenient.report[0]
    # nothing silently dropped: every record is either loaded or reported
    n_victim = sum(r.img_path == victim for r in ds.records)
    assert len(lenient) == len(ds) - n_victim and 1 <= len(lenient.report) <= n_victim


def test_undecodable_image_is_caught_when_decoding(world):
    src = memeworld_sources(world)["fhm"]
    rec = load_source("fhm", src).records[5]
    rec.img_path.write_bytes(b"not a png")
    load_source("fhm", src, check_images="exists")  # existence alone passes
    with pytest.raises(DataError, match="cannot be decoded"):
        load_source("fhm", src, check_images="decode")


JSON_FILES = {"foil": "foil/foil_test.json", "nocaps_foil": "nocaps_foil/nocaps_foil.json", "hat": "hat/hat.json",
              "seetrue": "seetrue/seetrue_feedback.json", "hvli": "hvli/train_set.json",
              "trace": "trace/fhm_gold_captions.json", "memecap": "memecap/memes-test.json"}
JSONL_FILES = {"fhm": "dev_seen.jsonl", "hatred": "hatred/fhm_test_reasonings.jsonl", "richhf": "richhf/richhf.jsonl"}


@pytest.mark.parametrize("name", sorted(JSON_FILES))
def test_malformed_json_names_file_and_position(world, name):
    p = world / JSON_FILES[name]
    p.write_text(p.read_text()[:-40])
    with pytest.raises(DataError, match=rf"{p.name}: malformed JSON at line \d+"):
        load_source(name, memeworld_sources(world)[name])


@pytest.mark.parametrize("name", sorted(JSONL_FILES))
def test_malformed_jsonl_names_line(world, name):
    p = world / JSONL_FILES[name]
    lines = p.read_text().splitlines()
    lines[2] = lines[2][:-5]
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=rf"{p.name}: line 3: malformed JSON"):
        load_source(name, memeworld_sources(world)[name])


def _edit_jsonl(p: Path, idx: int, fn):
    rows = [json.loads(l) for l in p.read_text().splitlines()]
    fn(rows, idx)
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_fhm_label_outside_set(world):
    _edit_jsonl(world / "train.jsonl", 4, lambda rows, i: rows[i].update(label=2))
    with pytest.raises(DataError, match=r"train.jsonl: line 5 \(id \d+\): field 'label' is 2, not one of \[0, 1\]"):
        load("fhm", world)


def test_fhm_missing_field(world):
    _edit_jsonl(world / "test_seen.jsonl", 0, lambda rows, i: rows[i].pop("text"))
    with pytest.raises(DataError, match=r"test_seen.jsonl: line 1 .*missing field 'text'"):
        load("fhm", world)


def test_fhm_duplicate_ids(world):
    _edit_jsonl(world / "train.jsonl", 1, lambda rows, i: rows[i].update(id=rows[0]["id"]))
    with pytest.raises(DataError, match="duplicate id"):
        load("fhm", world)


def test_unknown_split_is_an_error(world):
    with pytest.raises(DataError, match=r"no split 'dev'.*train, dev_seen"):
        load("fhm", world, splits=["dev"])
    with pytest.raises(DataError, match="no split 'validation'"):
        load("multioff", world / "multioff", splits=["validation"])


def test_trace_record_with_unknown_split(world):
    p = world / "trace" / "fhm_gold_captions.json"
    rows = json.loads(p.read_text())
    rows[3]["split"] = "holdout"
    p.write_text(json.dumps(rows))
    with pytest.raises(DataError, match=r"record 3 .*field 'split' is 'holdout'"):
        load_source("trace", memeworld_sources(world)["trace"])


def test_hvli_type_must_match_labels(world):
    p = world / "hvli" / "train_set.json"
    data = json.loads(p.read_text())
    sid = next(iter(data))
    data[sid]["type"] = "111" if data[sid]["type"] != "111" else "000"
    p.write_text(json.dumps(data))
    with pytest.raises(DataError, match=rf"sample '{sid}': field 'type'"):
        load_source("hvli", memeworld_sources(world)["hvli"])


def test_hvli_official_files_load_lowercase_difficulty_and_no_type(world):
    """The official release stores difficulty in lower case; its first release had neither type nor
    difficulty: both are derived from the labels, as the official evaluator does."""
    p = world / "hvli" / "train_set.json"
    data = json.loads(p.read_text())
    ids = list(data)
    for sid in ids[:5]:
        data[sid]["difficulty"] = data[sid]["difficulty"].lower()
    for sid in ids[5:10]:
        del data[sid]["type"], data[sid]["difficulty"]
    p.write_text(json.dumps(data))
    recs = {r.id: r for r in load_source("hvli", memeworld_sources(world)["hvli"]) if r.split == "train"}
    for sid in ids[:10]:
        m = recs[sid].meta
        expect = "".join("1" if m[k] > 0 else "0" for k in ("text_label", "image_label", "final_label"))
        assert m["type"] == expect and m["difficulty"] in ("Easy", "Normal", "Hard")
    data[ids[0]]["difficulty"] = "hard" if recs[ids[0]].meta["difficulty"] != "Hard" else "easy"
    p.write_text(json.dumps(data))
    with pytest.raises(DataError, match=rf"sample '{ids[0]}': field 'difficulty'"):
        load_source("hvli", memeworld_sources(world)["hvli"])


def test_hvli_first_release_null_labels_stay_visible(world_text):
    """The first release of test_set.json: no type / difficulty keys, and 4 posts with a null
    image_label. The official code reads them (its sampler groups them all as 'unknown'); the loader
    keeps them with type 'unknown', the evaluator shows them apart, and the official sampler sees
    the stored type, not the derived one."""
    from lib.arcade.court import SampleResult
    from lib.arcade.scoring import balanced_sample, evaluate, sampler_items
    p = world_text / "hvli" / "test_set.json"
    data = json.loads(p.read_text())
    ids = list(data)
    for sid in ids:
        data[sid].pop("type"), data[sid].pop("difficulty")
    for sid in ids[:4]:
        data[sid]["image_label"], data[sid]["image_label_str"] = None, None
    p.write_text(json.dumps(data))
    recs = [r for r in load_source("hvli", memeworld_sources(world_text)["hvli"]) if r.split == "test"]
    assert [r.id for r in recs] == ids                                     # nothing dropped, file order
    by_id = {r.id: r for r in recs}
    for sid in ids[:4]:
        m = by_id[sid].meta
        assert m["type"] == "unknown" and m["difficulty"] == "Unknown" and m["image_label"] is None
    assert all(r.meta["type"] != "unknown" for r in recs[4:])               # derived from the labels
    items = sampler_items(recs)
    assert {t for _, t in items} == {"unknown"}                              # the official sampler's groups
    assert balanced_sample(items, 10, 2024) == random_sample_like_official(ids, 10, 2024)
    results = [SampleResult(r.id, r.meta["final_label"], r.meta["type"], r.meta["difficulty"], "baseline",
                            label=r.meta["final_label"]) for r in recs]
    ev = evaluate(results, "multiclass", "official")
    assert ev["n"] == len(ids) and ev["n_unknown"] == 4 and ev["n_type_unknown"] == 4 and ev["acc_unknown"] == 1.0


def random_sample_like_official(ids, n, seed):
    """One group: shuffle it, take n // 1 = n, shuffle the selection (the official sampler's steps)."""
    import random
    rng = random.Random(seed)
    group = list(ids)
    rng.shuffle(group)
    sel = group[:n]
    rng.shuffle(sel)
    return sel


@pytest.mark.parametrize("field,value,match", [
    ("final_label", None, "field 'final_label' is None: the post has no ground truth"),
    ("image_label", "x", "field 'image_label' is 'x'"),
    ("text_label", 9, "field 'text_label' is 9"),
    ("type", "012", "field 'type' is '012'"),
])
def test_hvli_unusable_fields_name_file_record_and_field(world_text, field, value, match):
    p = world_text / "hvli" / "test_set.json"
    data = json.loads(p.read_text())
    sid = next(iter(data))
    data[sid][field] = value
    p.write_text(json.dumps(data))
    with pytest.raises(DataError, match=rf"test_set.json: sample '{sid}': {match}"):
        load_source("hvli", memeworld_sources(world_text)["hvli"])


def test_hvli_id_in_train_and_test_is_refused(world_text):
    train = json.loads((world_text / "hvli" / "train_set.json").read_text())
    p = world_text / "hvli" / "test_set.json"
    test = json.loads(p.read_text())
    sid = next(iter(train))
    test[sid] = train[sid]
    p.write_text(json.dumps(test))
    with pytest.raises(DataError, match=rf"sample '{sid}': the id is also in .*train_set.json"):
        load_source("hvli", memeworld_sources(world_text)["hvli"])


def test_multioff_bad_label(world):
    p = world / "multioff" / "Split Dataset" / "Testing_meme_dataset.csv"
    lines = p.read_text().splitlines()
    lines[1] = lines[1].rsplit(",", 1)[0] + ",maybe"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"Testing_meme_dataset.csv: line 2 .*field 'label' is 'maybe'"):
        load("multioff", world / "multioff")


def test_mami_subtask_label_outside_set(world):
    p = world / "mami" / "test.csv"
    lines = p.read_text().splitlines()
    cells = lines[1].split("\t")
    cells[2] = "7"
    lines[1] = "\t".join(cells)
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"test.csv: line 2 .*field 'shaming' is '7'"):
        load_source("mami", memeworld_sources(world)["mami"])


def test_richhf_label_count_mismatch(world):
    p = world / "richhf" / "richhf.jsonl"
    _edit_jsonl(p, 0, lambda rows, i: rows[i].update(prompt_misalignment_label="1 0"))
    with pytest.raises(DataError, match=r"line 1 .*has 2 labels for \d+ words"):
        load_source("richhf", memeworld_sources(world)["richhf"])


def test_missing_files_message_names_source(tmp_path):
    with pytest.raises(FileNotFoundError, match="Split Dataset.*get it from: MultiOFF"):
        load("multioff", tmp_path)


def test_nocaps_items_are_scored_twice_and_richhf_zero_means_misaligned(memeworld_small):
    out, _ = memeworld_small
    src = memeworld_sources(out)
    raw = json.loads((out / "nocaps_foil" / "nocaps_foil.json").read_text())
    nc = load_source("nocaps_foil", src["nocaps_foil"])
    assert len(nc) == 2 * len(raw) and sum(r.is_foil for r in nc) == len(raw)
    rh = load_source("richhf", src["richhf"]).records[0]
    raw0 = json.loads((out / "richhf" / "richhf.jsonl").read_text().splitlines()[0])
    zeros = [i for i, l in enumerate(raw0["prompt_misalignment_label"].split()) if l == "0"]
    assert [i for i, (_, m) in enumerate(rh.token_labels) if m] == zeros and rh.is_foil


def test_foil_references_are_the_other_original_captions(memeworld_small):
    out, _ = memeworld_small
    ds = load_source("foil", memeworld_sources(out)["foil"])
    foils = [r for r in ds if r.is_foil]
    origs = {r.img_path: r.caption for r in ds if not r.is_foil}
    assert foils and all(r.references == [origs[r.img_path]] for r in foils)
    assert all(r.misaligned_words[0] in r.caption.split() for r in foils)


def test_memesense_missing_intervention(world):
    import csv
    p = world / "memesense" / "memesense.csv"
    rows = list(csv.reader(p.open(newline="")))
    rows[1][3] = ""
    with p.open("w", newline="") as f:
        csv.writer(f).writerows(rows)
    with pytest.raises(DataError, match=r"memesense.csv: line 2 .*missing field 'intervention'"):
        load_source("memesense", memeworld_sources(world)["memesense"])


# ----------------------------------------------------------------------------- hostile input, every loader
# the file holding each loader's records and the field that names an image
IMAGE_FIELD = {"fhm": ("train.jsonl", "img"), "trace": ("trace/fhm_gold_captions.json", "img"),
               "mami": ("mami/training.csv", "file_name"),
               "multioff": ("multioff/Split Dataset/Training_meme_dataset.csv", "image_name"),
               "hvli": ("hvli/train_set.json", "image_path"), "hatred": ("hatred/fhm_train_reasonings.jsonl", "img"),
               "memecap": ("memecap/memes-trainval.json", "img_fname"),
               "memesense": ("memesense/memesense.csv", "image_link"), "foil": ("foil/foil_test.json", "file_name"),
               "nocaps_foil": ("nocaps_foil/nocaps_foil.json", "image_path"), "hat": ("hat/hat.json", "image_path"),
               "richhf": ("richhf/richhf.jsonl", "filename"), "seetrue": ("seetrue/seetrue_feedback.json", "image_path"),
               "injection": ("injection/injection.jsonl", "img")}
CSV_FILES = {"mami": "\t", "multioff": ",", "memesense": ","}
LONG_FIELD = {"mami": "Text Transcription", "multioff": "sentence", "memesense": "intervention"}


def test_every_loader_is_in_the_hostile_input_tables():
    assert set(IMAGE_FIELD) == set(NAMES)


def _set_first(world: Path, name: str, field: str, value):
    """Write `value` into the first record's `field` of the loader's main file, whatever its format."""
    import csv
    import io
    p = world / IMAGE_FIELD[name][0]
    if name in CSV_FILES:
        rows = list(csv.reader(io.StringIO(p.read_text(), newline=""), delimiter=CSV_FILES[name]))
        rows[1][rows[0].index(field)] = value
        buf = io.StringIO()
        csv.writer(buf, delimiter=CSV_FILES[name], lineterminator="\n").writerows(rows)
        p.write_text(buf.getvalue())
    elif p.suffix == ".jsonl":
        _edit_jsonl(p, 0, lambda rows, i: rows[i].update({field: value}))
    else:
        data = json.loads(p.read_text())
        if name == "foil":
            data["images"][0][field] = value
        elif isinstance(data, dict):
            data[next(iter(data))][field] = value
        else:
            data[0][field] = value
        p.write_text(json.dumps(data))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("path", ["../../../../etc/hostname", "/etc/hostname"])
def test_image_paths_cannot_leave_the_dataset(world_text, name, path):
    _set_first(world_text, name, IMAGE_FIELD[name][1], path)
    src = memeworld_sources(world_text)[name]
    if name == "hatred":        # HatReD keeps only the file name of 'img': it cannot leave the image folder
        ds = load_source(name, src, check_images="none")
        assert all(r.img_path.parent == world_text / "hatred" / ".." / "img" for r in ds.records)
        return
    with pytest.raises(DataError, match="points outside the image folder"):
        load_source(name, src, check_images="none")
    ds = load_source(name, {**src, "allow_outside_images": True}, check_images="none")
    assert any(str(r.img_path).endswith("etc/hostname") for r in ds.records)


@pytest.mark.parametrize("name", NAMES)
def test_non_utf8_bytes_name_the_file_and_offset_and_a_bom_is_accepted(world_text, name):
    p = world_text / IMAGE_FIELD[name][0]
    src = memeworld_sources(world_text)[name]
    n = len(load_source(name, src, check_images="none"))
    raw = p.read_bytes()
    p.write_bytes(b"\xef\xbb\xbf" + raw)
    assert len(load_source(name, src, check_images="none")) == n
    k = len(raw) // 2
    p.write_bytes(raw[:k] + b"\xff" + raw[k:])
    with pytest.raises(DataError, match=rf"{p.name}: not UTF-8: byte 0xff at offset {k}"):
        load_source(name, src, check_images="none")


@pytest.mark.parametrize("name", sorted(CSV_FILES))
def test_csv_is_read_strictly(world_text, name):
    p = world_text / IMAGE_FIELD[name][0]
    src = memeworld_sources(world_text)[name]
    d = CSV_FILES[name]
    good = p.read_text()
    n = len(load_source(name, src, check_images="none"))
    lines = good.splitlines()
    lines[2] = lines[2].replace(d, d + '"', 1)           # an unbalanced quote opening a field
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=rf"{p.name}: line"):
        load_source(name, src, check_images="none")
    import csv
    import io

    def rewrite(fn):
        rows = list(csv.reader(io.StringIO(good, newline=""), delimiter=d))
        fn(rows)
        buf = io.StringIO()
        csv.writer(buf, delimiter=d, lineterminator="\n").writerows(rows)
        p.write_text(buf.getvalue())
    rewrite(lambda rows: rows[3].pop())                   # a short row (line 4)
    with pytest.raises(DataError, match=rf"{p.name}: line 4: \d+ fields, the header has \d+"):
        load_source(name, src, check_images="none")
    rewrite(lambda rows: rows[3].append("extra"))         # an extra field
    with pytest.raises(DataError, match=rf"{p.name}: line 4: \d+ fields"):
        load_source(name, src, check_images="none")
    p.write_text(good)
    _set_first(world_text, name, LONG_FIELD[name], "x" * 300_000)   # over the csv module's default field limit
    ds = load_source(name, src, check_images="none")
    assert len(ds) == n and any(len(getattr(r, "text", "") or getattr(r, "intervention", "")) == 300_000
                                for r in ds.records)


@pytest.mark.parametrize("name", ["trace", "memecap", "nocaps_foil", "hat", "seetrue", "hvli", "foil"])
@pytest.mark.parametrize("shape", ["top", "record"])
def test_wrong_json_shapes_are_errors(world_text, name, shape):
    p = world_text / IMAGE_FIELD[name][0]
    data = json.loads(p.read_text())
    if shape == "top":
        data = "a string" if isinstance(data, dict) else {"records": data}
        match = "the top level is a JSON"
    elif name == "foil":
        data["annotations"][0] = 7
        match = "record 0 is a JSON int"
    elif isinstance(data, dict):
        data[next(iter(data))] = [1, 2]
        match = "a JSON list, expected an object"
    else:
        data[0] = 7
        match = "record 0 is a JSON int"
    p.write_text(json.dumps(data))
    with pytest.raises(DataError, match=match):
        load_source(name, memeworld_sources(world_text)[name], check_images="none")


@pytest.mark.parametrize("value, match", [(None, "missing field 'id'"), (True, "boolean"), ("", "empty string"),
                                          (1.5, "float")])
def test_ids_must_be_integers_or_strings(world_text, value, match):
    _edit_jsonl(world_text / "train.jsonl", 0, lambda rows, i: rows[i].update(id=value))
    with pytest.raises(DataError, match=rf"train.jsonl: line 1 .*{match}"):
        load("fhm", world_text)


def test_typed_fields_foil_flag_scores_and_list_items(world_text):
    p = world_text / "foil/foil_test.json"
    data = json.loads(p.read_text())
    data["annotations"][1]["foil"] = "false"
    p.write_text(json.dumps(data))
    with pytest.raises(DataError, match=r"annotations\[1\].*field 'foil' is 'false', expected true or false"):
        load_source("foil", memeworld_sources(world_text)["foil"])
    r = world_text / "richhf/richhf.jsonl"
    good = r.read_text()
    for bad, match in (("NaN", "field 'misalignment_score' is NaN, not a finite"),
                       ("Infinity", "field 'misalignment_score' is Infinity, not a finite"),
                       ("-Infinity", "field 'misalignment_score' is -Infinity"), ("1e999", "field 'misalignment_score' is 1e999"),
                       ("true", "field 'misalignment_score' is a boolean"), ('"0.5"', "field 'misalignment_score' is str")):
        lines = good.splitlines()
        obj = json.loads(lines[0])
        lines[0] = json.dumps(obj).replace(json.dumps(obj["misalignment_score"]), bad, 1) \
            if "misalignment_score" in obj else lines[0]
        lines[0] = lines[0].replace(f'"misalignment_score": {json.dumps(obj["misalignment_score"])}',
                                    f'"misalignment_score": {bad}')
        r.write_text("\n".join(lines) + "\n")
        with pytest.raises(DataError, match=match):
            load_source("richhf", memeworld_sources(world_text)["richhf"])
    r.write_text(good)
    _edit_jsonl(world_text / "hatred/fhm_train_reasonings.jsonl", 0, lambda rows, i: rows[i].update(target=[1]))
    with pytest.raises(DataError, match=r"field 'target\[0\]' is int, expected str"):
        load_source("hatred", memeworld_sources(world_text)["hatred"])


def test_duplicates_that_json_would_hide(world_text):
    p = world_text / "hvli/train_set.json"
    data = json.loads(p.read_text())
    items = list(data.items())
    p.write_text("{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in items + [items[0]]) + "}")
    with pytest.raises(DataError, match=rf"duplicate key {items[0][0]!r}"):
        load_source("hvli", memeworld_sources(world_text)["hvli"])
    f = world_text / "foil/foil_test.json"
    data = json.loads(f.read_text())
    data["images"].append(dict(data["images"][0], file_name=data["images"][1]["file_name"]))
    f.write_text(json.dumps(data))
    with pytest.raises(DataError, match="duplicate image id"):
        load_source("foil", memeworld_sources(world_text)["foil"])


def test_checks_that_check(world):
    src = memeworld_sources(world)["fhm"]
    rec = load_source("fhm", src).records[3]
    raw = rec.img_path.read_bytes()
    rec.img_path.write_bytes(raw[:len(raw) // 2])           # a truncated image: the header is intact
    load_source("fhm", src, check_images="exists")
    with pytest.raises(DataError, match="cannot be decoded"):
        load_source("fhm", src, check_images="decode")
    rec.img_path.write_bytes(raw)
    with pytest.raises(DataError, match="check_images is 'decoded'; valid: none, exists, decode"):
        load_source("fhm", src, check_images="decoded")
    with pytest.raises(DataError, match=r"unknown loader option\(s\) split; valid: splits, require_labels"):
        load_source("fhm", {**src, "split": "train"})
    only = load_source("fhm", {**src, "splits": ["dev_seen"]})
    assert len(only) > 0 and {r.split for r in only.records} == {"dev_seen"}
    with pytest.raises(DataError, match="splits must be a list"):
        load_source("fhm", {**src, "splits": "dev_seen"})
    (world / "dev_unseen.jsonl").write_text("")
    with pytest.raises(DataError, match="dev_unseen.jsonl: split 'dev_unseen' has no records"):
        load_source("fhm", src)
    lenient = load_source("fhm", src, strict=False)
    assert any("has no records" in m for m in lenient.report)


def test_memesense_analyses_may_span_lines_but_not_the_whole_file(world_text):
    """MemeSense's commonsense analyses are multi-line blocks: they load; a quote left open for
    more than MAX_FIELD_LINES lines is an error."""
    from lib.data.readers import MAX_FIELD_LINES
    src = memeworld_sources(world_text)["memesense"]
    _set_first(world_text, "memesense", "description_with_commonsense_parameters",
               "Meme Description: a boat\nCommonsense Analysis:\n- **Vermin**: calls a people rats")
    ds = load_source("memesense", src, check_images="none")
    assert "\n- **Vermin**" in ds.records[0].commonsense
    _set_first(world_text, "memesense", "intervention", "x\n" * (MAX_FIELD_LINES + 1))
    with pytest.raises(DataError, match="one field spans"):
        load_source("memesense", src, check_images="none")


SPLIT_LOADERS = [n for n in NAMES if "splits" in __import__("lib.data.datasets", fromlist=["loader_options"]).loader_options(n)]


@pytest.mark.parametrize("name", SPLIT_LOADERS)
@pytest.mark.parametrize("splits,match", [
    ("test", "must be a list of split names, e.g. \\['test'\\]; got the string 'test'"),
    ("train,test", "got the string 'train,test'"),
    ([], "non-empty list"),
    (["no_such_split"], "has no split 'no_such_split'"),
    ([3], "has no split 3"),
])
def test_splits_must_be_a_list_of_known_split_names(memeworld_small, name, splits, match):
    """Every loader that takes `splits` refuses a plain string (it would be read letter by letter or
    as one made-up name), an empty list and unknown names, listing the valid splits."""
    out, _ = memeworld_small
    src = dict(memeworld_sources(out)[name])
    with pytest.raises(DataError, match=rf"{match}.*[Ii]ts splits: "):
        load_source(name, {**src, "splits": splits})


@pytest.mark.parametrize("value", [3, 2.5, ["a caption"], {"text": "a caption"}, True, 0])
def test_a_caption_column_of_another_type_names_file_record_and_field(world_text, value):
    """A TRACE caption column (named by the loader's caption_columns) holding a number, list, object or
    boolean is no caption: an error naming the file, the record and the column, never a silent skip."""
    p = world_text / "trace" / "fhm_gold_captions.json"
    rows = json.loads(p.read_text())
    col = next(k for k in rows[0] if k not in ("id", "img", "text", "label", "split") and isinstance(rows[0][k], str))
    rows[5][col] = value
    p.write_text(json.dumps(rows))
    src = {**memeworld_sources(world_text)["trace"], "caption_columns": [col]}
    with pytest.raises(DataError, match=rf"fhm_gold_captions.json: record 5 .*field '{col}' \(a caption column\) is "):
        load_source("trace", src)


#: (dataset, its file inside the MemeWorld folder, an empty document of that file's format)
EMPTY_FILES = [("richhf", "richhf/richhf.jsonl", ""), ("richhf", "richhf/richhf.jsonl", "\n\n"),
               ("hat", "hat/hat.json", "[]"), ("seetrue", "seetrue/seetrue_feedback.json", "[]"),
               ("trace", "trace/fhm_gold_captions.json", "[]"), ("nocaps_foil", "nocaps_foil/nocaps_foil.json", "[]")]


@pytest.mark.parametrize("name, rel, empty", EMPTY_FILES, ids=[f"{n}:{e!r}" for n, _, e in EMPTY_FILES])
def test_an_empty_file_is_refused_naming_it(world_text, name, rel, empty):
    (world_text / rel).write_text(empty)
    with pytest.raises(DataError, match=rf"{re.escape(Path(rel).name)}: no records of dataset '{name}'"):
        load_source(name, memeworld_sources(world_text)[name])
