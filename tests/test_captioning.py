"""TRACE grounding: boxes for tags from GroundingDINO (a tiny random model of the real
architecture, saved and loaded like the hub checkpoint) and from the encoder crop grounder;
prompts and caption columns carry the boxes."""
import numpy as np
import pytest
import torch
from PIL import Image

from lib.trace import captioning

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", "red", "sun", "house", "flame", "sigil", "a"]


@pytest.fixture(scope="module")
def tiny_dino_dir(tmp_path_factory):
    from transformers import (BertTokenizer, GroundingDinoConfig, GroundingDinoForObjectDetection,
                              GroundingDinoImageProcessor, GroundingDinoProcessor)
    cfg = GroundingDinoConfig(
        backbone_config=dict(model_type="swin", embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1],
                             window_size=4, image_size=64, out_features=["stage2", "stage3", "stage4"]),
        text_config=dict(model_type="bert", vocab_size=len(WORDS), hidden_size=16, num_hidden_layers=1,
                         num_attention_heads=2, intermediate_size=32),
        d_model=32, encoder_layers=1, decoder_layers=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
        encoder_attention_heads=2, decoder_attention_heads=2, num_queries=10, num_feature_levels=3,
        encoder_n_points=1, decoder_n_points=1, max_text_len=32)
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("dino")
    GroundingDinoForObjectDetection(cfg).save_pretrained(out)
    tok = BertTokenizer(vocab={w: i for i, w in enumerate(WORDS)})
    GroundingDinoProcessor(image_processor=GroundingDinoImageProcessor(size={"shortest_edge": 64, "longest_edge": 64}),
                           tokenizer=tok).save_pretrained(out)
    return out


def _images(n=2):
    rng = np.random.default_rng(1)
    return [Image.fromarray(rng.integers(0, 255, (96, 128, 3), dtype=np.uint8)) for _ in range(n)]


def test_grounding_dino_boxes_name_the_tags_and_lie_in_the_image(tiny_dino_dir):
    g = captioning.load_grounder({"kind": "grounding-dino", "model": str(tiny_dino_dir), "box_threshold": 0.0,
                                  "text_threshold": 0.0, "max_boxes_per_tag": 3}, device="cpu")
    tags = [["red sun", "house"], []]
    out = g.ground(_images(), tags)
    assert len(out) == 2 and out[1] == []                      # no tags: nothing to ground
    assert out[0], "threshold 0 keeps every query, so some must map to a tag"
    for b in out[0]:
        assert b["tag"] in tags[0]
        x0, y0, x1, y1 = b["box"]
        assert -1e-3 <= x0 <= x1 <= 128 + 1e-3 and -1e-3 <= y0 <= y1 <= 96 + 1e-3
    assert sum(b["tag"] == "house" for b in out[0]) <= 3
    g.box_threshold = 1.01                                      # nothing scores above 1
    assert g.ground(_images(1), [["red sun"]]) == [[]]


def test_detected_phrases_map_back_to_their_tags():
    m = captioning.GroundingDinoGrounder._match
    assert m("house", ["red sun", "house"]) == "house"
    assert m("sun", ["red sun", "house"]) == "red sun"          # a phrase inside one tag
    assert m("flame sigil", ["crossed-out flame sigil", "flame sigil"]) == "flame sigil"
    assert m("boat", ["red sun"]) is None and m("", ["x"]) is None


def test_crop_grounder_finds_the_window_that_matches():
    """With an encoder whose image embedding is the mean colour, the 'red' tag's box must be the
    window over the red square."""
    class ColourEncoder:
        def encode_images(self, crops):
            x = torch.tensor(np.stack([np.asarray(c, dtype=np.float32).mean((0, 1)) for c in crops]))
            return torch.nn.functional.normalize(x - 127.5, dim=-1)

        def encode_texts(self, texts):
            table = {"a red": [1.0, -1, -1], "a blue": [-1.0, -1, 1]}
            return torch.nn.functional.normalize(torch.tensor([table[t] for t in texts]), dim=-1)

    im = np.full((100, 100, 3), 128, np.uint8)
    im[60:100, 60:100] = (255, 0, 0)
    im[0:40, 0:40] = (0, 0, 255)
    g = captioning.CropGrounder(ColourEncoder(), prompt="a {}", scales=(0.4,), stride=0.3)
    (boxes,) = g.ground([Image.fromarray(im)], [["red", "blue"]])
    by = {b["tag"]: b["box"] for b in boxes}
    assert by["red"] == [60.0, 60.0, 100.0, 100.0] and by["blue"] == [0.0, 0.0, 40.0, 40.0]
    assert captioning.position_word(by["red"], 100) == "right" and captioning.position_word(by["blue"], 100) == "left"
    assert captioning.tag_caption([], boxes, 100) == "objects: blue on the left, red on the right"
    assert "[60, 60, 100, 100] on the right" in captioning.grounded_prompt([], boxes=boxes, width=100)
    assert captioning.box_iou(by["red"], [60, 60, 100, 100]) == 1.0 and captioning.box_iou(by["red"], by["blue"]) == 0.0


def test_unknown_grounder_kind_is_refused():
    with pytest.raises(ValueError, match="grounding-dino"):
        captioning.load_grounder({"kind": "owl"})
    assert captioning.load_grounder(None) is None
