"""Encoder backends: each wrapper's similarity equals the raw model's on a tiny randomly
initialised model of the same architecture; presets resolve; attention is reachable
where it should be and refused clearly where it is not."""
import numpy as np
import pytest
import torch
from PIL import Image

from lib.models.encoders import (AttentionUnavailable, HFBlipEncoder, HFClipEncoder, HFSiglipEncoder, OpenClipEncoder,
                          load_encoder)
from lib.compendium.presets import PresetError, get_preset, presets

TEXTS = ["a red sun on the left", "a blue house on the right and a green tree", "zorblin"]


def _images(n=2, size=48):
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)) for _ in range(n)]


@pytest.fixture(scope="module")
def clip_tok():
    from lib.models.embedded import build_clip_tokenizer
    return build_clip_tokenizer()


def _hf_clip(tok):
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel
    cfg = CLIPConfig(text_config=dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, bos_token_id=49406, eos_token_id=49407, pad_token_id=49407),
                     vision_config=dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=2), projection_dim=16)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = CLIPModel(cfg).eval()
    proc = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    enc = HFClipEncoder(model, tok, proc)
    inp = {**enc.tokenize(TEXTS), **enc.preprocess(_images())}
    raw = model(**inp).logits_per_image
    return enc, raw


def _hf_siglip(tok):
    from transformers import SiglipConfig, SiglipImageProcessor, SiglipModel
    cfg = SiglipConfig(text_config=dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=2, max_position_embeddings=16),
                       vision_config=dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=64,
                                          num_hidden_layers=2, num_attention_heads=2))
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = SiglipModel(cfg).eval()
    proc = SiglipImageProcessor(size={"height": 32, "width": 32})
    enc = HFSiglipEncoder(model, tok, proc)
    inp = {**enc.tokenize(TEXTS), **enc.preprocess(_images())}
    inp.pop("attention_mask")  # SigLIP was trained without a text attention mask; the wrapper passes what it gets
    raw = model(**inp).logits_per_image
    enc_tok = enc.tokenize(TEXTS)
    enc_tok.pop("attention_mask")
    return enc, raw, enc_tok


def _hf_siglip2(tok):
    from transformers import Siglip2Config, Siglip2ImageProcessor, Siglip2Model
    cfg = Siglip2Config(text_config=dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=2, max_position_embeddings=16),
                        vision_config=dict(patch_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                           num_attention_heads=2, num_patches=16))
    torch.manual_seed(0)
    model = Siglip2Model(cfg).eval()
    proc = Siglip2ImageProcessor(patch_size=8, max_num_patches=16)
    enc = HFSiglipEncoder(model, tok, proc)
    toks = enc.tokenize(TEXTS)
    toks.pop("attention_mask")
    inp = {**toks, **enc.preprocess(_images())}
    raw = model(**inp).logits_per_image
    return enc, raw, toks


def _hf_blip(tok):
    from transformers import BlipConfig, BlipForImageTextRetrieval, BlipImageProcessor
    cfg = BlipConfig(text_config=dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, encoder_hidden_size=32),
                     vision_config=dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=2), image_text_hidden_size=16)
    torch.manual_seed(0)
    model = BlipForImageTextRetrieval(cfg).eval()
    proc = BlipImageProcessor(size={"height": 32, "width": 32})
    enc = HFBlipEncoder(model, tok, proc)
    inp = {**enc.tokenize(TEXTS), **enc.preprocess(_images())}
    raw = model(**inp, use_itm_head=False).itm_score
    return enc, raw


