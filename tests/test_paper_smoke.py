"""The paper-smoke profile's machinery: profile inheritance, the preset overlay, the loopback server,
project-relative paths and the smoke datasets under the real names."""
import base64
import io
import json
from pathlib import Path

import httpx
import jsonschema
import pytest
import yaml
from PIL import Image

from lib import ROOT
from lib.models.chat import loopback
from lib.compendium.params import ProfileError, load_profile, validate_profile
from lib.compendium.presets import OVERLAY_ENV, get_preset, overlay_path, read_overlay, resolve_model_path


def test_paper_smoke_is_the_paper_profile_with_sizes_and_locations_changed():
    paper, smoke = load_profile("paper"), load_profile("paper-smoke")
    assert set(paper) == set(smoke)
    validate_profile("paper-smoke")
    # the code paths the paper profile takes stay: same models, backbones, variants, parsers
    for section, key in [("04_few_shot", "models"), ("02_finetuning", "backbones"), ("02_finetuning", "recipes"),
                         ("05_debate", "variants"), ("05_debate", "chat_preset"), ("04_few_shot", "retrievers"),
                         ("01_captioning", "captioners"), ("03_clip4dm", "encoders"), ("04_few_shot", "parser")]:
        assert smoke[section][key] == paper[section][key], f"{section}.{key}"
    own = yaml.safe_load((ROOT / "params" / "paper-smoke.yaml").read_text())
    assert own.pop("extends") == "paper"
    changed = {k for s in own.values() for k in s}
    assert changed <= {"datasets", "tag_vocabulary_file", "grounder", "max_new_tokens", "epochs", "batch_size",
                       "grad_accum", "seeds", "timing_memes", "timing_repeats", "nli_model", "max_pairs", "speed_pairs",
                       "concurrency", "hf_concurrency", "n_requests", "hf_requests", "prefix_trials", "schema_prompts",
                       "schema_max_new_tokens", "eval_n", "agent_recipe", "agent_eval_n", "agent_max_new_tokens",
                       "bertscore", "ci_resamples", "claim_resamples", "samples", "workers", "n_resamples", "injection", "cell_timeout_s", "stage_timeout_s"}


def test_extends_merges_section_by_section_and_refuses_loops(tmp_path, monkeypatch):
    import lib.compendium.params as params
    monkeypatch.setattr(params, "PARAMS_DIR", tmp_path)
    (tmp_path / "base.yaml").write_text("a: {x: 1, y: 2}\nb: {z: 3}\n")
    (tmp_path / "child.yaml").write_text("extends: base\na: {y: 5}\n")
    assert params.load_profile("child") == {"a": {"x": 1, "y": 5}, "b": {"z": 3}}
    (tmp_path / "l1.yaml").write_text("extends: l2\n")
    (tmp_path / "l2.yaml").write_text("extends: l1\n")
    with pytest.raises(ProfileError, match="loops"):
        params.load_profile("l1")
    (tmp_path / "bad.yaml").write_text("extends: [base]\n")
    with pytest.raises(ProfileError, match="names one profile"):
        params.load_profile("bad")


def test_the_overlay_replaces_presets_by_name_only_while_it_is_set(monkeypatch):
    monkeypatch.delenv(OVERLAY_ENV, raising=False)
    assert get_preset("chat", "gpt-4o").options["base_url"].startswith("https://api.openai.com")
    path = overlay_path("paper-smoke")
    monkeypatch.setenv(OVERLAY_ENV, str(path))
    over = read_overlay(path)
    assert get_preset("chat", "gpt-4o").options["base_url"] == "{loopback}"
    assert get_preset("encoders", "clip-xlmr-h14").model.startswith("local-dir:{artifacts}/paper-smoke/")
    assert get_preset("chat", "smollm2-135m-instruct").backend      # presets it does not name are unchanged
    # every preset the paper profile names is overlaid: nothing reaches a hub or a paid API
    paper = load_profile("paper")
    named = {*paper["04_few_shot"]["models"], paper["04_few_shot"]["agent_base"], paper["05_debate"]["chat_preset"],
             *(c["preset"] for c in paper["01_captioning"]["captioners"].values())}
    enc = {*paper["02_finetuning"]["backbones"], *paper["03_clip4dm"]["encoders"], *paper["04_few_shot"]["retrievers"],
           paper["01_captioning"]["tagger_encoder"], paper["02_finetuning"]["multioff"]["backbone"]}
    assert named <= set(over["chat"]) and enc <= set(over["encoders"])
    monkeypatch.setenv(OVERLAY_ENV, str(ROOT / "no-such-overlay.yaml"))
    with pytest.raises(KeyError, match="no such preset overlay"):
        get_preset("chat", "gpt-4o")


