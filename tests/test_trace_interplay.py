"""TRACE's interplay captioner (lib.trace.interplay) and notebook 02's caption options (lib.trace.controls):
the captioner fine-tunes from memeworld-vlm on train memes only and is read back, not retrained; the chat
backend answers the prompt it was trained on; the isolated check scores what a caption states against the
generator's accounts; a caption option's claim joins the claims table with its own precondition."""
import json

import pandas as pd
import pytest
from PIL import Image

from lib.compendium.artifacts import read_jsonl
from lib.models.chat import GenParams, load_chat, user
from lib.trace import controls, interplay


@pytest.fixture(scope="module")
def tiny_captioner(memeworld_small, tmp_path_factory):
    from lib.models.embedded import ClipConfig, train_memeworld_clip
    from lib.models.memeworld_vlm import VlmConfig, train_memeworld_vlm
    out, _ = memeworld_small
    d = tmp_path_factory.mktemp("interplay")
    train_memeworld_clip(out, d / "clip", ClipConfig(width=32, layers=1, heads=2, projection_dim=16, epochs=1,
                                                     batch_size=64, eval_pairs=20), progress=False)
    train_memeworld_vlm(out, d / "clip", d / "vlm", VlmConfig(vocab_size=400, hidden=32, layers=1, heads=2,
                                                              intermediate=64, epochs=1, batch_size=32, eval_n=4,
                                                              max_new_tokens=8), progress=False)
    cfg = interplay.InterplayConfig(epochs=2, batch_size=16, max_train=64)
    rec = interplay.ensure_captioner(out, d / "vlm", d / "interplay", cfg, progress=False)
    return out, d, cfg, rec


def test_captioner_fine_tunes_on_train_memes_and_is_read_back(tiny_captioner):
    out, d, cfg, rec = tiny_captioner
    assert rec["reused"] is False and rec["n_train"] == 64 and len(rec["curve"]) == 2
    assert rec["curve"][1]["loss"] < rec["curve"][0]["loss"]
    train_ids = [r["id"] for r in read_jsonl(out / "memeworld.jsonl") if r["split"] == "train"][:64]
    assert [r["id"] for r in interplay.train_rows(out, 64)] == train_ids          # the train split only
    again = interplay.ensure_captioner(out, d / "vlm", d / "interplay", cfg, progress=False)
    assert again["reused"] is True and again["train_s"] == rec["train_s"]
    other = interplay.InterplayConfig(epochs=1, batch_size=16, max_train=64)   # another recipe: trained anew
    assert interplay.ensure_captioner(out, d / "vlm", d / "other", other, progress=False)["reused"] is False


def test_chat_backend_answers_the_interplay_prompt(tiny_captioner, tmp_path):
    out, d, _, _ = tiny_captioner
    row = next(r for r in read_jsonl(out / "memeworld.jsonl") if r["split"] != "train")
    chat = load_chat(d / "interplay", cache=tmp_path / "c.sqlite", device="cpu")
    img = Image.open(out / row["img"]).convert("RGB")
    prompt = interplay.interplay_prompt(row["text"])
    assert row["text"].split()[0] in prompt and "{text}" not in prompt
    r = chat.generate([user(img, prompt)], GenParams(max_new_tokens=8))
    assert r.status == "ok"
    again = chat.generate([user(img, prompt)], GenParams(max_new_tokens=8))       # the response cache answers
    assert again.text == r.text and chat.stats.cache_hits == 1


def test_missing_base_or_account_is_named(tmp_path, memeworld_small):
    with pytest.raises(interplay.InterplayError, match="no model folder"):
        interplay.ensure_captioner(memeworld_small[0], tmp_path / "nothing", tmp_path / "out")
    mw = tmp_path / "mw"
    mw.mkdir()
    (mw / "memeworld.jsonl").write_text(json.dumps({"id": 7, "split": "train", "img": "a.png", "text": "x"}) + "\n")
    with pytest.raises(interplay.InterplayError, match=r"record 0 \(id 7\) has no 'final_reason'"):
        interplay.train_rows(mw)


ACCOUNTS = {
    "1": {"split": "dev_seen", "type": "001", "final_reason": "pairing the zorblins with sludge rats calls them vermin"},
    "2": {"split": "dev_seen", "type": "001", "final_reason": "pairing the quellans with sludge rats calls them vermin"},
    "3": {"split": "dev_seen", "type": "000", "final_reason": "nothing in the meme attacks a group"},
    "4": {"split": "dev_seen", "type": "111", "final_reason": "text and picture attack the same group"},
    "5": {"split": "train", "type": "101", "final_reason": "the hateful text stands; the picture does not change it"},
}


