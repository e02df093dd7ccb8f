"""Profiles are checked against the notebooks' parameters cells, naming file, stage and key."""
import re
import shutil

import pytest
import yaml

from lib import ROOT
from lib.compendium import params
from lib.compendium.params import ProfileError, parameters_cell, stages, validate_profile


@pytest.mark.parametrize("profile", ["embedded", "paper"])
def test_shipped_profiles_are_valid(profile):
    data = validate_profile(profile)
    assert set(data) - {params.RUNNER_SECTION} == {s.name for s in stages()}


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
    with pytest.raises(ProfileError, match="known: ci, embedded, paper, paper-smoke"):
        validate_profile("nope")


@pytest.mark.results
def test_committed_notebooks_run_the_embedded_profile():
    """The saved notebooks are the embedded run's: their injected parameters are embedded.yaml's."""
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


# ----------------------------------------------------------------------------- nested sections (lib/compendium/param_schemas.py)
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
    # fields whose default is None are checked by their annotations (they accepted anything when types were
    # guessed from defaults)
    ("02_finetuning.method.fixed_weights", 3, r"method.fixed_weights': 3 is int, expected a mapping"),
    ("02_finetuning.method.selection_temperature", "hot", r"method.selection_temperature': 'hot' is str, expected int/float"),
    ("02_finetuning.method.head_final_dropout", "yes", r"method.head_final_dropout': 'yes' is str, expected bool"),
    ("02_finetuning.method.scorer_dropout", [0.5, 0.4], r"method.scorer_dropout': \[0.5, 0.4\] has 2 item\(s\), expected 3"),
    ("02_finetuning.method.unfreeze_text_layers", ["last"], r"method.unfreeze_text_layers\[0\]': 'last' is str, expected int"),
    ("05_debate.variants", {"v": {"official_prompts_repo": 7}}, r"variants.v.official_prompts_repo': 7 is int, expected str"),
    ("05_debate.variants", {"v": {"world_knowledge": ["a"]}}, r"variants.v.world_knowledge': \['a'\] is list, expected str"),
    ("05_debate.variants", {"v": {"string_max_length": "long"}}, r"variants.v.string_max_length': 'long' is str"),
    ("04_few_shot.agent_recipe", {"prompt_dir": 3}, r"agent_recipe.prompt_dir': 3 is int, expected str"),
]


@pytest.mark.parametrize("path, value, match", NESTED_CASES, ids=[c[0] + ":" + str(i) for i, c in enumerate(NESTED_CASES)])
def test_nested_sections_are_checked(profile_copy, path, value, match):
    profile_copy(_set(path, value))
    with pytest.raises(ProfileError, match=match) as e:
        validate_profile("embedded")
    assert "params/embedded.yaml" in str(e.value)


def test_every_dataclass_annotation_has_a_rule():
    """Schemas come from the dataclasses' annotations: an annotation no rule reads is an error, not AnyValue."""
    import dataclasses
    from lib.compendium.param_schemas import AnyValue, _dataclass_fields, rule_for
    from lib.arcade.court import CourtConfig
    from lib.sei.agents import AgentRecipe
    from lib.trace.interplay import InterplayConfig
    from lib.trace.model import TrainConfig
    for cls in (TrainConfig, CourtConfig, AgentRecipe, InterplayConfig):
        st = _dataclass_fields(cls)
        assert set(st.fields) == {f.name for f in dataclasses.fields(cls)}
        assert not any(isinstance(r, AnyValue) for r in st.fields.values()), cls
    with pytest.raises(TypeError, match="X.f: the annotation"):
        rule_for(set[int], "X.f")


@pytest.mark.parametrize("runner, match", [
    ({"executor": "jupyter"}, r"runner.executor': 'jupyter' is not one of 'papermill', 'nbval'"),
    ({"cell_timeout_s": "long"}, r"runner.cell_timeout_s': 'long' is str"),
    ({"stage_timeout_s": 0}, r"runner.stage_timeout_s': 0 is outside"),
    ({"timeout_multiple": 0.5}, r"runner.timeout_multiple': 0.5 is outside"),
    ({"cell_timeout": 5}, r"runner.cell_timeout': unknown key"),
])
def test_the_runner_section_is_checked(profile_copy, runner, match):
    profile_copy(lambda d: d.update(runner=runner))
    with pytest.raises(ProfileError, match=match):
        validate_profile("embedded")


def test_every_none_default_has_a_rule():
    from lib.compendium.param_schemas import SCHEMAS
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


# ----------------------------------------------------------------------------- inheritance (extends)
def _child(profile_copy, name: str, body: str, parent: str = "paper") -> None:
    """A child profile file params/<name>.yaml in the writable copy."""
    (params.PARAMS_DIR / f"{name}.yaml").write_text(f"extends: {parent}\n" + body)


