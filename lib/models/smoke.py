"""Tiny random checkpoints of the paper profile's architectures, with the real processors.

    python -m lib.models.smoke --out artifacts/paper-smoke/models     # every checkpoint (seconds)

Each builder saves, with `save_pretrained`, a randomly initialised model of the same class and
the same processor class as a hub checkpoint the paper profile names, at the real input
geometry wherever the processor decides the number of tokens (InternVL's 448-px tiles of 256
tokens, Pixtral's 16-px patches up to 1024 px, PaliGemma-448's 1024 image tokens, CLIP's
patch 32 / 14 at 224 px, SigLIP at 384 px with its sentencepiece or Gemma tokenizer, BART-MNLI's
three-label map, a 24-layer RoBERTa for BERTScore's layer 17). Widths and depths are tiny, so a
first GPU run's code paths (loading, processors, chat templates, image tokens, label maps,
layer indices) are exercised on a CPU in seconds. Outputs are noise: these checkpoints test
plumbing, never results.

Tokenizers are trained here (byte-level BPE, or a sentencepiece unigram model where the real
checkpoint ships one) on a few sentences; their special tokens are the real checkpoints'.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, Sequence

from lib.models.embedded import build_clip_tokenizer
from lib.data.memeworld import tag_vocabulary
from lib.data.memeworld_files import write_memeworld

CORPUS = ["a meme with a cat and a dog", "the text says hello to everyone", "hateful non-hateful racist sexist",
          "explain why this picture is offensive", "a red sun over a green field", "two people holding a sign",
          "the caption describes the image", "zorblins and quellites at the market"] * 8


def _bpe(special: Sequence[str], vocab_size: int = 500, prefix_space: bool = False):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers   # lazy: tokenizers is heavy
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=prefix_space)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(special),
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                       show_progress=False))
    return tk


def _unigram(special: Sequence[str], vocab_size: int = 300):
    """A sentencepiece-style unigram tokenizer (what XLM-R ships), trained by `tokenizers`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers   # lazy: tokenizers is heavy
    tk = Tokenizer(models.Unigram())
    tk.pre_tokenizer = pre_tokenizers.Metaspace()
    tk.decoder = decoders.Metaspace()
    tk.train_from_iterator(CORPUS, trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=list(special),
                                                           unk_token="<unk>", show_progress=False))
    return tk


def _seed() -> None:
    import torch
    torch.manual_seed(0)


# ----------------------------------------------------------------------------- chat models

#: ChatML with InternVL's image placeholder (one <IMG_CONTEXT> per image; the processor expands it)
INTERNVL_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for c in m['content'] %}{% if c['type'] == 'image' %}<IMG_CONTEXT>\n"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def internvl(out: Path) -> Path:
    """InternVL3.5-HF's classes: InternVLForConditionalGeneration (InternViT at 448 px, patch 14,
    pixel shuffle 0.5: 256 tokens per tile; a Qwen3 decoder) and InternVLProcessor (tiling by
    GotOcr2ImageProcessor, 1 to 12 tiles and a thumbnail)."""
    from transformers import (GotOcr2ImageProcessor, InternVLConfig, InternVLForConditionalGeneration,
                              InternVLProcessor, InternVLVideoProcessor, Qwen2TokenizerFast)
    images = {"start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
              "video_token": "<video>"}
    tok = Qwen2TokenizerFast(tokenizer_object=_bpe(["<|endoftext|>", "<|im_start|>", "<|im_end|>", *images.values()]),
                             eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token=None, bos_token=None,
                             extra_special_tokens=images)
    proc = InternVLProcessor(image_processor=GotOcr2ImageProcessor(crop_to_patches=True, min_patches=1, max_patches=12,
                                                                   size={"height": 448, "width": 448}),
                             tokenizer=tok, video_processor=InternVLVideoProcessor(), image_seq_length=256,
                             chat_template=INTERNVL_TEMPLATE)
    cfg = InternVLConfig(
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=[448, 448], patch_size=[14, 14]),
        text_config=dict(model_type="qwen3", vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=False),
        image_token_id=tok.context_image_token_id, downsample_ratio=0.5, vision_feature_layer=-1)
    _seed()
    return _save_generative(InternVLForConditionalGeneration(cfg), proc, tok, out)


