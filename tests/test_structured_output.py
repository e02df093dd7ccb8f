"""Structured output (JSON schema / choices) through the one chat protocol: constrained decoding where
the backend has it, parse-and-retry where it does not; and the captioned adapter that lets a text-only
model take image parts."""
import hashlib
import io
import json
import threading

import numpy as np
import pytest
from PIL import Image

from lib.models.chat import (CaptionedBackend, Chat, ChatResult, GenParams, OpenAICompatibleBackend, ResponseCache,
                      extract_json, image, image_bytes, parse_structured, prompt_template, text, user)
from lib.compendium.presets import PresetError

SCHEMA = {"type": "object", "properties": {"label": {"type": "string", "enum": ["hateful", "non-hateful"]},
                                            "explanation": {"type": "string"}},
          "required": ["label", "explanation"], "additionalProperties": False}


class Scripted:
    """Answers from a list, one per call; records what it was sent."""

    def __init__(self, answers, native_schema=False, name="scripted"):
        self.answers = list(answers)
        self.native_schema = native_schema
        self.sent = []
        self.name = name
        self.lock = threading.Lock()

    def identity(self):
        return {"model": self.name}

    def complete(self, messages, params):
        with self.lock:
            self.sent.append(messages)
            a = self.answers[min(len(self.sent) - 1, len(self.answers) - 1)]
        return ChatResult(a, usage={"prompt_tokens": 10, "completion_tokens": 4}, model=self.name)


def _text_of(msg):
    return "".join(p["text"] for p in msg["content"] if p["type"] == "text")


def test_parse_and_retry_for_a_backend_without_constrained_decoding(tmp_path):
    good = '{"label": "hateful", "explanation": "it mocks a group"}'
    b = Scripted(["Sure! label: hateful", good])
    chat = Chat(b, tmp_path / "c.sqlite")
    conv = [user("Is this meme hateful?")]
    r = chat.generate(conv, GenParams(json_schema=SCHEMA))
    assert r.status == "ok" and r.parsed == json.loads(good)
    assert r.attempts == 2 and r.usage["prompt_tokens"] == 20 and chat.stats.requests == 2
    first, second = b.sent
    schema_line = json.dumps(SCHEMA)
    assert schema_line in _text_of(first[-1]) and _text_of(first[-1]).startswith("Is this meme hateful?")
    # the retry quotes the model's answer and the validation error, then asks again
    assert second[-2] == {"role": "assistant", "content": [{"type": "text", "text": "Sure! label: hateful"}]}
    retry = prompt_template("structured/retry.txt").split("{error}")[0]
    assert _text_of(second[-1]).startswith(retry) and "no JSON object" in _text_of(second[-1])
    # cached with its parsed value: a rerun makes no call
    again = Chat(Scripted(["never used"]), tmp_path / "c.sqlite")
    again.backend.identity = b.identity
    r2 = again.generate(conv, GenParams(json_schema=SCHEMA))
    assert r2.from_cache and r2.parsed == r.parsed and again.stats.requests == 0


def test_an_answer_that_never_matches_is_unparseable_and_cached(tmp_path):
    b = Scripted(['{"label": "maybe", "explanation": "?"}'])
    chat = Chat(b, tmp_path / "c.sqlite", schema_retries=2)
    r = chat.generate([user("q")], GenParams(json_schema=SCHEMA))
    assert r.status == "unparseable" and "is not one of" in r.error and r.parsed is None
    assert len(b.sent) == 3 and chat.stats.unparseable == 1
    assert ResponseCache(tmp_path / "c.sqlite").counts() == {"unparseable": 1}


def test_a_backend_with_constrained_decoding_gets_the_request_as_is():
    b = Scripted(['{"label": "non-hateful", "explanation": "a joke about weather"}', "not json"], native_schema=True)
    chat = Chat(b, None)
    conv = [user("Is this meme hateful?")]
    r = chat.generate(conv, GenParams(json_schema=SCHEMA))
    assert r.status == "ok" and r.parsed["label"] == "non-hateful" and b.sent[0] == conv
    bad = chat.generate([user("other")], GenParams(json_schema=SCHEMA))
    assert bad.status == "unparseable" and len(b.sent) == 2      # no retry: the server already constrained it


