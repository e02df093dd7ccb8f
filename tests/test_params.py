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