#: Mistral's instruction format with Pixtral's image token (a system turn joins the next user turn)
PIXTRAL_TEMPLATE = (
    "<s>{% set ns = namespace(sys='') %}{% for m in messages %}"
    "{% if m['content'] is string %}{% set body = m['content'] %}{% else %}{% set body = '' %}{% endif %}"
    "{% if m['role'] == 'system' %}{% for c in m['content'] %}{% set ns.sys = ns.sys + c['text'] + '\n\n' %}"
    "{% endfor %}{% elif m['role'] == 'user' %}[INST]{{ ns.sys }}{% set ns.sys = '' %}{{ body }}"
    "{% if m['content'] is not string %}{% for c in m['content'] %}{% if c['type'] == 'image' %}[IMG]"
    "{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}[/INST]"
    "{% else %}{{ body }}{% if m['content'] is not string %}{% for c in m['content'] %}{{ c['text'] }}{% endfor %}"
    "{% endif %}</s>{% endif %}{% endfor %}")


def pixtral(out: Path) -> Path:
    """mistral-community/pixtral-12b's classes: LlavaForConditionalGeneration with a Pixtral vision
    tower (16-px patches, images up to 1024 px) and a Mistral decoder; PixtralProcessor ([IMG]
    per patch, [IMG_BREAK] per row, [IMG_END])."""
    from transformers import (LlavaConfig, LlavaForConditionalGeneration, PixtralImageProcessor, PixtralProcessor,
                              PreTrainedTokenizerFast)
    tok = PreTrainedTokenizerFast(tokenizer_object=_bpe(["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[IMG]",
                                                         "[IMG_BREAK]", "[IMG_END]", "<pad>"]),
                                  bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>")
    proc = PixtralProcessor(image_processor=PixtralImageProcessor(size={"longest_edge": 1024},
                                                                  patch_size={"height": 16, "width": 16}),
                            tokenizer=tok, patch_size=16, spatial_merge_size=1, chat_template=PIXTRAL_TEMPLATE)
    cfg = LlavaConfig(
        vision_config=dict(model_type="pixtral", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=2, head_dim=16, image_size=1024, patch_size=16),
        text_config=dict(model_type="mistral", vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id),
        image_token_index=tok.convert_tokens_to_ids("[IMG]"), projector_hidden_act="gelu", vision_feature_layer=-1,
        vision_feature_select_strategy="full",                   # no CLS token to drop, as in the real config
        multimodal_projector_bias=True)
    _seed()
    return _save_generative(LlavaForConditionalGeneration(cfg), proc, tok, out)


#: google/paligemma-3b-pt-448's shapes (its config.json): SigLIP-So400m/14 at 448 px, Gemma-2B with a
#: 257,216-token vocabulary; `paligemma(full_shape=True)` builds a random model of exactly these
PALIGEMMA_3B = {
    "vision": {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "num_attention_heads": 16},
    "text": {"vocab_size": 257_216, "hidden_size": 2048, "intermediate_size": 16_384, "num_hidden_layers": 18,
             "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256},
    "projection_dim": 2048,
}


def paligemma_config(dims: dict | None = None, image_token_index: int = 257_152, **special_ids):
    """A PaliGemmaConfig at 448 px, patch 14 (1024 image tokens) with `dims` (default PALIGEMMA_3B: the
    checkpoint's own sizes); `special_ids`: the tokenizer's pad / bos / eos ids for the Gemma decoder."""
    from transformers import PaliGemmaConfig
    dims = dims or PALIGEMMA_3B
    return PaliGemmaConfig(
        vision_config={"model_type": "siglip_vision_model", "image_size": 448, "patch_size": 14, **dims["vision"]},
        text_config={"model_type": "gemma", **special_ids, **dims["text"]},
        projection_dim=dims["projection_dim"], image_token_index=image_token_index)


def paligemma(out: Path, full_shape: bool = False, device: str = "cpu") -> Path:
    """google/paligemma-3b-pt-448's classes: PaliGemmaForConditionalGeneration (SigLIP at 448 px,
    patch 14: 1024 image tokens; a Gemma decoder) and PaliGemmaProcessor; no chat template (the
    pretrained checkpoint takes a prefix). Tiny by default; `full_shape`: the checkpoint's own sizes
    (PALIGEMMA_3B: 2.9B parameters, built in bf16 on `device`), for measuring memory and speed."""
    import torch
    from transformers import (GemmaTokenizerFast, PaliGemmaForConditionalGeneration, PaliGemmaProcessor,
                              SiglipImageProcessor)
    tok = GemmaTokenizerFast(tokenizer_object=_bpe(["<pad>", "<eos>", "<bos>", "<unk>"]), bos_token="<bos>",
                             eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")
    ip = SiglipImageProcessor(size={"height": 448, "width": 448})
    ip.image_seq_length = 1024
    proc = PaliGemmaProcessor(image_processor=ip, tokenizer=tok)
    tok = proc.tokenizer
    tiny = {"vision": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2},
            "text": {"vocab_size": len(tok), "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                     "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16},
            "projection_dim": 32}
    cfg = paligemma_config(PALIGEMMA_3B if full_shape else tiny, image_token_index=tok.convert_tokens_to_ids("<image>"),
                           pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    _seed()
    with torch.device(device):
        model = PaliGemmaForConditionalGeneration(cfg)
    return _save_generative(model.to(torch.bfloat16) if full_shape else model, proc, tok, out)


def _save_generative(model, proc, tok, out: Path) -> Path:
    import torch
    # a random decoder's greedy answer is often one whitespace token repeated, which strips to an
    # empty caption; zeroing the output rows of whitespace-only and special tokens (EOS kept) makes
    # it write words, so the stages downstream get text to carry
    head = model.get_output_embeddings()
    quiet = [i for i in range(len(tok)) if i != tok.eos_token_id
             and (not tok.decode([i]).strip() or i in tok.all_special_ids)]
    with torch.no_grad():
        head.weight[quiet] = 0.0
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    proc.save_pretrained(out)
    return out


# ----------------------------------------------------------------------------- encoders

#: the CLIP checkpoints' own shapes (vision hidden, layers, heads, MLP, patch; text hidden, layers, heads, MLP;
#: projection): openai/clip-vit-base-patch32 and laion/CLIP-ViT-H-14-laion2B-s32B-b79K
CLIP_SHAPES = {"B/32": dict(vision=(768, 12, 12, 3072, 32), text=(512, 12, 8, 2048), projection=512),
               "L/14": dict(vision=(1024, 24, 16, 4096, 14), text=(768, 12, 12, 3072), projection=768),
               "H/14": dict(vision=(1280, 32, 16, 5120, 14), text=(1024, 24, 16, 4096), projection=1024)}


def clip_full_shape(out: Path, shape: str = "B/32") -> Path:
    """A CLIPModel of a real checkpoint's shape (`CLIP_SHAPES`) with random weights, CLIP's BPE tokenizer and
    processor at 224 px: what a GPU measurement of CLIP4DM or TRACE needs (speed and memory, not accuracy)."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel
    if shape not in CLIP_SHAPES:
        raise ValueError(f"clip_full_shape: unknown shape {shape!r}; one of {sorted(CLIP_SHAPES)}")
    sh = CLIP_SHAPES[shape]
    (vh, vl, vn, vm, patch), (th, tl, tn, tm) = sh["vision"], sh["text"]
    tok = build_clip_tokenizer()
    cfg = CLIPConfig(text_config=dict(vocab_size=len(tok), hidden_size=th, intermediate_size=tm, num_hidden_layers=tl,
                                      num_attention_heads=tn, bos_token_id=49406, eos_token_id=49407, pad_token_id=49407),
                     vision_config=dict(image_size=224, patch_size=patch, hidden_size=vh, intermediate_size=vm,
                                        num_hidden_layers=vl, num_attention_heads=vn), projection_dim=sh["projection"])
    _seed()
    out.mkdir(parents=True, exist_ok=True)
    CLIPModel(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    CLIPImageProcessor(size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224}).save_pretrained(out)
    return out


def clip(out: Path, patch: int = 32, image_size: int = 224, text_layers: int = 12) -> Path:
    """openai/clip-vit-* and laion/CLIP-ViT-H-14's classes: CLIPModel (12 text layers, as every
    one of them has: TRACE unfreezes layers n-2, n-5, n-8) with CLIP's own BPE tokenizer (built
    offline from open_clip's vocabulary) and CLIPImageProcessor at 224 px."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel
    tok = build_clip_tokenizer()
    cfg = CLIPConfig(text_config=dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=text_layers,
                                      num_attention_heads=2, bos_token_id=49406, eos_token_id=49407, pad_token_id=49407),
                     vision_config=dict(image_size=image_size, patch_size=patch, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=2), projection_dim=16)
    _seed()
    out.mkdir(parents=True, exist_ok=True)
    CLIPModel(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    CLIPImageProcessor(size={"shortest_edge": image_size},
                       crop_size={"height": image_size, "width": image_size}).save_pretrained(out)
    return out


def _sentencepiece(out: Path, vocab_size: int = 300) -> Path:
    import sentencepiece as spm                              # lazy: only SigLIP's tokenizer needs it
    corpus = out / "corpus.txt"
    corpus.write_text("\n".join(CORPUS), encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(out / "spiece"), vocab_size=vocab_size,
                                   model_type="unigram", pad_id=1, eos_id=2, unk_id=3, bos_id=-1,
                                   pad_piece="<pad>", eos_piece="</s>", unk_piece="<unk>", hard_vocab_limit=False,
                                   minloglevel=2)
    corpus.unlink()
    return out / "spiece.model"


def siglip(out: Path, tokenizer: str = "sentencepiece", image_size: int = 384, patch: int = 14) -> Path:
    """google/siglip-so400m-patch14-384 (tokenizer="sentencepiece": SiglipTokenizer, which needs the
    sentencepiece package) and google/siglip2-so400m-patch14-384 (tokenizer="gemma": a Gemma
    tokenizer): SiglipModel, texts padded to 64, SiglipImageProcessor at 384 px."""
    from transformers import GemmaTokenizerFast, SiglipConfig, SiglipImageProcessor, SiglipModel, SiglipProcessor
    out.mkdir(parents=True, exist_ok=True)
    if tokenizer == "sentencepiece":
        from transformers import SiglipTokenizer
        tok = SiglipTokenizer(vocab_file=str(_sentencepiece(out)), model_max_length=64)
    elif tokenizer == "gemma":
        tok = GemmaTokenizerFast(tokenizer_object=_bpe(["<pad>", "<eos>", "<bos>", "<unk>"]), bos_token="<bos>",
                                 eos_token="<eos>", pad_token="<pad>", unk_token="<unk>", model_max_length=64)
    else:
        raise ValueError(f"siglip: tokenizer must be 'sentencepiece' or 'gemma', not {tokenizer!r}")
    cfg = SiglipConfig(text_config=dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=27,
                                        num_attention_heads=2, max_position_embeddings=64,
                                        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id),
                       vision_config=dict(image_size=image_size, patch_size=patch, hidden_size=32, intermediate_size=64,
                                          num_hidden_layers=1, num_attention_heads=2))
    _seed()
    SiglipModel(cfg).save_pretrained(out)
    SiglipProcessor(image_processor=SiglipImageProcessor(size={"height": image_size, "width": image_size}),
                    tokenizer=tok).save_pretrained(out)
    return out


def _wordpiece_vocab(out: Path) -> Path:
    words = sorted({w for s in CORPUS for w in s.split()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, *[f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"],
             *"abcdefghijklmnopqrstuvwxyz0123456789.,!?'-"]
    path = out / "vocab.txt"
    path.write_text("\n".join(dict.fromkeys(vocab)) + "\n", encoding="utf-8")
    return path


def blip(out: Path) -> Path:
    """Salesforce/blip-itm-base-coco's classes: BlipForImageTextRetrieval, BlipProcessor (a BERT
    WordPiece tokenizer, 384-px images)."""
    from transformers import (BertTokenizerFast, BlipConfig, BlipForImageTextRetrieval, BlipImageProcessor,
                              BlipProcessor)
    out.mkdir(parents=True, exist_ok=True)
    tok = BertTokenizerFast(vocab_file=str(_wordpiece_vocab(out)))
    cfg = BlipConfig(text_config=dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, encoder_hidden_size=32),
                     vision_config=dict(image_size=384, patch_size=16, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=1, num_attention_heads=2), projection_dim=16,
                     image_text_hidden_size=16)
    _seed()
    BlipForImageTextRetrieval(cfg).save_pretrained(out)
    BlipProcessor(image_processor=BlipImageProcessor(size={"height": 384, "width": 384}), tokenizer=tok).save_pretrained(out)
    return out


def grounding_dino(out: Path) -> Path:
    """IDEA-Research/grounding-dino-base's classes: GroundingDinoForObjectDetection (a Swin backbone,
    a BERT text tower) and GroundingDinoProcessor (a BERT tokenizer). The real processor resizes to an
    800-px shortest edge; the stand-in to 224 (longest 400), the size its backbone is configured for: the
    same resize and post-processing code, at a quarter of the 800-px input's time per meme on CPU."""
    from transformers import (BertTokenizerFast, GroundingDinoConfig, GroundingDinoForObjectDetection,
                              GroundingDinoImageProcessor, GroundingDinoProcessor)
    out.mkdir(parents=True, exist_ok=True)
    tok = BertTokenizerFast(vocab_file=str(_wordpiece_vocab(out)))
    cfg = GroundingDinoConfig(
        backbone_config=dict(model_type="swin", embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1], window_size=7,
                             out_features=["stage2", "stage3", "stage4"], image_size=224),
        text_config=dict(model_type="bert", vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2),
        d_model=32, encoder_layers=1, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
        encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=20, encoder_n_points=2, decoder_n_points=2)
    _seed()
    GroundingDinoForObjectDetection(cfg).save_pretrained(out)
    GroundingDinoProcessor(image_processor=GroundingDinoImageProcessor(size={"shortest_edge": 224, "longest_edge": 400}),
                           tokenizer=tok).save_pretrained(out)
    return out


def roberta(out: Path, kind: str = "roberta", layers: int = 24) -> Path:
    """A RoBERTa-family encoder folder (RobertaModel + byte-level BPE, or XLMRobertaModel + its
    tokenizer class) with the real depth: BERTScore reads roberta-large's layer 17."""
    from transformers import (RobertaConfig, RobertaModel, RobertaTokenizerFast, XLMRobertaConfig, XLMRobertaModel,
                              XLMRobertaTokenizerFast)
    special = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    if kind == "xlm-roberta":
        tok_cls, cfg_cls, model_cls = XLMRobertaTokenizerFast, XLMRobertaConfig, XLMRobertaModel
    else:
        tok_cls, cfg_cls, model_cls = RobertaTokenizerFast, RobertaConfig, RobertaModel
    trained = _unigram(special) if kind == "xlm-roberta" else _bpe(special, prefix_space=True)
    tok = tok_cls(tokenizer_object=trained, bos_token="<s>", eos_token="</s>",
                  sep_token="</s>", cls_token="<s>", unk_token="<unk>", pad_token="<pad>", mask_token="<mask>",
                  model_max_length=512)
    cfg = cfg_cls(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                  num_attention_heads=2, max_position_embeddings=514, pad_token_id=tok.pad_token_id,
                  bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    _seed()
    out.mkdir(parents=True, exist_ok=True)
    model_cls(cfg, add_pooling_layer=False).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def bart_mnli(out: Path) -> Path:
    """facebook/bart-large-mnli's classes: BartForSequenceClassification with MNLI's label map
    (0 contradiction, 1 neutral, 2 entailment) and BART's byte-level BPE tokenizer."""
    from transformers import BartConfig, BartForSequenceClassification, BartTokenizerFast
    special = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tok = BartTokenizerFast(tokenizer_object=_bpe(special, prefix_space=True), bos_token="<s>", eos_token="</s>",
                            sep_token="</s>", cls_token="<s>", unk_token="<unk>", pad_token="<pad>", mask_token="<mask>")
    labels = {0: "contradiction", 1: "neutral", 2: "entailment"}
    cfg = BartConfig(vocab_size=len(tok), d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                     decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=128,
                     num_labels=3, id2label=labels, label2id={v: k for k, v in labels.items()},
                     pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    _seed()
    out.mkdir(parents=True, exist_ok=True)
    BartForSequenceClassification(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def open_clip_hf(out: Path, config: str = "xlm-roberta-large-ViT-H-14", text_kind: str = "xlm-roberta") -> Path:
    """An open_clip model with a Hugging Face text tower (CLIP-XLM-RoBERTa, CLIP-RoBERTa), loaded as
    `local-dir:<out>`: open_clip's own model config with the widths shrunk, the text tower (a
    RoBERTa-family folder, `roberta(...)`) in `<out>/text` and its tokenizer in `<out>`."""
    import open_clip                                         # lazy: heavy
    from safetensors.torch import save_file
    cfg = json.loads((Path(open_clip.__file__).parent / "model_configs" / f"{config}.json").read_text())
    text = roberta(out / "text", text_kind, layers=24 if text_kind == "xlm-roberta" else 12)   # the real depths
    cfg["embed_dim"] = 16
    cfg["vision_cfg"].update(layers=1, width=32, head_width=16)
    cfg["text_cfg"].update(hf_model_name=str(text.resolve()), hf_tokenizer_name=str(text.resolve()))
    pre = {"mean": list(open_clip.OPENAI_DATASET_MEAN), "std": list(open_clip.OPENAI_DATASET_STD),
           "interpolation": "bicubic", "resize_mode": "shortest"}
    (out / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg, "preprocess_cfg": pre}, indent=1))
    from transformers import AutoTokenizer
    AutoTokenizer.from_pretrained(text).save_pretrained(out)      # open_clip reads a local-dir's tokenizer there
    _seed()
    model = open_clip.create_model(f"local-dir:{out.resolve()}", load_weights=False)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out / "open_clip_model.safetensors"))
    return out