def test_choices_accept_json_or_a_bare_choice():
    p = GenParams(choices=["hateful", "non-hateful"])
    assert p.choices == ("hateful", "non-hateful")
    assert parse_structured('{"answer": "hateful"}', p) == ("hateful", None)
    assert parse_structured("Non-hateful.", p) == ("non-hateful", None)
    assert parse_structured("probably hateful", p)[0] is None
    assert parse_structured('{"answer": "rude"}', p)[0] is None


def test_extract_json_finds_the_object_in_prose_and_fences():
    assert extract_json('```json\n{"a": 1}\n```') == {"a": 1}
    assert extract_json('Here you go: {"a": [1, 2]} hope it helps') == {"a": [1, 2]}
    with pytest.raises(ValueError):
        extract_json("no json here")


def test_gen_params_validate_and_key_the_schema():
    from lib.models.chat import cache_key
    with pytest.raises(ValueError, match="not both"):
        GenParams(json_schema=SCHEMA, choices=("a",))
    with pytest.raises(ValueError, match="JSON Schema object"):
        GenParams(json_schema="[1]")
    ident, m = {"model": "m"}, [user("q")]
    keys = {cache_key(ident, m, GenParams()), cache_key(ident, m, GenParams(json_schema=SCHEMA)),
            cache_key(ident, m, GenParams(json_schema={**SCHEMA, "required": ["label"]})),
            cache_key(ident, m, GenParams(choices=("a", "b")))}
    assert len(keys) == 4


def test_the_http_body_carries_the_schema_only_for_servers_that_constrain():
    native = OpenAICompatibleBackend("m", "http://127.0.0.1:9/v1", api_key_optional=True)
    body = native._body([user("q")], GenParams(json_schema=SCHEMA))
    assert body["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "response", "schema": SCHEMA, "strict": True}}
    choice = native._body([user("q")], GenParams(choices=("x", "y")))
    assert choice["response_format"]["json_schema"]["schema"]["properties"]["answer"]["enum"] == ["x", "y"]
    prompt = OpenAICompatibleBackend("m", "http://127.0.0.1:9/v1", api_key_optional=True, structured_output="prompt")
    assert "response_format" not in prompt._body([user("q")], GenParams(json_schema=SCHEMA))
    assert Chat(native).native_schema and not Chat(prompt).native_schema
    # the prompt-side instruction and retry policy join the key only where they are used
    assert Chat(prompt).key([user("q")], GenParams(json_schema=SCHEMA)) != \
        Chat(prompt, schema_retries=0).key([user("q")], GenParams(json_schema=SCHEMA))


def test_the_compact_mode_sends_the_schema_as_a_one_line_json_grammar():
    compact = OpenAICompatibleBackend("m", "http://127.0.0.1:9/v1", api_key_optional=True,
                                      structured_output="llguidance_compact")
    body = compact._body([user("q")], GenParams(json_schema=SCHEMA))
    assert "response_format" not in body and Chat(compact).native_schema
    head, _, spec = body["grammar"].partition("\nstart: %json ")
    assert head == "%llguidance {}"
    sent = json.loads(spec)
    assert sent.pop("x-guidance") == {"whitespace_flexible": False} and sent == SCHEMA
    # a choices request becomes the same one-field object as in json_schema mode
    choice = json.loads(compact._body([user("q")], GenParams(choices=("x", "y")))["grammar"].split("%json ", 1)[1])
    assert choice["properties"]["answer"]["enum"] == ["x", "y"]
    # a plain JSON-mode request is unchanged, and the mode is part of the cache identity
    assert compact._body([user("q")], GenParams(json_mode=True))["response_format"] == {"type": "json_object"}
    native = OpenAICompatibleBackend("m", "http://127.0.0.1:9/v1", api_key_optional=True)
    assert native.identity() != compact.identity() and "structured_output" not in native.identity()
    with pytest.raises(PresetError, match="llguidance_compact"):
        OpenAICompatibleBackend("m", "http://127.0.0.1:9/v1", api_key_optional=True, structured_output="grammar")


# ----------------------------------------------------------------------------- captioned adapter
def _img(seed):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 255, (12, 12, 3), dtype=np.uint8))


class Captioner(Scripted):
    def complete(self, messages, params):
        with self.lock:
            self.sent.append(messages)
        img = next(p["image"] for p in messages[0]["content"] if p["type"] == "image")
        return ChatResult(f"scene {hashlib.sha256(image_bytes(img)).hexdigest()[:6]}", model="cap")


