"""Backend `captioned`: a text-only model that takes image parts as captions written by a captioner."""
from __future__ import annotations

import hashlib
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from lib.models.chat.core import Chat, ChatBackend
from lib.models.chat.messages import ChatResult, GenParams, image, image_bytes, parts_of, text, user
from lib.models.chat.registry import load_backend, load_chat, register_backend
from lib.compendium.presets import Preset, PresetError, get_preset, options_from
from lib.compendium.prompts import prompt_line, prompt_template

#: The captioner's question unless a preset says otherwise (memeworld-vlm's training prompt).
DESCRIBE_PROMPT = prompt_line("caption/describe.txt")


@dataclass
class CaptionedOptions:
    """A `backend: captioned` preset's options (`model:` names the text-only chat preset behind it)."""
    captioner: str = ""                    # the chat preset that writes the captions
    caption_prompt: str = DESCRIBE_PROMPT
    caption_max_new_tokens: int = 60


@register_backend("captioned")
class CaptionedBackend:
    """Lets a text-only chat model take the protocol's image parts: each image is replaced by a
    caption written by a captioner (any chat model that sees pixels), then the conversation goes
    to the text-only model. Captions go through the captioner's own response cache (keyed by the
    image bytes and the caption prompt), so each image is captioned once.

    The adapter's identity (adapter, captioner identity, caption prompt and decoding, the
    template that inlines the caption) is part of every cache key: the same question with
    another captioner is another request. A model behind this adapter never saw pixels, and
    every notebook that uses one says so.
    """

    def __init__(self, inner: ChatBackend, captioner: Chat, caption_prompt: str = DESCRIBE_PROMPT,
                 caption_params: GenParams = GenParams(temperature=0.0, max_new_tokens=60),
                 image_template: str | None = None):
        self.inner = inner
        self.captioner = captioner
        self.caption_prompt = caption_prompt
        self.caption_params = caption_params
        self.image_template = image_template or prompt_template("captioned/image.txt").strip("\n")
        self.native_schema = bool(getattr(inner, "native_schema", False))
        self._captions: dict[str, ChatResult] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_preset(cls, preset: Preset, *, device: str | None = None, env_file: str | Path | None = None,
                    base_url: str | None = None, cache=None) -> "CaptionedBackend":
        o = options_from(CaptionedOptions, preset.options, f"chat preset '{preset.name}'")
        if not o.captioner:
            raise PresetError(f"chat preset '{preset.name}': options.captioner (a chat preset) is missing")
        inner = load_backend(get_preset("chat", preset.model), device, env_file, base_url, cache)
        captioner = load_chat(o.captioner, cache=cache, device=device, env_file=env_file)
        return cls(inner, captioner, caption_prompt=o.caption_prompt,
                   caption_params=GenParams(temperature=0.0, max_new_tokens=o.caption_max_new_tokens))

    def identity(self) -> dict[str, Any]:
        # "captioner_sees": answers cached while the captioner was sent an image's file path as text
        # (not the image) have keys without it, so none of them is ever replayed
        return {**self.inner.identity(), "adapter": "captioned", "captioner": self.captioner.backend.identity(),
                "captioner_sees": "image",
                "caption_prompt": self.caption_prompt, "caption_params": {k: v for k, v in asdict(self.caption_params).items() if k != "replicate"},
                "image_template": self.image_template}

    def caption_images(self, images: Sequence[Any]) -> list[ChatResult]:
        """Captions for images (cached per image by content), batched through the captioner. Each
        image goes to the captioner as an image part whatever its form (path, bytes, PIL image): a
        bare path string would be a text part, the captioner would read the path instead of the
        picture, and the request's key would depend on where the checkout lies."""
        digests = [hashlib.sha256(image_bytes(im)).hexdigest() for im in images]
        with self._lock:
            todo = {d: im for d, im in zip(digests, images) if d not in self._captions}
        if todo:
            res = self.captioner.generate_many([[user(image(im), self.caption_prompt)] for im in todo.values()],
                                               self.caption_params, progress=False)
            with self._lock:
                self._captions.update(zip(todo, res))
        return [self._captions[d] for d in digests]

    def describe(self, messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """The conversation with every image part replaced by its caption (a text part)."""
        images = [p["image"] for m in messages for p in parts_of(m) if p.get("type") == "image"]
        caps = iter(self.caption_images(images)) if images else iter(())
        out = []
        for m in messages:
            parts = []
            for p in parts_of(m):
                if p.get("type") == "image":
                    c = next(caps)
                    if c.status != "ok":
                        raise CaptionError(f"captioner {self.captioner.name or 'model'} could not caption an image "
                                           f"({c.status}: {c.error})")
                    parts.append(text(self.image_template.format(caption=c.text)))
                else:
                    parts.append(p)
            out.append({"role": m["role"], "content": parts})
        return out

    def prepare(self, conversations: Sequence[Sequence[dict[str, Any]]]) -> None:
        """Caption every image of these conversations in one batched pass (optional warm-up)."""
        self.caption_images([p["image"] for c in conversations for m in c for p in parts_of(m)
                             if p.get("type") == "image"])

    def complete(self, messages, params: GenParams) -> ChatResult:
        try:
            described = self.describe(messages)
        except CaptionError as e:
            return ChatResult("", "failed", error=str(e), model=str(self.inner.identity().get("model", "")))
        return self.inner.complete(described, params)


class CaptionError(RuntimeError):
    """The captioner behind a CaptionedBackend could not caption an image."""