#: name -> (builder, what it stands for)
BUILDERS: dict[str, tuple[Callable[[Path], Path], str]] = {
    "internvl3.5-8b": (internvl, "OpenGVLab/InternVL3_5-8B-HF"),
    "pixtral-12b": (pixtral, "mistral-community/pixtral-12b"),
    "paligemma-3b-pt-448": (paligemma, "google/paligemma-3b-pt-448"),
    "clip-vit-b32": (lambda o: clip(o, 32), "openai/clip-vit-base-patch32"),
    "clip-vit-l14": (lambda o: clip(o, 14), "openai/clip-vit-large-patch14"),
    "clip-vit-h14": (lambda o: clip(o, 14), "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"),
    "siglip-so400m": (lambda o: siglip(o, "sentencepiece"), "google/siglip-so400m-patch14-384"),
    "siglip2-so400m": (lambda o: siglip(o, "gemma"), "google/siglip2-so400m-patch14-384"),
    "blip-base": (blip, "Salesforce/blip-itm-base-coco"),
    "clip-xlmr-h14": (open_clip_hf, "open_clip xlm-roberta-large-ViT-H-14"),
    "clip-roberta-b32": (lambda o: open_clip_hf(o, "roberta-ViT-B-32", "roberta"), "open_clip roberta-ViT-B-32"),
    "grounding-dino-base": (grounding_dino, "IDEA-Research/grounding-dino-base"),
    "roberta-large": (roberta, "roberta-large (BERTScore, layer 17)"),
    "bart-large-mnli": (bart_mnli, "facebook/bart-large-mnli"),
}


