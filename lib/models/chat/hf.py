"""Backend `hf`: a local or hub Hugging Face chat model driven through its chat template."""
from __future__ import annotations

import io
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from PIL import Image
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

from lib.compendium.artifacts import MissingInputError
from lib.models.chat.messages import ChatResult, GenParams, image_bytes, parts_of
from lib.models.chat.registry import register_backend
from lib.compendium.presets import Preset, PresetError, default_device, options_from, torch_dtype


@dataclass
class HFOptions:
    """A `backend: hf` preset's options."""
    task: str = "image-text-to-text"        # or "causal-lm" (a text-only model)
    gguf_file: str | None = None            # a GGUF file inside the model folder, dequantized by transformers


@register_backend("hf")
class HFChatBackend:
    """A Hugging Face chat model driven through its chat template.

    `task="image-text-to-text"` (default): AutoModelForImageTextToText + AutoProcessor
    (InternVL3.5, Pixtral, PaliGemma, memeworld-vlm). `task="causal-lm"`: a text-only
    AutoModelForCausalLM + AutoTokenizer, optionally from a GGUF file (`gguf_file`,
    dequantized by transformers); image parts are an error (wrap it in `CaptionedBackend`).
    """

    def __init__(self, model_id: str, revision: str | None = None, dtype: str = "float32", device: str | None = None,
                 model=None, processor=None, identity: dict[str, Any] | None = None,
                 task: str = "image-text-to-text", gguf_file: str | None = None):
        if task not in ("image-text-to-text", "causal-lm"):
            raise PresetError(f"hf chat task must be 'image-text-to-text' or 'causal-lm', got {task!r}")
        self.model_id, self.revision, self.task = model_id, revision, task
        self.device = device or default_device()
        if model is None:
            kw: dict[str, Any] = {"revision": revision} if revision and not Path(model_id).exists() else {}
            if gguf_file:
                kw["gguf_file"] = gguf_file
            if task == "causal-lm":
                processor = AutoTokenizer.from_pretrained(model_id, **kw)
                model = AutoModelForCausalLM.from_pretrained(model_id, dtype=torch_dtype(dtype), **kw)
            else:
                processor = AutoProcessor.from_pretrained(model_id, **kw)
                model = AutoModelForImageTextToText.from_pretrained(model_id, dtype=torch_dtype(dtype), **kw)
        self.model = model.to(self.device).eval()
        self.processor = processor
        self._identity = identity or {"model": model_id, "revision": revision}
        self._lock = threading.Lock()   # one generate at a time on one model

    default_max_workers = 1        # one model in memory: batches, not threads
    default_batch_size = 16

    @classmethod
    def from_preset(cls, preset: Preset, *, device: str | None = None, **_) -> "HFChatBackend":
        local = preset.resolved_model
        if "{artifacts}" in preset.model and not Path(local).exists():
            raise MissingInputError(f"chat preset '{preset.name}': {local} does not exist; "
                                    f"train it with `make reproduce NB=models`")
        o = options_from(HFOptions, preset.options, f"chat preset '{preset.name}'")
        return cls(local, preset.revision, preset.dtype, device, identity=preset.identity(), task=o.task,
                   gguf_file=o.gguf_file)

    def identity(self) -> dict[str, Any]:
        return self._identity

    def _hf_messages(self, messages) -> list[dict[str, Any]]:
        out = []
        for m in messages:
            if self.task == "causal-lm":
                if any(p["type"] == "image" for p in parts_of(m)):
                    raise ValueError(f"{self.model_id} is a text-only model and got an image part: wrap it in the "
                                     f"captioned adapter (backend: captioned) to replace images by captions")
                out.append({"role": m["role"], "content": "".join(p["text"] for p in parts_of(m))})
                continue
            parts = []
            for p in parts_of(m):
                if p["type"] == "image":
                    img = p["image"]
                    if not hasattr(img, "convert"):
                        img = Image.open(io.BytesIO(image_bytes(img)))
                    parts.append({"type": "image", "image": img.convert("RGB")})
                else:
                    parts.append({"type": "text", "text": p["text"]})
            out.append({"role": m["role"], "content": parts})
        return out

    @property
    def has_chat_template(self) -> bool:
        tok = getattr(self.processor, "tokenizer", self.processor)
        return bool(getattr(self.processor, "chat_template", None) or getattr(tok, "chat_template", None))

    def _prefix_prompt(self, messages) -> tuple[str, list[Any]]:
        """A model without a chat template (PaliGemma-pt): one user turn, its text as the prefix and
        its images to the processor, which inserts the image tokens itself."""
        if len(messages) != 1 or messages[0]["role"] != "user":
            raise ValueError(f"{self.model_id} has no chat template: it takes a single user turn (image + prefix "
                             f"text), got roles {[m['role'] for m in messages]}")
        parts = messages[0]["content"]
        return ("".join(p["text"] for p in parts if p["type"] == "text"),
                [p["image"] for p in parts if p["type"] == "image"])

    def complete_batch(self, conversations: Sequence[Sequence[dict[str, Any]]], params: GenParams) -> list[ChatResult]:
        """Several conversations in one left-padded generate call (greedy or seeded sampling)."""
        tok = getattr(self.processor, "tokenizer", self.processor)
        side = tok.padding_side
        tok.padding_side = "left"
        try:
            msgs = [self._hf_messages(m) for m in conversations]
            if self.task == "causal-lm":
                inputs = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=True,
                                                 return_tensors="pt", padding=True)
            elif self.has_chat_template:
                inputs = self.processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                                            return_dict=True, return_tensors="pt",
                                                            processor_kwargs={"padding": True})
            else:
                texts, ims = zip(*(self._prefix_prompt(m) for m in msgs))
                inputs = self.processor(text=list(texts), images=[i[0] if len(i) == 1 else list(i) for i in ims],
                                        padding=True, return_tensors="pt")
        finally:
            tok.padding_side = side
        dtype = next(self.model.parameters()).dtype
        inputs = {k: (v.to(self.device, dtype) if v.is_floating_point() else v.to(self.device))
                  for k, v in inputs.items() if hasattr(v, "to")}
        gen = {"max_new_tokens": params.max_new_tokens, "do_sample": params.temperature > 0}
        if params.temperature > 0:
            gen.update(temperature=params.temperature, top_p=params.top_p)
        if tok.pad_token_id is not None:
            gen["pad_token_id"] = tok.pad_token_id
        with self._lock, torch.no_grad():
            torch.manual_seed(params.seed)
            out = self.model.generate(**inputs, **gen)
        n_in = inputs["input_ids"].shape[1]
        eos = self.model.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, list) else [eos])
        results = []
        for i in range(len(conversations)):
            new = out[i, n_in:].tolist()
            # the answer ends at its first end-of-sequence token (pad may equal eos: cut, don't filter)
            n_new = next((j + 1 for j, t in enumerate(new) if t in eos), None)
            finish = "stop" if n_new is not None else "length"
            keep = new[:n_new] if n_new is not None else [t for t in new if t != tok.pad_token_id]
            prompt_len = int(inputs["attention_mask"][i].sum()) if "attention_mask" in inputs else n_in
            results.append(ChatResult(tok.decode(keep, skip_special_tokens=True).strip(),
                                      usage={"prompt_tokens": prompt_len, "completion_tokens": len(keep)},
                                      finish_reason=finish, model=self.model_id))
        return results

    def complete(self, messages, params: GenParams) -> ChatResult:
        return self.complete_batch([messages], params)[0]
