"""Profiles are checked against the notebooks' parameters cells, naming file, stage and key."""
import shutil

import pytest
import yaml

from lib import ROOT, params
from lib.params import ProfileError, parameters_cell, stages, validate_profile


@pytest.mark.parametrize("profile", ["embedded", "paper"])
def test_shipped_profiles_are_valid(profile):
    data = validate_profile(profile)
    assert set(data) == {s.name for s in stages()}


@pytest.fixture
def profile_copy(tmp_path, monkeypatch):
    """A writable copy of params/ so tests can break a profile."""
    d = tmp_path / "params"
    shutil.copytree(ROOT / "params", d)
    monkeypatch.setattr(params, "PARAMS_DIR", d)
    def edit(fn):
        p = d / "embedded.yaml"
        data = yaml.safe_load(p.read_text())
        fn(data)
        p.write_text(yaml.safe_dump(data))
    return edit


def test_unknown_key_names_file_notebook_and_key(profile_copy):
    profile_copy(lambda d: d["00_data_prep"].update(memeworld_nn=5))
    with pytest.raises(ProfileError) as e:
        validate_profile("embedded")
    msg = str(e.value)
    assert "params/embedded.yaml" in msg and "notebooks/00_data_prep.ipynb" in msg and "memeworld_nn" in msg


def test_missing_key_is_an_error(profile_copy):
    profile_copy(lambda d: d["00_data_prep"].pop("label_noise"))
    with pytest.raises(ProfileError, match=r"missing key '00_data_prep.label_noise'"):
        validate_profile("embedded")


def test_type_mismatch_is_an_error(profile_copy):
    profile_copy(lambda d: d["00_data_prep"].update(memeworld_n="many"))
    with pytest.raises(ProfileError, match=r"'00_data_prep.memeworld_n'.*is str.*declares int"):
        validate_profile("embedded")


def test_int_accepted_where_float_declared_but_not_bool_for_int(profile_copy):
    profile_copy(lambda d: d["00_data_prep"].update(label_noise=0))
    validate_profile("embedded")
    profile_copy(lambda d: d["00_data_prep"].update(memeworld_n=True))
    with pytest.raises(ProfileError, match="memeworld_n"):
        validate_profile("embedded")


def test_unknown_section_and_reserved_key(profile_copy):
    profile_copy(lambda d: d.update({"99_nothing": {"a": 1}}))
    with pytest.raises(ProfileError, match="section '99_nothing' matches no stage"):
        validate_profile("embedded")
    profile_copy(lambda d: (d.pop("99_nothing"), d["00_data_prep"].update(profile="x")))
    with pytest.raises(ProfileError, match="set by the runner"):
        validate_profile("embedded")


def test_unknown_profile_lists_known_ones():
    with pytest.raises(ProfileError, match="known: embedded, paper"):
        validate_profile("nope")


def test_committed_notebooks_run_the_embedded_profile():
    """nbval executes the committed notebooks: their injected parameters must be embedded.yaml's."""
    import nbformat
    emb = validate_profile("embedded")
    for st in stages():
        if st.notebook is None:
            continue
        nb = nbformat.read(str(st.notebook), as_version=4)
        inj = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
        defaults = parameters_cell(st.notebook)
        expected = {"profile": "embedded", **emb[st.name]}
        if inj:
            import ast
            got = {}
            for node in ast.parse(inj[0].source).body:
                got[node.targets[0].id] = ast.literal_eval(node.value)
            assert got == expected, f"{st.notebook.name}: re-run `make reproduce NB={st.name[:2]}`"
        else:
            assert {k: defaults[k] for k in expected} == expected, st.notebook.name


def test_select_stages_by_prefix_and_unknown():
    assert [s.name for s in params.select_stages("00")] == ["00_data_prep"]
    with pytest.raises(ProfileError, match="unknown stage"):
        params.select_stages("42")


# ----------------------------------------------------------------------------- nested sections (lib/param_schemas.py)
def _set(path, value):
    """An edit that sets data[a][b]... = value for a dotted path."""
    def edit(d):
        keys = path.split(".")
        for k in keys[:-1]:
            d = d[k]
        d[keys[-1]] = value
    return edit