def test_cue_check_scores_account_type_and_label():
    caps = {"1": "pairing the zorblins with sludge rats calls them vermin",      # its own account
            "2": "Pairing the zorblins with sludge rats calls them vermin.",     # right type, wrong group
            "3": "the hateful text stands; the picture does not change it",      # a hateful type: label wrong
            "4": "something else"}                                               # no account at all
    items = interplay.cue_check(caps, ACCOUNTS, "dev_seen")
    assert list(items["id"]) == ["1", "2", "3", "4"]                             # the train meme is not checked
    assert list(items["account_ok"]) == [True, False, False, False]
    assert list(items["type_ok"]) == [True, True, False, False]
    assert list(items["label_ok"]) == [True, True, False, False]
    assert list(items["caption_type"]) == ["001", "001", "101", ""]
    m = interplay.check_from_items(items)
    assert m["interplay_check_n"] == 4 and m["interplay_account_acc"] == 0.25 and m["interplay_type_acc"] == 0.5
    assert m["interplay_label_majority"] == 0.75 and m["interplay_account_majority"] == 0.25
    assert m["interplay_account_ci_low"] < 0.25 < m["interplay_account_ci_high"]
    assert m["interplay_account_acc_001"] == 0.5 and m["interplay_account_acc_000"] == 0.0
    with pytest.raises(interplay.InterplayError, match="no meme of split 'test'"):
        interplay.cue_check(caps, ACCOUNTS, "test")


def test_check_recomputes_from_its_csv(tmp_path):
    """What results/ keeps (interplay_check.csv) gives the same metrics: empty captions and 001 types survive."""
    items = interplay.cue_check({"1": "", "3": "nothing in the meme attacks a group"}, ACCOUNTS, "dev_seen")
    f = tmp_path / "interplay_check.csv"
    f.write_text(items.to_csv(index=False))
    back = pd.read_csv(f, dtype={"id": str, "type": str}, keep_default_na=False)
    assert interplay.check_from_items(back) == interplay.check_from_items(items)


def test_wilson_interval():
    lo, hi = interplay.wilson(76, 100)
    assert 0.66 < lo < 0.76 < hi < 0.84
    assert interplay.wilson(0, 10)[0] == pytest.approx(0.0, abs=1e-12)


def _run(right: set[int], n: int = 100):
    return {"eval": {"predictions": [{"id": str(i), "split": "test_seen", "label": 1,
                                      "prediction": int(i in right)} for i in range(n)]}}


def test_an_option_claim_joins_the_claims_table_with_its_own_precondition_and_component_check():
    runs = {"cls+rel": _run(set(range(60))), "image_text_only": _run(set(range(58))), "cls+con": _run(set(range(55))),
            "shuffled": _run(set(range(59))), "cue": _run(set(range(90))),
            controls.option_variant("cls+rel", "interplay"): _run(set(range(75)))}
    check = controls.component_checks({"interplay_label_acc": 0.998, "interplay_check_n": 515})
    claims, _ = controls.claim_frame(runs, options={"interplay": "not met: a probe gains nothing"}, components=check)
    row = claims[claims["id"] == "trace.interplay_captions"].iloc[0]          # plan v2: a secondary capacity check
    assert row["role"] == "secondary" and row["family"] == "capacity checks"
    assert row["A"] == "cls+rel (interplay captions)" and row["B"] == "image_text_only"
    assert row["A-B"] == pytest.approx(0.17) and row["control status"] == "detected"
    # the captioner states the label: a capacity check stands beside the row; its precondition is its own
    assert row["component check"].startswith("capacity check") and "0.998 of 515" in row["component check"]
    assert row["precondition"] == "not met: a probe gains nothing"
    first = claims[(claims["id"] == "trace.captions_help") & (claims["role"] == "primary")].iloc[0]
    assert first["precondition"] == "not measured" and first["component check"] == "none"
    # neither column moves a number of the row
    plain, _ = controls.claim_frame(runs)
    cols = ["A-B", "95% CI A-B", "p", "design MDD", "control A-B", "control p"]
    assert plain[cols].fillna(-9).equals(claims[cols].fillna(-9))


def test_option_runs_refuse_a_column_no_meme_holds(tmp_path):
    from dataclasses import dataclass

    @dataclass
    class Stage:
        src: object
        columns: list
        max_memes: int = 0
        seed: int = 0

    Image.new("RGB", (8, 8)).save(tmp_path / "x.png")
    rows = [{"id": i, "img": str(tmp_path / "x.png"), "text": f"t{i}", "label": i % 2, "split": "train",
             "vlm_caption": "c"} for i in range(4)]
    src = tmp_path / "trace_captions.json"
    src.write_text(json.dumps(rows))
    with pytest.raises(controls.ControlError, match="names column 'interplay_caption', which no meme holds"):
        controls.option_runs(Stage(src, ["vlm_caption", "tag_caption"]),
                             {"interplay": ["vlm_caption", "tag_caption", "interplay_caption"]}, ("b", {}, ""), [])
    with pytest.raises(controls.ControlError, match="distinct caption columns"):
        controls.option_runs(Stage(src, ["vlm_caption"]), {"x": ["vlm_caption", "vlm_caption"]}, ("b", {}, ""), [])