# ----------------------------------------------------------------------------- data under the real names

#: the paper profile's dataset folders, each filled from MemeWorld's copy in the same format:
#: target folder -> (MemeWorld files or folders copied into it, the image folder it needs)
DATA_LAYOUT: dict[str, tuple[tuple[str, ...], str | None]] = {
    "fhm": (("train.jsonl", "dev_seen.jsonl", "dev_unseen.jsonl", "test_seen.jsonl", "test_unseen.jsonl"), "img"),
    "MultiOFF": (("multioff/Split Dataset", "multioff/Labelled Images"), None),
    "mami": (("mami/training.csv", "mami/test.csv"), "images"),
    "hvli": (("hvli/train_set.json", "hvli/test_set.json"), "img"),
    "hatred": (("hatred/fhm_train_reasonings.jsonl", "hatred/fhm_test_reasonings.jsonl"), None),   # images: ../fhm/img
    "memecap": (("memecap/memes-trainval.json", "memecap/memes-test.json"), "images"),
    "memesense": (("memesense/memesense.csv",), "img"),
    "foil": (("foil/foil_test.json",), None),
    "coco": ((), "val2014"),                                  # FOIL's images: ../coco/val2014
    "nocaps_foil": (("nocaps_foil/nocaps_foil.json",), None),
    "hat": (("hat/hat.json",), "images"),
    "richhf": (("richhf/richhf.jsonl",), "test"),
    "seetrue": (("seetrue/seetrue_feedback.json",), "images"),
}


