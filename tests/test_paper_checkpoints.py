"""First contact with the paper profile's checkpoints, on tiny random models of the same classes
and processors (lib/models/smoke.py): every loader, processor, chat template, image-token count,
label map and layer index the paper profile relies on, exercised on a CPU."""
import numpy as np
import pytest
from PIL import Image

from lib.compendium import costs
from lib.models.smoke import BUILDERS, build_all


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    return build_all(tmp_path_factory.mktemp("paper_ckpts"))


def _img(w, h, seed=0):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8))


def test_every_builder_writes_a_checkpoint_that_says_what_it_stands_for(ckpts):
    import json
    assert set(ckpts) == set(BUILDERS)
    for name, path in ckpts.items():
        assert json.loads((path / "SMOKE.json").read_text())["weights"] == "random", name


@pytest.mark.parametrize("name,rule", [("internvl3.5-8b", "internvl"), ("pixtral-12b", "pixtral")])
def test_served_few_shot_models_answer_a_multi_image_conversation(ckpts, name, rule):
    """The hf chat backend drives InternVL3.5 and Pixtral through their processors and chat
    templates, with a system turn and several images, as notebook 04's few-shot prompt does; the
    image tokens the processor inserts are the ones lib.compendium.costs counts."""
    from lib.models.chat import GenParams, load_chat, system, user
    chat = load_chat(ckpts[name], cache=None, device="cpu")
    sizes = [(900, 600), (500, 500)]
    msgs = [system("You moderate memes."), user(_img(*sizes[0]), "Example: hateful.", _img(*sizes[1], 1), "Query?")]
    r = chat.generate(msgs, GenParams(max_new_tokens=4))
    assert r.status in ("ok", "length") and r.usage["completion_tokens"] >= 1
    proc = chat.backend.processor
    hf_msgs = chat.backend._hf_messages(msgs)
    enc = proc.apply_chat_template(hf_msgs, add_generation_prompt=True, tokenize=True, return_dict=True,
                                   return_tensors="pt")
    ids = enc["input_ids"][0].tolist()
    n_image = sum(ids.count(t) for t in set(proc.image_token_ids))
    assert n_image == sum(costs.image_tokens(rule, w, h) for w, h in sizes)


def test_paligemma_448_agents_keep_all_1024_image_tokens(ckpts):
    from lib.sei.agents import encode_example
    from lib.models.chat import GenParams, load_chat, user
    from transformers import AutoProcessor
    proc = AutoProcessor.from_pretrained(ckpts["paligemma-3b-pt-448"])
    enc = encode_example(proc, _img(640, 480), "explain why", "it calls them vermin", 1536)   # the paper profile's max_len
    assert enc["input_ids"].count(proc.tokenizer.convert_tokens_to_ids("<image>")) == 1024
    with pytest.raises(ValueError, match="image"):
        encode_example(proc, _img(640, 480), "explain why", "it calls them vermin", 256)     # the old default
    chat = load_chat(ckpts["paligemma-3b-pt-448"], cache=None, device="cpu")              # no chat template: a prefix
    assert chat.generate([user(_img(300, 300), "caption en")], GenParams(max_new_tokens=3)).status in ("ok", "length")


@pytest.mark.parametrize("name", ["clip-vit-b32", "clip-vit-l14", "clip-vit-h14", "siglip-so400m", "siglip2-so400m",
                                  "blip-base"])
def test_hf_encoders_load_embed_and_tokenize_as_their_hub_checkpoints(ckpts, name):
    from lib.models.encoders import load_encoder
    enc = load_encoder(ckpts[name], device="cpu")
    f = enc.image_features([_img(640, 480), _img(300, 700, 1)])
    t = enc.text_features(["a meme about zorblins", "two people holding a sign"])
    assert enc.project_image(f).shape[0] == 2 and enc.project_text(t).shape[0] == 2
    if name.startswith("siglip"):
        assert enc.tokenize(["hi"])["input_ids"].shape[1] == 64                         # fixed length, as trained


@pytest.mark.parametrize("name", ["clip-xlmr-h14", "clip-roberta-b32"])
def test_open_clip_hf_text_towers_load_from_a_local_dir_and_train_their_text_layers(ckpts, name):
    """open_clip models with a Hugging Face text tower load as `local-dir:` (what an offline copy of
    xlm-roberta-large-ViT-H-14 looks like), and TRACE's FHM recipe for XLM-R (text layers n-2 ... n-11)
    finds those layers."""
    from lib.models.encoders.registry import encoder_class
    from lib.compendium.presets import Preset
    from lib.trace.model import TrainConfig, unfrozen_layer_indices
    pr = Preset(name=name, backend="open_clip", model=f"local-dir:{ckpts[name]}", options={"pretrained": None})
    enc = encoder_class("open_clip", name).from_preset(pr, "cpu")
    assert enc.project_text(enc.text_features(["a meme"])).shape == enc.project_image(enc.image_features([_img(50, 80)])).shape
    layers = unfrozen_layer_indices(enc, TrainConfig(unfreeze_text_layers=[-2, -5, -8, -11]).unfreeze_text_layers)
    assert len(set(layers)) == 4


