"""Stage 00's library side: cached MemeWorld builds and the paper profile's missing-data message."""
import pytest

from lib.compendium import artifacts
from lib.data import prep as data_prep

PARAMS = dict(build_memeworld=True, memeworld_n=80, memeworld_seed=1, memeworld_n_multioff=10, image_size=64,
              label_noise=0.0, confounder_rate=0.1, datasets={})


def test_memeworld_is_rebuilt_only_when_params_or_generator_change(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(artifacts, "ARTIFACTS_ROOT", tmp_path)
    sources = data_prep.prepare("embedded", PARAMS)
    sheet = tmp_path / "embedded" / "00_data_prep" / "memeworld" / "datasheet.json"
    mtime = sheet.stat().st_mtime_ns
    data_prep.prepare("embedded", PARAMS)
    assert "reusing" in capsys.readouterr().out and sheet.stat().st_mtime_ns == mtime
    data_prep.prepare("embedded", {**PARAMS, "memeworld_seed": 2})
    assert sheet.stat().st_mtime_ns != mtime
    # the stage declares its datasets with repo-relative or absolute roots, and a manifest
    assert set(sources) >= {"fhm", "hvli", "foil"}
    assert (tmp_path / "embedded" / "00_data_prep" / "manifest.json").exists()
    ds = data_prep.load_all({"fhm": sources["fhm"]})["fhm"]
    assert len(ds) == 80


def test_paper_profile_lists_every_missing_dataset_once(tmp_path, monkeypatch):
    monkeypatch.setattr(artifacts, "ARTIFACTS_ROOT", tmp_path)
    params = {**PARAMS, "build_memeworld": False,
              "datasets": {"fhm": {"root": str(tmp_path / "nope_fhm")},
                           "multioff": {"root": str(tmp_path / "nope_mo")}}}
    with pytest.raises(FileNotFoundError) as e:
        data_prep.prepare("paper", params)
    msg = str(e.value)
    assert "fhm: missing" in msg and "multioff: missing" in msg and "hatefulmemes" in msg and "MultiOFF" in msg


def test_the_profiles_other_local_files_fail_with_the_datasets_in_one_message(tmp_path, monkeypatch):
    """The tag list and the local roberta-large folder are checked before any stage runs (BERTScore
    used to fail only after agent training in notebook 04), in the same message as the datasets."""
    from lib.compendium import params as params_mod
    monkeypatch.setattr(artifacts, "ARTIFACTS_ROOT", tmp_path)
    prof = {"01_captioning": {"tag_vocabulary_file": "data/nope_ram_tag_list.txt"},
            "04_few_shot": {"bertscore": {"model": "data/models/nope-roberta-large"}},
            "05_debate": {"world_knowledge": None, "official_prompts_repo": None},
            "03_clip4dm": {"nli_model": "facebook/bart-large-mnli"}}          # a hub id: not a local file
    monkeypatch.setattr(params_mod, "load_profile", lambda name: prof)
    also = params_mod.missing_local_files("paper")
    assert len(also) == 2 and "ram_tag_list" in also[0] and "roberta-large" in also[1]
    params = {**PARAMS, "build_memeworld": False, "datasets": {"fhm": {"root": str(tmp_path / "nope_fhm")}}}
    with pytest.raises(FileNotFoundError) as e:
        data_prep.prepare("paper", params, also_missing=also)
    msg = str(e.value)
    assert "fhm: missing" in msg and "tag_vocabulary_file" in msg and "bertscore.model" in msg and "get it" in msg
    monkeypatch.undo()
    assert params_mod.missing_local_files("embedded") == []                 # the real embedded profile needs none