NESTED_CASES = [
    ("02_finetuning.multioff", {"backbone": "memeworld-clip", "hiden": 256}, r"02_finetuning.multioff.hiden': unknown key"),
    ("02_finetuning.recipes", {"memeworld-clip": {"lr": 0.1, "epoch": 3}}, r"recipes.memeworld-clip.epoch': unknown key"),
    ("02_finetuning.recipes", {"no-such-clip": {"lr": 0.1}}, r"'no-such-clip' is not an encoder preset"),
    ("02_finetuning.loss_configs", ["cls+rel", "cls+everything"], r"loss_configs\[1\]': 'cls\+everything' is not one"),
    ("02_finetuning.backbones", ["clip-vit-l41"], r"backbones\[0\]': 'clip-vit-l41' is not an encoder preset"),
    ("00_data_prep.datasets", {"fhm": {"root": "x", "split": "train"}}, r"datasets.fhm.split': unknown key"),
    ("00_data_prep.datasets", {"fhmm": {"root": "x"}}, r"datasets.fhmm': unknown dataset"),
    ("00_data_prep.check_images", "decoded", r"check_images': 'decoded' is not one of"),
    ("00_data_prep.label_noise", 1.5, r"label_noise': 1.5 is outside \[0, 0.5\]"),
    ("03_clip4dm.benchmarks", ["foil", "fhm"], r"benchmarks\[1\]': 'fhm' is not an alignment dataset"),
    ("03_clip4dm.nli_model", 3, r"nli_model': 3 is int, expected str"),
    ("03_clip4dm.device", ["cuda"], r"device': \['cuda'\] is list, expected str"),
    ("01_captioning.grounder", {"kind": "boxes"}, r"grounder.kind': 'boxes' is not one of"),
    ("01_captioning.captioners", {"c": {"preset": "gpt-5-ultra"}}, r"captioners.c.preset': 'gpt-5-ultra' is not a chat"),
    ("04_few_shot.models", ["smollm3"], r"models\[0\]': 'smollm3' is not a chat preset"),
    ("04_few_shot.controls", {"z": {"n": 0, "shot": 1}}, r"controls.z.shot': unknown key"),
    ("04_few_shot.agent_recipe", {"epochs": 0}, r"agent_recipe.epochs': 0 is outside"),
    ("04_few_shot.serve_preset", 5, r"serve_preset': 5 is int, expected a chat preset"),
    ("05_debate.variants", {"v": {"gate": "no"}}, r"variants.v.gate': 'no' is str, expected bool"),
    ("05_debate.temperatures", {"judge_final": 0.1}, r"temperatures.judge_final: key 'judge_final'|temperatures': key"),
    ("05_debate.official_prompts_repo", 1, r"official_prompts_repo': 1 is int"),
    ("serving.schemas", ["nope"], r"schemas\[0\]': 'nope' is not a schema"),
]


@pytest.mark.parametrize("path, value, match", NESTED_CASES, ids=[c[0] + ":" + str(i) for i, c in enumerate(NESTED_CASES)])
def test_nested_sections_are_checked(profile_copy, path, value, match):
    profile_copy(_set(path, value))
    with pytest.raises(ProfileError, match=match) as e:
        validate_profile("embedded")
    assert "params/embedded.yaml" in str(e.value)


def test_every_none_default_has_a_rule():
    from lib.param_schemas import SCHEMAS
    for st in stages():
        for key, default in params.stage_defaults(st).items():
            if default is None:
                assert key in SCHEMAS.get(st.name, {}), f"{st.name}.{key}"


def test_duplicate_yaml_keys_and_profile_names(profile_copy, tmp_path):
    p = params.PARAMS_DIR / "embedded.yaml"
    text = p.read_text()
    p.write_text(text.replace("  memeworld_seed: 0", "  memeworld_seed: 0\n  memeworld_seed: 1", 1))
    with pytest.raises(ProfileError, match=r"params/embedded.yaml: duplicate key 'memeworld_seed' at line \d+"):
        validate_profile("embedded")
    p.write_text(text + "\nmodels:\n  train: false\n")
    with pytest.raises(ProfileError, match="duplicate key 'models'"):
        validate_profile("embedded")
    for bad in ("../embedded", "/etc/passwd", "a/b", ""):
        with pytest.raises(ProfileError, match="not a plain name"):
            validate_profile(bad)