def test_clip4dm_attributes_words_on_a_twelve_layer_text_tower(ckpts):
    from lib.clip4dm.method import CLIP4DM
    from lib.models.encoders import load_encoder
    c4 = CLIP4DM(load_encoder(ckpts["clip-vit-b32"], device="cpu"), epsilon=-5e-5)
    out = c4(_img(400, 300), "a cup of coke on a table")
    assert [w for w, _ in out["word_attributions"]] == ["a", "cup", "of", "coke", "on", "a", "table"]


def test_bart_mnli_label_map_and_roberta_large_layer_17(ckpts):
    from lib.models.nli import nli_entailment
    from lib.evaluation.textmetrics import BertScoreSpec, bertscore_f1
    p = nli_entailment(["a dog runs", "a cat sleeps"], ["an animal moves", "nothing"], str(ckpts["bart-large-mnli"]))
    assert p.shape == (2,) and ((p > 0) & (p < 1)).all()
    f = bertscore_f1(["a meme about zorblins"], [["a meme about zorblins", "other"]],
                     BertScoreSpec(model=str(ckpts["roberta-large"]), layers=17, proxy=False))
    assert f.shape == (1,) and f[0] == pytest.approx(1.0, abs=1e-4)            # identical text: F1 1 at any layer


def test_grounding_dino_grounds_tags_through_the_profiles_grounder(ckpts):
    """The paper profile's grounder spec, pointed at the checkpoint: boxes come back per image, each
    naming one of the tags it was given (a random model may find none above a threshold)."""
    from lib.trace.captioning import load_grounder
    g = load_grounder({"kind": "grounding-dino", "model": str(ckpts["grounding-dino-base"]), "box_threshold": 0.0,
                       "text_threshold": 0.0}, device="cpu")
    tags = [["cat", "red sun"], []]
    out = g.ground([_img(400, 300), _img(200, 500, 1)], tags)
    assert len(out) == 2 and out[1] == []
    assert all(b["tag"] in tags[0] and len(b["box"]) == 4 for b in out[0])


def _trace_data(tmp_path, n=24):
    from lib.data.records import MemeRecord
    from lib.trace.features import MemeBatchData
    recs = []
    for i in range(n):
        p = tmp_path / f"m{i}.png"
        _img(120 + 7 * i, 90 + 5 * i, i).save(p)
        caps = {"ivl_8b_new_caption": f"a red sun number {i % 5}", "gemini_caption": f"two people {i % 3}"}
        recs.append(MemeRecord(str(i), p, f"meme text {i} about zorblins", i % 2,
                               ["train", "dev_seen", "test_seen"][i % 3], captions=caps))
    return MemeBatchData.from_records(recs, ["ivl_8b_new_caption", "gemini_caption"])


@pytest.mark.parametrize("backbone", ["clip-vit-l14", "clip-xlmr-h14", "siglip2-so400m"])
def test_trace_trains_each_paper_backbone_with_its_recipe(ckpts, tmp_path, backbone):
    """TRACE with the paper profile's own TrainConfig for each backbone (ViT-L/14: text layers n-2,
    n-5, n-8; XLM-R: n-2 ... n-11, batch 64 x 8; SigLIP2: sigmoid contrastive), the real TRACE
    caption columns and the feature cache, one epoch on the tiny checkpoint."""
    from lib.models.encoders import load_encoder
    from lib.models.encoders.registry import encoder_class
    from lib.compendium.params import load_profile
    from lib.compendium.presets import Preset
    from lib.trace.features import FeatureCache
    from lib.trace.runs import lowest_layer, run_config, train_variant
    section = load_profile("paper")["02_finetuning"]
    _, cfg = run_config(section, backbone, epochs=1, batch_size=8, grad_accum=1, amp=False)
    if backbone == "clip-xlmr-h14":
        enc = encoder_class("open_clip", backbone).from_preset(
            Preset(name=backbone, backend="open_clip", model=f"local-dir:{ckpts[backbone]}", options={"pretrained": None}),
            "cpu")
    else:
        enc = load_encoder(ckpts[backbone], device="cpu")
    data = _trace_data(tmp_path)
    cache = FeatureCache(enc, data, lowest_unfrozen=lowest_layer(enc, cfg.unfreeze_text_layers), progress=False)
    r = train_variant(enc, data, cfg, cache, progress=False)
    assert r["fit"] and len(r["curve"]) == 1
    assert {p["split"] for p in r["eval"]["predictions"]} == {"test_seen"}
