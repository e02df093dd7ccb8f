"""Saved notebooks scrubbed of run-to-run churn and machine details: timestamps, absolute paths, progress bars and
anything that looks like a secret the compendium loaded (environment variables, .env files, chat presets' keys)."""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from lib import ROOT
from lib.compendium.artifacts import write_text
from lib.compendium.presets import presets
from lib.models.chat.keys import read_dotenv, remembered_env_files


SECRET_ENV = re.compile(r"(API_KEY|TOKEN|SECRET|PASSWORD)", re.I)


#: An absolute path outside the project and the home folder (those are made relative first): a
#: "/" that does not continue a word, a URL or a relative path, followed by at least one folder.
ABS_PATH = re.compile(r"(?<![\w:/.~\-}*])/(?:[^\s\"'/:,;()\[\]{}<>*]+/)+")


def loaded_secrets() -> list[str]:
    """Every secret the compendium may have loaded: environment variables, `.env` entries and the
    entries of every other env file keys were read from (lib.models.chat remembers them) whose names look
    secret, and every key named by a chat preset's api_key_env (with its _1, _2...)."""
    sources = [dict(os.environ)]
    for f in [ROOT / ".env", *remembered_env_files()]:
        try:
            sources.append(read_dotenv(f))
        except (OSError, ValueError) as e:    # an unreadable file must not stop the scrubber; say so
            print(f"warning: secrets of {f} cannot be read to scrub saved notebooks ({e})", file=sys.stderr)
    try:
        key_envs = {str(p.options["api_key_env"]) for p in presets("chat").values() if p.options.get("api_key_env")}
    except Exception:  # a broken preset file must not stop the scrubber
        key_envs = set()
    found = set()
    for env in sources:
        names = {k for k in env if SECRET_ENV.search(k)}
        names |= {k for k in env if any(k == e or re.fullmatch(rf"{re.escape(e)}_\d+", k) for e in key_envs)}
        found |= {env[k] for k in names if env.get(k) and len(env[k]) >= 8}
    return sorted(found, key=len, reverse=True)


def _scrub_strings(value, replacements: list[tuple[str, str]], secrets: list[str]):
    """Apply the replacements, redact secrets and absolute paths in every string of an output."""
    if isinstance(value, str):
        for old, new in replacements:
            value = value.replace(old, new)
        for secret in secrets:
            value = value.replace(secret, "***")
        return ABS_PATH.sub("<abs>/", value)
    if isinstance(value, list):
        return [_scrub_strings(v, replacements, secrets) for v in value]
    if isinstance(value, dict):
        return {k: (v if k in ("image/png", "image/jpeg") else _scrub_strings(v, replacements, secrets))
                for k, v in value.items()}
    return value


_TQDM = re.compile(r"(\d+it/s|s/it|it/s\]|\|[#█▏▎▍▌▋▊▉ ]+\|)")


def scrub_notebook(path: Path, output_path: Path | None = None) -> None:
    """Remove run-to-run churn and machine details from a saved notebook, in place."""
    import nbformat
    nb = nbformat.read(str(path), as_version=4)
    pm = nb.metadata.get("papermill", {})
    for k in ("start_time", "end_time", "duration", "environment_variables", "exception"):
        pm.pop(k, None)
    if output_path is not None:
        pm["output_path"] = str(output_path)
    for k in ("input_path", "output_path"):
        if k in pm and pm[k]:
            pm[k] = os.path.relpath(pm[k], ROOT) if os.path.isabs(pm[k]) else pm[k]
    secrets = loaded_secrets()
    replacements = [(str(ROOT) + "/", ""), (str(ROOT), "."), (os.path.expanduser("~") + "/", "~/")]
    for cell in nb.cells:
        if "injected-parameters" in cell.metadata.get("tags", []):
            cell["id"] = "injected-parameters"  # papermill draws a random id on every run
        cell.metadata.pop("papermill", None)
        cell.metadata.pop("execution", None)
        if cell.cell_type != "code":
            continue
        kept = []
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stderr" and (
                    _TQDM.search(out.get("text", "")) or not out.get("text", "").strip()):
                continue  # progress bars (and their blank leftovers): useful live, churn when saved
            kept.append(nbformat.from_dict(_scrub_strings(json.loads(json.dumps(out)), replacements, secrets)))
        cell.outputs = kept
    write_text(path, nbformat.writes(nb) + "\n")