def _open_clip_native():
    import open_clip
    torch.manual_seed(0)
    model = open_clip.CLIP(embed_dim=16, vision_cfg=dict(image_size=32, patch_size=8, width=32, layers=2, head_width=16),
                           text_cfg=dict(context_length=77, vocab_size=49408, width=32, heads=2, layers=2)).eval()
    _, _, preprocess = open_clip.create_model_and_transforms("ViT-B-32", pretrained=None)
    import torchvision.transforms as T
    preprocess = T.Compose([T.Resize(32), T.CenterCrop(32), T.ToTensor(),
                            T.Normalize(open_clip.OPENAI_DATASET_MEAN, open_clip.OPENAI_DATASET_STD)])
    enc = OpenClipEncoder(model, open_clip.get_tokenizer("ViT-B-32"), preprocess)
    px = enc.preprocess(_images())["pixel_values"]
    ids = enc.tokenize(TEXTS)["input_ids"]
    img, txt, scale = model(px, ids)[:3]
    return enc, scale * img @ txt.T


def _open_clip_hf_text(tmp_path):
    """roberta-ViT-B-32's architecture (open_clip CustomTextCLIP with a Hugging Face RoBERTa tower)."""
    import open_clip
    from transformers import RobertaConfig
    from open_clip.model import CustomTextCLIP
    rc = RobertaConfig(vocab_size=49408, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=2, max_position_embeddings=90, pad_token_id=0)
    rc.save_pretrained(tmp_path / "roberta-tiny")
    torch.manual_seed(0)
    model = CustomTextCLIP(embed_dim=16, vision_cfg=dict(image_size=32, patch_size=8, width=32, layers=2, head_width=16),
                           text_cfg=dict(hf_model_name=str(tmp_path / "roberta-tiny"), hf_model_pretrained=False,
                                         hf_pooler_type="mean_pooler", hf_proj_type="mlp")).eval()
    import torchvision.transforms as T
    preprocess = T.Compose([T.Resize(32), T.CenterCrop(32), T.ToTensor()])
    enc = OpenClipEncoder(model, open_clip.get_tokenizer("ViT-B-32"), preprocess)
    px = enc.preprocess(_images())["pixel_values"]
    ids = enc.tokenize(TEXTS)["input_ids"]
    img, txt, scale = model(px, ids)[:3]
    return enc, scale * img @ txt.T


BUILDERS = ["hf_clip", "hf_siglip", "hf_siglip2", "hf_blip", "open_clip", "open_clip_hf_text"]


def _build_with_raw(arch, clip_tok, tmp_path):
    """The wrapper, the raw model's logits and the texts (or tokens) they were computed on."""
    toks = TEXTS
    if arch == "hf_clip":
        enc, raw = _hf_clip(clip_tok)
    elif arch == "hf_siglip":
        enc, raw, toks = _hf_siglip(clip_tok)
    elif arch == "hf_siglip2":
        enc, raw, toks = _hf_siglip2(clip_tok)
    elif arch == "hf_blip":
        enc, raw = _hf_blip(clip_tok)
    elif arch == "open_clip":
        enc, raw = _open_clip_native()
    else:
        enc, raw = _open_clip_hf_text(tmp_path)
    return enc, raw, toks


@pytest.mark.parametrize("arch", BUILDERS)
def test_wrapper_similarity_equals_raw_model(arch, clip_tok, tmp_path):
    enc, raw, toks = _build_with_raw(arch, clip_tok, tmp_path)
    with torch.no_grad():
        ours = enc.similarity(_images(), toks)
    assert ours.shape == (2, 3)
    torch.testing.assert_close(ours, raw.detach(), rtol=1e-5, atol=1e-5)
    # pooled (pre-projection) features have the declared widths and project to the embeddings
    with torch.no_grad():
        f = enc.image_features(_images())
        t = enc.text_features(toks)
    assert f.shape[-1] == enc.image_dim and t.shape[-1] == enc.text_dim
    assert len(enc.text_layers()) == 2


def test_hf_clip_attention_maps_carry_gradients(clip_tok):
    enc, _ = _hf_clip(clip_tok)
    tokens = enc.tokenize(TEXTS)
    emb, atts, pool = enc.text_forward_with_attentions(tokens)
    assert len(atts) == 2 and atts[0].shape[:2] == (3, 2)
    # pooled position is the first end-of-text token
    assert all(tokens["input_ids"][i, pool[i]].item() == 49407 for i in range(3))
    grads = torch.autograd.grad(emb.sum(), atts)
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert grads[-1].abs().sum() > 0