#: (the child's YAML, a dotted key path, its effective value after merging): partial nested mappings keep
#: the parent's other keys at every depth; lists and values replace; null unsets; !replace replaces a mapping
MERGES = [
    ("04_few_shot:\n  agent_recipe: {batch_size: 4}\n", "04_few_shot.agent_recipe",
     {"epochs": 2, "lr": 2.0e-5, "weight_decay": 1.0e-6, "batch_size": 4, "max_train": 0, "mixed_precision": "bf16",
      "dtype": "bfloat16", "max_len": 1536, "gradient_checkpointing": True, "answer_logits_only": True, "loss_chunk": 128,
      "attn_implementation": "sdpa"}),
    ("04_few_shot:\n  agent_recipe: {max_len: 1024, dtype: float16}\n", "04_few_shot.agent_recipe.mixed_precision", "bf16"),
    ("00_data_prep:\n  datasets: {fhm: {root: elsewhere/fhm}}\n", "00_data_prep.datasets.mami.image_dir", "images"),
    ("00_data_prep:\n  datasets: {mami: {root: x}}\n", "00_data_prep.datasets.mami",
     {"root": "x", "image_dir": "images"}),
    ("05_debate:\n  variants: {arcade: {string_max_length: 48}}\n", "05_debate.variants.arcade",
     {"debate_visibility": "transcript", "parse": "structured", "string_max_length": 48}),
    ("05_debate:\n  variants: {direct: {parse: structured}}\n", "05_debate.variants.arcade_official.debater_failure",
     "pass_on"),
    ("06_evaluation:\n  injection: {n_llm: 4}\n", "06_evaluation.injection.phrasings",
     ["ignore_above", "reviewed", "answer_is", "system"]),
    ("04_few_shot:\n  shots: [2]\n", "04_few_shot.shots", [2]),                                  # a list replaces
    ("06_evaluation:\n  injection: {phrasings: [system]}\n", "06_evaluation.injection.phrasings", ["system"]),
    ("04_few_shot:\n  string_max_length: 64\n", "04_few_shot.string_max_length", 64),
    ("04_few_shot:\n  subset: null\n", "04_few_shot.subset", None),                          # null: unset
    ("05_debate:\n  variants: !replace {arcade: {parse: structured}}\n", "05_debate.variants",
     {"arcade": {"parse": "structured"}}),                                                   # !replace: whole
    ("02_finetuning:\n  recipes: {siglip2-so400m: {lr: 0.001}}\n", "02_finetuning.recipes.siglip2-so400m",
     {"sigmoid_contrastive": True, "lr": 0.001}),
]


@pytest.mark.parametrize("body, path, value", MERGES, ids=[m[1] for m in MERGES])
def test_a_child_profile_merges_nested_mappings_key_by_key(profile_copy, body, path, value):
    _child(profile_copy, "child", body)
    v = params.load_profile("child")
    for k in path.split("."):
        v = v[k]
    assert v == value


def test_three_levels_of_extends_and_the_parents_stay_as_they_were(profile_copy):
    before = params.load_profile("paper")
    _child(profile_copy, "mid", "04_few_shot:\n  agent_recipe: {batch_size: 4}\n")
    _child(profile_copy, "leaf", "04_few_shot:\n  agent_recipe: {epochs: 1}\n", parent="mid")
    r = params.load_profile("leaf")["04_few_shot"]["agent_recipe"]
    assert (r["batch_size"], r["epochs"], r["max_len"], r["dtype"]) == (4, 1, 1536, "bfloat16")
    assert params.load_profile("paper") == before
    validate_profile("leaf")


def test_check_params_prints_the_effective_values_of_what_a_child_changes(profile_copy, capsys):
    _child(profile_copy, "small-gpu", "04_few_shot:\n  agent_recipe: {batch_size: 4}\n")
    assert params.main(["--profile", "small-gpu"]) == 0
    out = capsys.readouterr().out
    assert "04_few_shot.agent_recipe:" in out and '"max_len": 1536' in out and '"batch_size": 4' in out
    assert "kept from paper: epochs, lr, weight_decay, max_train, mixed_precision, dtype, max_len" in out


def test_replace_tags_only_a_mapping(profile_copy):
    _child(profile_copy, "bad", "04_few_shot:\n  shots: !replace [2]\n")
    with pytest.raises(ProfileError, match="'!replace' at line 3 tags a mapping"):
        params.load_profile("bad")


def test_the_ci_profile_changes_sizes_only():
    """params/ci.yaml extends the embedded profile with sizes (counts, epochs, seeds, benchmark lengths) and
    the paths of its own trained models: no model, prompt, variant setting or control changes."""
    ci, emb = params.load_profile("ci"), params.load_profile("embedded")
    size_keys = re.compile(r"(_n|_n_multioff|epochs|_memes|_pairs|samples|n_llm|n_trace|seeds|runs|_repeats|"
                           r"concurrency|requests|max_new_tokens|prompts|trials|resamples|max_train|patience|"
                           r"per_type|index_profiles|nli_model|eval_n|rounds|max_length|n_train)$")

    def leaves(d, prefix=""):
        for k, v in d.items():
            if isinstance(v, dict):
                yield from leaves(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}", v
    # how the run executes and its time limits (the `runner` section) are no result's parameters
    a, b = dict(leaves(emb)), {k: v for k, v in leaves(ci) if not k.startswith(params.RUNNER_SECTION + ".")}
    # the one exception, named: an option the embedded profile leaves off (null) until its embedded run is
    # committed, which make test still runs at test size (notebook 05's adapted judge)
    def is_size(key):     # the key or a mapping above it names a size (05_debate.max_new_tokens.judge)
        return any(size_keys.search(part) for part in key.split("."))
    assert set(a) <= set(b)                                        # nothing dropped
    added = sorted(set(b) - set(a))                                # a size of one variant (its own token caps)
    assert all(is_size(k) for k in added), [k for k in added if not is_size(k)]
    changed = [k for k in a if a[k] != b[k]]
    assert changed and all(is_size(k) for k in changed), [k for k in changed if not is_size(k)]
    validate_profile("ci")