def test_relative_paths_resolve_against_the_repository_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                                  # a notebook runs in notebooks/, not the root
    assert resolve_model_path("params/presets") == str(ROOT / "params" / "presets")
    assert resolve_model_path("facebook/bart-large-mnli") == "facebook/bart-large-mnli"     # a hub id stays
    from lib.trace.captioning import read_tag_list
    with pytest.raises(FileNotFoundError, match="tag_vocabulary_file"):
        read_tag_list("data/no_such_tags.txt")
    f = tmp_path / "tags.txt"
    f.write_text("cat\n\n dog \n")
    assert read_tag_list(f) == ["cat", "dog"]


@pytest.fixture(scope="module")
def server():
    srv = loopback.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


def _png(w=8, h=6) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (200, 10, 10)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.mark.parametrize("schema_file", sorted((ROOT / "params" / "schemas").glob("*.json")), ids=lambda p: p.stem)
def test_loopback_answers_every_schema_the_compendium_sends(server, schema_file):
    schema = json.loads(schema_file.read_text())
    body = {"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": _png()}},
                                                                   {"type": "text", "text": "label it"}]}],
            "max_tokens": 50, "response_format": {"type": "json_schema",
                                                  "json_schema": {"name": "r", "schema": schema, "strict": True}}}
    r = httpx.post(f"{server}/chat/completions", json=body, timeout=10)
    assert r.status_code == 200
    jsonschema.validate(json.loads(r.json()["choices"][0]["message"]["content"]), schema)
    assert r.json()["usage"]["prompt_tokens"] >= 256                  # the image is counted


def test_loopback_refuses_what_vllm_refuses(server):
    ok = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(f"{server}/chat/completions", json=ok, timeout=10).status_code == 200
    bad_image = {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(b"not a png").decode()}}]}]}
    bad_schema = {**ok, "response_format": {"type": "json_schema",
                                            "json_schema": {"name": "r", "schema": {"type": "object", "required": 3}}}}
    remote = {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]}
    for body, why in [(bad_image, "does not decode"), (bad_schema, "not a valid JSON Schema"), (remote, "data URI"),
                      ({"model": "m", "messages": []}, "non-empty")]:
        r = httpx.post(f"{server}/chat/completions", json=body, timeout=10)
        assert r.status_code == 400 and why in r.json()["error"]["message"]


def test_loopback_answers_depend_on_the_request_only():
    body = {"messages": [{"role": "user", "content": "meme 1"}]}
    assert loopback.answer(body) == loopback.answer(body)
    labels = {loopback.answer({"messages": [{"role": "user", "content": f"meme {i}"}]})[0].split(" - ")[0]
              for i in range(20)}
    assert labels == set(loopback.LABELS)


def test_smoke_data_sits_where_the_paper_profile_reads_it(tmp_path):
    """Every dataset of the paper-smoke profile loads with the paper profile's loaders, strictly, every
    image found where the real dataset keeps it (datasets' roots moved to a temporary copy)."""
    from lib.data.prep import load_all
    from lib.models.smoke import write_data
    out = write_data(tmp_path / "data", n=60)
    assert (out / ".complete").exists() and "sun" in (out / "ram_tag_list.txt").read_text().split("\n")
    prefix = "artifacts/paper-smoke/data/"
    sources = {k: {f: (str(out / v[len(prefix):]) if isinstance(v, str) and v.startswith(prefix) else v)
                   for f, v in spec.items()}
               for k, spec in load_profile("paper-smoke")["00_data_prep"]["datasets"].items()}
    loaded = load_all(sources, strict=True, check_images="exists")
    assert set(loaded) == set(sources) and all(len(d.records) for d in loaded.values())