def test_attention_refused_clearly_where_unreachable(clip_tok):
    enc, _ = _open_clip_native()
    with pytest.raises(AttentionUnavailable, match="not reachable"):
        enc.text_forward_with_attentions(enc.tokenize(TEXTS))
    enc2, _ = _hf_clip(clip_tok)
    enc2.model.config._attn_implementation = "sdpa"
    enc2.model.config.text_config._attn_implementation = "sdpa"
    with pytest.raises(AttentionUnavailable, match="eager"):
        enc2.text_forward_with_attentions(enc2.tokenize(TEXTS))


@pytest.mark.parametrize("name", sorted(presets("encoders")))
def test_every_encoder_preset_names_a_known_backend(name):
    from lib.models.encoders import BACKENDS
    p = get_preset("encoders", name)
    assert p.backend in BACKENDS
    if p.backend == "open_clip":
        import open_clip
        assert p.model in open_clip.list_models()
        assert (p.model, p.options["pretrained"]) in open_clip.list_pretrained()


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(PresetError, match="clip-vit-l14"):
        get_preset("encoders", "clip-vit-xxl")


def test_local_folder_loads_through_the_same_backend(clip_tok, tmp_path):
    enc, _ = _hf_clip(clip_tok)
    enc.model.save_pretrained(tmp_path / "m")
    clip_tok.save_pretrained(tmp_path / "m")
    enc.processor.save_pretrained(tmp_path / "m")
    loaded = load_encoder(tmp_path / "m", device="cpu")
    assert isinstance(loaded, HFClipEncoder)
    with torch.no_grad():
        torch.testing.assert_close(loaded.similarity(_images(), TEXTS), enc.similarity(_images(), TEXTS))
    _, atts, _ = loaded.text_forward_with_attentions(loaded.tokenize(TEXTS))
    assert len(atts) == 2


def _build(arch, clip_tok, tmp_path):
    """The wrapper and its tokens (a dict) for one architecture."""
    enc, _, toks = _build_with_raw(arch, clip_tok, tmp_path)
    if isinstance(toks, list):
        toks = dict(enc.tokenize(toks))
    return enc, toks


@pytest.mark.parametrize("arch", BUILDERS)
def test_frozen_prefix_cache_equals_the_full_text_tower(arch, clip_tok, tmp_path):
    """TRACE's cache: features resumed from the hidden states entering layer l equal the full
    tower's, and gradients reach the layers from l on exactly as in the full pass."""
    enc, toks = _build(arch, clip_tok, tmp_path)
    enc.model.double()                                # float64: equal up to rounding, not up to float32 noise
    last = enc.text_layers()[-1]
    for layer in range(len(enc.text_layers())):
        with torch.no_grad():
            hidden = enc.text_hidden_below(toks, layer)
        for p in enc.model.parameters():
            p.grad = None
        full = enc.text_features(toks)
        full.pow(2).sum().backward()
        g_full = [p.grad.clone() for p in last.parameters() if p.grad is not None]
        for p in enc.model.parameters():
            p.grad = None
        resumed = enc.text_features_from(hidden, toks, layer)
        torch.testing.assert_close(resumed, full.detach(), rtol=1e-10, atol=1e-10)
        resumed.pow(2).sum().backward()
        g_res = [p.grad.clone() for p in last.parameters() if p.grad is not None]
        assert len(g_full) == len(g_res) > 0
        for a, b in zip(g_full, g_res):
            torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-12)
        below = [p.grad for blk in list(enc.text_layers())[:layer] for p in blk.parameters()]
        assert all(g is None for g in below)          # the cached layers are not run at all
    assert len(enc.text_layers()) == 2                # the layers were put back