class TextOnly(Scripted):
    def complete(self, messages, params):
        assert all(p["type"] == "text" for m in messages for p in m["content"]), "an image reached a text model"
        with self.lock:
            self.sent.append(messages)
        return ChatResult(" | ".join(_text_of(m) for m in messages), model="text")


def test_captioned_adapter_replaces_images_by_cached_captions(tmp_path):
    imgs = [_img(i) for i in range(3)]
    convs = [[user(imgs[0], "Is it hateful?")], [user(imgs[1], "Is it hateful?")],
             [user(imgs[0], "first"), user(imgs[2], "second")], [user(imgs[1], "again?")]]
    cap = Captioner([])
    inner = TextOnly([])
    chat = Chat(CaptionedBackend(inner, Chat(cap, tmp_path / "c.sqlite"), caption_prompt="Describe the image."),
                tmp_path / "c.sqlite", max_workers=4)
    res = chat.generate_many(convs, GenParams(max_new_tokens=10), progress=False)
    assert len(cap.sent) == 3                       # one caption per distinct image
    digest = hashlib.sha256(image_bytes(imgs[0])).hexdigest()[:6]
    expected = prompt_template("captioned/image.txt").strip("\n").format(caption=f"scene {digest}")
    assert res[0].text == expected + "Is it hateful?"
    assert _text_of(cap.sent[0][0]) == "Describe the image."
    # a rerun: every answer from the cache, no caption and no model call
    cap2, inner2 = Captioner([]), TextOnly([])
    chat2 = Chat(CaptionedBackend(inner2, Chat(cap2, tmp_path / "c.sqlite")), tmp_path / "c.sqlite")
    assert [r.text for r in chat2.generate_many(convs, GenParams(max_new_tokens=10), progress=False)] == \
        [r.text for r in res]
    assert cap2.sent == [] and inner2.sent == []
    # the adapter's identity is part of the key: another caption prompt is another request
    other = Chat(CaptionedBackend(TextOnly([]), Chat(cap, None), caption_prompt="What is in the picture?"))
    assert other.key(convs[0], GenParams()) != chat.key(convs[0], GenParams())
    ident = chat.backend.identity()
    assert ident["adapter"] == "captioned" and ident["captioner"] == {"model": "scripted"}


def test_the_captioner_sees_an_image_given_as_a_file_path_wherever_the_checkout_lies(tmp_path):
    # the notebooks pass images as file paths: each must reach the captioner as an image part (a bare
    # path string would be a text part: the captioner would read the path, not the picture), and the
    # same picture in two folders is one request with one key
    png = io.BytesIO()
    _img(7).save(png, format="PNG")
    paths = []
    for d in ("checkout_a", "somewhere/else/checkout_b"):
        (tmp_path / d).mkdir(parents=True)
        (tmp_path / d / "1.png").write_bytes(png.getvalue())
        paths.append(tmp_path / d / "1.png")
    digest = hashlib.sha256(png.getvalue()).hexdigest()[:6]
    keys = []
    for i, form in enumerate((str(paths[0]), paths[1])):
        cap = Captioner([])
        chat = Chat(CaptionedBackend(TextOnly([]), Chat(cap, tmp_path / f"c{i}.sqlite")), None)
        described = chat.backend.describe([user(image(form), text("q"))])
        parts = cap.sent[0][0]["content"]
        assert [p["type"] for p in parts] == ["image", "text"]
        assert str(form) not in _text_of(cap.sent[0][0])
        assert f"scene {digest}" in _text_of(described[0])
        keys.append(chat.backend.captioner.key(cap.sent[0], chat.backend.caption_params))
    assert keys[0] == keys[1]
    assert chat.backend.identity()["captioner_sees"] == "image"


def test_a_caption_that_fails_fails_the_request_without_caching_it(tmp_path):
    class Down(Scripted):
        def complete(self, messages, params):
            return ChatResult("", "failed", error="captioner down", model="cap")
    chat = Chat(CaptionedBackend(TextOnly([]), Chat(Down([]), None)), tmp_path / "c.sqlite")
    r = chat.generate([user(_img(0), "q")])
    assert r.status == "failed" and "captioner down" in r.error
    assert len(ResponseCache(tmp_path / "c.sqlite")) == 0