def test_real_fhm_without_confounder_annotations_gives_an_empty_table_not_an_error():
    """Notebook 06 failed on the paper profile's data (no meme has a confounder annotation)."""
    import pandas as pd
    from lib.evaluation import crosseval as ce
    gold = pd.DataFrame({"id": ["1", "2", "3"], "split": ["test_seen"] * 3, "label": [0, 1, 1],
                         "confounder": [None, None, None]}).set_index("id")
    frame = pd.DataFrame({"id": ["1", "2", "3"], "label": [0, 1, 1], "prediction": [0, 1, 0]})
    methods = {"m": {"frame": frame, "system": "S"}}
    t = ce.confounder_rows(methods, gold, 10, 0, 0.95, "wilson")
    assert t.empty and list(t.columns) == ce.CONFOUNDER_COLUMNS
    gold.loc[["2", "3"], "confounder"] = "image"
    t = ce.confounder_rows(methods, gold, 10, 0, 0.95, "wilson")
    assert t[["subset", "value", "n"]].values.tolist() == [["image", 0.5, 2]]


def test_a_smoke_run_never_rewrites_the_readme_results(monkeypatch, tmp_path):
    """`make test` ends with the paper-smoke profile; its numbers must not replace the README's table
    (only a published profile's run publishes and regenerates the README's blocks)."""
    import contextlib
    import lib.compendium.stages as stages_mod
    from lib.compendium.params import stages
    calls, published = [], []
    monkeypatch.setattr(stages_mod, "ARTIFACTS_ROOT", tmp_path)
    monkeypatch.setattr(stages_mod, "default_cache_path", lambda profile: tmp_path / profile / "cache" / "responses.sqlite")
    monkeypatch.setattr(stages_mod, "profile_services", lambda profile: contextlib.nullcontext())
    monkeypatch.setattr(stages_mod, "run_notebook", lambda st, profile, params, **kw: None)
    monkeypatch.setattr(stages_mod, "update_readme", lambda path: calls.append(path))
    monkeypatch.setattr(stages_mod.results, "publish_stage", lambda profile, stage: published.append((profile, stage)))
    monkeypatch.setattr(stages_mod.results, "publish_run", lambda profile, partial=False, **kw: published.append((profile, "run")))
    monkeypatch.setattr(stages_mod, "keep_committed", lambda profile, stage: [])   # reads results/, writes artifacts/
    sections = {s.name: {} for s in stages()}
    st = [s for s in stages() if s.name == "07_figures"]
    assert stages_mod._run_stages(st, "paper-smoke", sections) == 0 and calls == [] and published == []
    assert (tmp_path / "paper-smoke" / "07_figures" / ".stamp.json").exists()
    assert stages_mod._run_stages(st, "embedded", sections, force=True, publish=True) == 0 and len(calls) == 1
    assert published == [("embedded", "07_figures"), ("embedded", "run")]


def test_loopback_presets_reach_the_running_server_and_name_it_not_its_port(server, monkeypatch):
    from lib.models.chat.loopback import LOOPBACK_ENV
    from lib.models.chat.registry import load_backend
    monkeypatch.setenv(OVERLAY_ENV, str(overlay_path("paper-smoke")))
    monkeypatch.delenv(LOOPBACK_ENV, raising=False)
    with pytest.raises(RuntimeError, match=LOOPBACK_ENV):
        load_backend(get_preset("chat", "gpt-4o"), None, None, None, None)
    monkeypatch.setenv(LOOPBACK_ENV, server)
    b = load_backend(get_preset("chat", "gpt-4o"), None, None, None, None)
    assert b.base_url == server and "base_url" not in b.identity()      # a rerun on another port hits the cache
    from lib.models.chat import GenParams, user
    assert b.complete([user("is it hateful?")], GenParams(max_new_tokens=8)).status == "ok"
