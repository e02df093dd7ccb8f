"""Generative chat models behind one protocol and one response cache.

    chat = load_chat("memeworld-vlm", cache="artifacts/embedded/cache/responses.sqlite")
    r = chat.generate([user(image, "Describe the image.")], GenParams(max_new_tokens=40))
    r.text, r.status, r.usage, r.cost_usd

Messages are `{"role": ..., "content": [parts]}` with parts `{"type": "text", "text": ...}` or
`{"type": "image", "image": PIL.Image | path | bytes}`, interleaved freely (few-shot prompts
put several images in one conversation). Every backend returns a `ChatResult` with the text,
a status (`ok`, `refused`, `blocked`, `failed`), token usage and cost.

Backends (one file each, registered by name: a preset's `backend:` picks one through
`lib.models.chat.registry.BACKENDS`, a name -> "module:Class" map that `register_backend` extends):
- `HFChatBackend` (`hf`): a local or hub Hugging Face image-text-to-text model through
  `AutoModelForImageTextToText` and its processor's chat template (InternVL3.5, Pixtral,
  Qwen2.5-VL, PaliGemma, and the compendium's own memeworld-vlm);
- `OpenAICompatibleBackend` (`openai_compatible`): any `/v1/chat/completions` endpoint (OpenAI, Gemini's and
  Qwen's compatible endpoints, vLLM, Ollama, LM Studio) with timeouts, retries with
  backoff on 429/5xx/timeouts/malformed bodies honouring Retry-After, key rotation over
  NAME, NAME_1, NAME_2... from the environment or a git-ignored `.env`, refusals and
  safety blocks recorded as such, token usage and cost counted;
- `CaptionedBackend` (`captioned`): a text-only model that takes images as a captioner's captions.

`Chat` puts the one `ResponseCache` (SQLite) in front of a backend: the key hashes the
model's identity and revision (an HTTP model's endpoint too), the messages (images by their
bytes) and the decoding parameters (a JSON schema or choice list included), never a key or a
header. Each answer is stored the moment it arrives, so a rerun costs zero calls and a crash
loses nothing already answered. What the model said is stored whatever it was (ok,
unparseable, refused, blocked); a failed request is not, and is asked again next time.
Requests are single-flight per key: a caller claims the key in the cache file before asking,
and any other thread or process asking for the same key waits for that answer, so it is paid
for once and every caller gets the same one.

Files: `messages` (parts, `GenParams`, `ChatResult`, cache keys) <- `structured` (JSON out of free
text, schema checks) <- `cache` (`ResponseCache`) <- `core` (`Chat`) <- `registry` (`load_chat`)
<- one file per backend (`hf`, `openai_compatible`, `captioned`), with `keys` for API keys.
"""
from __future__ import annotations

from lib.compendium.artifacts import loads_strict
from lib.compendium.presets import lazy_exports
from lib.compendium.prompts import prompt_template
from lib.models.chat.cache import CacheError, ResponseCache, default_cache_path
from lib.models.chat.core import Chat, ChatBackend, ChatOptions, ChatStats
from lib.models.chat.keys import ENV_FILES_LOG, KeyRing, api_keys, read_dotenv, remembered_env_files
from lib.models.chat.messages import (STATUSES, ChatResult, GenParams, assistant, cache_key, canonical, image, image_bytes,
                               parts_of, system, text, user)
from lib.models.chat.registry import BACKENDS, backend_class, load_backend, load_chat, register_backend, served_identity
from lib.models.chat.structured import (MAX_JSON_CHARS, MAX_JSON_DEPTH, check_json_bounds, clean_text, extract_json,
                                 parse_structured, with_schema_instruction)

#: Backend classes load with their module on first use (the hf backend imports torch and transformers).
_LAZY = {"HFChatBackend": "lib.models.chat.hf", "HFOptions": "lib.models.chat.hf",
         "OpenAICompatibleBackend": "lib.models.chat.openai_compatible", "HTTPOptions": "lib.models.chat.openai_compatible",
         "CaptionedBackend": "lib.models.chat.captioned", "CaptionError": "lib.models.chat.captioned",
         "CaptionedOptions": "lib.models.chat.captioned"}

__getattr__ = lazy_exports("lib.models.chat", _LAZY)