def _copy(src: Path, dst: Path) -> None:
    import shutil                                            # lazy: only the data builder copies
    if src.is_dir():
        shutil.copytree(src, dst, dirs_exist_ok=True)
    else:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)


def write_data(out: Path, n: int = 400, seed: int = 0) -> Path:
    """A small MemeWorld written where the paper profile reads each dataset (`data/fhm`,
    `data/MultiOFF`, `data/mami/images`, `data/coco/val2014`, `data/nocaps/images`, ...), in the
    datasets' own files, plus RAM++'s tag list file (MemeWorld's objects, one per line). A finished
    copy (its `.complete` marker written last) is kept."""
    if (out / ".complete").exists():
        return out
    import tempfile                                          # lazy: only the data builder
    with tempfile.TemporaryDirectory() as tmp:
        mw = Path(tmp)
        write_memeworld(mw, n=n, seed=seed, n_multioff=max(60, n // 4), workers=1, progress=False)
        for target, (files, images) in DATA_LAYOUT.items():
            (out / target).mkdir(parents=True, exist_ok=True)
            for f in files:
                _copy(mw / f, out / target / Path(f).name)
            if images:
                _copy(mw / "img", out / target / images)
        _copy(mw / "nocaps_foil" / "img", out / "nocaps" / "images")
    (out / "ram_tag_list.txt").write_text("\n".join(tag_vocabulary()) + "\n", encoding="utf-8")
    (out / ".complete").write_text(json.dumps({"memes": n, "seed": seed}) + "\n")
    return out


def build_all(out: Path, names: Sequence[str] | None = None) -> dict[str, Path]:
    """Each named checkpoint under `out/<name>`; one already built (its SMOKE.json written last) is kept."""
    made = {}
    for name in names or BUILDERS:
        builder, real = BUILDERS[name]
        if (out / name / "SMOKE.json").exists():
            made[name] = out / name
            continue
        made[name] = builder(out / name)
        (made[name] / "SMOKE.json").write_text(json.dumps({"stands_for": real, "weights": "random"}) + "\n")
    return made


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("artifacts/paper-smoke/models"))
    ap.add_argument("--data", type=Path, default=None, help="also write the smoke datasets here")
    ap.add_argument("--memes", type=int, default=400)
    ap.add_argument("names", nargs="*", help=f"some of: {', '.join(BUILDERS)} (default: all)")
    args = ap.parse_args(argv)
    for name, path in build_all(args.out, args.names or None).items():
        print(f"{name:<22} -> {path}")
    if args.data:
        print(f"datasets -> {write_data(args.data, args.memes)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
