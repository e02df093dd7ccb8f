"""Prompt files: every prompt the compendium sends is a file under params/prompts/ (prompts are data,
never strings in code), read by one function."""
from __future__ import annotations

from lib import ROOT

PROMPTS_DIR = ROOT / "params" / "prompts"


def prompt_template(relpath: str) -> str:
    """A prompt template file under params/prompts/, as written."""
    path = PROMPTS_DIR / relpath
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"prompt template {path.relative_to(ROOT)} does not exist") from None


def prompt_line(relpath: str) -> str:
    """A one-line prompt file without its final newline (a caption prompt, a question)."""
    return prompt_template(relpath).strip("\n")
