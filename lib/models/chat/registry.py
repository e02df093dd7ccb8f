"""Backend registry and loading: preset backend name -> "module:Class", `load_backend`, `load_chat`."""
from __future__ import annotations

from importlib import metadata
from pathlib import Path
from typing import Any

from lib.models.chat.cache import ResponseCache
from lib.models.chat.core import Chat, ChatBackend, ChatOptions
from lib.compendium.presets import (Preset, get_preset, registered_class, registrar, resolve_model_path,
                         weights_digest)


def served_identity(preset: Preset) -> dict[str, Any]:
    """Cache identity of a model this compendium serves itself (a `serve:` section): the GGUF's
    digest and the engine's version, not the (ephemeral) port."""
    gguf = Path(resolve_model_path(preset.options["serve"]["gguf"]))
    try:
        engine = f"llama.cpp (xllamacpp {metadata.version('xllamacpp')})"
    except metadata.PackageNotFoundError:
        engine = "llama.cpp"
    out = {"gguf": weights_digest(gguf) if gguf.exists() else str(gguf), "engine": engine}
    lora = preset.options["serve"].get("lora")
    if lora:                                       # an adapter changes the model: its weights join the identity
        path = Path(resolve_model_path(lora))
        out["lora"] = weights_digest(path) if path.exists() else str(path)
        out["lora_scale"] = float(preset.options["serve"].get("lora_scale", 1.0))
    return out


#: Preset `backend:` name -> "module:Class" (imported when a preset names it, so a backend's heavy
#: dependencies load only when it is used). Add one with `register_backend` or an entry here.
BACKENDS: dict[str, str] = {
    "hf": "lib.models.chat.hf:HFChatBackend",
    "openai_compatible": "lib.models.chat.openai_compatible:OpenAICompatibleBackend",
    "captioned": "lib.models.chat.captioned:CaptionedBackend",
}


#: Class decorator: a chat backend presets name as `backend: <name>`. The class provides `identity()`,
#: `complete(messages, params)` and `from_preset(preset, *, device, env_file, base_url, cache)`; class
#: attributes `default_max_workers` and `default_batch_size` size its `Chat`.
register_backend = registrar(BACKENDS)


def backend_class(name: str, preset_name: str = "?") -> type:
    """The class registered under a backend name."""
    return registered_class(BACKENDS, name, f"chat preset '{preset_name}'")


def load_backend(preset: Preset, device: str | None = None, env_file: str | Path | None = None,
                 base_url: str | None = None, cache: ResponseCache | str | Path | None = None) -> ChatBackend:
    """The backend a preset names. `base_url` overrides an HTTP preset's endpoint (a server started
    on a free port); `cache` is the response cache a captioned adapter's captioner uses."""
    return backend_class(preset.backend, preset.name).from_preset(preset, device=device, env_file=env_file,
                                                                  base_url=base_url, cache=cache)


def load_chat(name_or_path: str | Path, cache: ResponseCache | str | Path | None = None, device: str | None = None,
              env_file: str | Path | None = None, base_url: str | None = None) -> Chat:
    """A cached chat model from a preset name (params/presets/chat.yaml) or a local HF folder.

    `base_url` points an HTTP preset (or the text model behind a captioned one) at a running
    server, e.g. `lib.models.serve.serve(...).base_url`."""
    p = Path(str(name_or_path))
    if p.is_dir() and (p / "config.json").exists():
        preset = Preset(name=p.name, backend="hf", model=str(p))
    else:
        preset = get_preset("chat", str(name_or_path))
    if isinstance(cache, (str, Path)):
        cache = ResponseCache(cache)
    backend = load_backend(preset, device, env_file, base_url, cache)
    base = get_preset("chat", preset.model) if preset.backend == "captioned" else preset
    sized = backend_class(base.backend, base.name)      # how the model behind it is best driven
    opts = ChatOptions.from_options({**base.options, **preset.options})
    return Chat(backend, cache, name=preset.name,
                max_workers=opts.max_workers if opts.max_workers is not None else sized.default_max_workers,
                batch_size=opts.batch_size if opts.batch_size is not None else sized.default_batch_size,
                schema_retries=opts.schema_retries)