def test_hf_clip_pooled_only_last_layer_is_exact(clip_tok):
    enc, _ = _hf_clip(clip_tok)
    toks = enc.tokenize(TEXTS)
    with torch.no_grad():
        h = enc.text_hidden_below(toks, 1)
        a = enc.text_features_from(h, toks, 1, pooled_only=True)
        b = enc.text_features_from(h, toks, 1, pooled_only=False)
        c = enc.text_features(toks)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n_layers", [1, 2])
@pytest.mark.parametrize("frozen", [False, True])
def test_hf_clip_attributed_forward_equals_the_full_one(clip_tok, n_layers, frozen):
    """The attribution forward (no gradients below the attributed layers, the last layer at its
    pooled query only) gives the full forward's embeddings, the pooled rows of its attention maps
    and their gradients, on a padded batch and with the weights frozen or not."""
    enc, _ = _hf_clip(clip_tok)
    enc.model.requires_grad_(not frozen)
    tokens = enc.tokenize(TEXTS)
    ar = torch.arange(len(TEXTS))
    emb, atts, pool = enc.text_forward_with_attentions(tokens)
    fast_emb, fast, fast_pool = enc.text_forward_attributed(tokens, n_layers)
    assert torch.equal(pool, fast_pool) and len(fast) == n_layers
    assert fast[-1].shape[2] == 1                                    # the last layer: the pooled row only
    torch.testing.assert_close(fast_emb, emb, rtol=1e-5, atol=1e-6)
    w = torch.linspace(-1, 1, emb.shape[-1])
    full_maps = atts[-n_layers:]
    g_fast = torch.autograd.grad((fast_emb * w).sum(), fast)        # frozen weights: no graph to the
    g_full = None if frozen else torch.autograd.grad((emb * w).sum(), full_maps)   # full forward's maps
    for i, (a, b) in enumerate(zip(full_maps, fast)):
        row_b = b[:, :, 0] if b.shape[2] == 1 else b[ar, :, pool]
        torch.testing.assert_close(row_b, a[ar, :, pool], rtol=1e-5, atol=1e-6)
        if g_full is not None:
            gb = g_fast[i][:, :, 0] if b.shape[2] == 1 else g_fast[i][ar, :, pool]
            torch.testing.assert_close(gb, g_full[i][ar, :, pool], rtol=1e-4, atol=1e-6)   # float32 sums in another order
    assert all(torch.isfinite(g).all() for g in g_fast) and g_fast[-1].abs().sum() > 0
    with pytest.raises(ValueError, match="n_layers=3"):
        enc.text_forward_attributed(tokens, 3)


def test_hf_clip_offsets_read_from_the_rust_tokenizer_equal_the_wrapper(clip_tok):
    """CLIP4DM's tokenisation skips the Python wrapper; ids, mask and offsets stay the wrapper's,
    on padded batches, odd spacing and case, punctuation, non-ASCII text and texts past the
    77-token limit."""
    enc, _ = _hf_clip(clip_tok)
    batches = [TEXTS, ["A photo depicts a cup of coke."], ["  Two  spaces,and CAPS!  ", "café naïve – “quoted” ok", ""],
               ["word " * 120, "a red sun, " * 40 + "end", "short"]]
    for texts in batches:
        ref = enc.tokenize(texts, return_offsets_mapping=True)
        ref_off = ref.pop("offset_mapping")
        tok, off = enc.tokenize_with_offsets(texts)
        assert set(tok) == set(ref), texts
        for k in ref:
            assert torch.equal(tok[k], ref[k]), (k, texts)
        assert torch.equal(off, ref_off), texts
    assert tok["input_ids"].shape[1] == 77                            # truncated like the wrapper


def test_a_gpu_this_torch_cannot_use_is_an_error_not_a_silent_cpu_run(monkeypatch):
    import torch
    from lib.compendium import presets
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(presets, "gpu_present", lambda: True)
    with pytest.raises(presets.DeviceError, match="cannot use it.*device: cpu"):
        presets.default_device()
    monkeypatch.setattr(presets, "gpu_present", lambda: False)
    assert presets.default_device() == "cpu"                 # no GPU at all: the CPU, as before
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert presets.default_device() == "cuda"
