"""Text drawn on meme pictures: the one font and line-wrapping rule MemeWorld's memes and the
prompt-injection copies share (upper-case caption lines that fit a width)."""
from __future__ import annotations

from typing import Any

from PIL import ImageFont

_FONTS: dict[int, Any] = {}


def font(size: int):
    """PIL's bundled scalable font at `size` pixels (cached)."""
    if size not in _FONTS:
        _FONTS[size] = ImageFont.load_default(size=size)
    return _FONTS[size]


def wrap(text: str, draw, font, width: int) -> list[str]:
    """`text` upper-cased and broken into lines no wider than `width` pixels in `font`."""
    words, lines, cur = text.upper().split(), [], ""
    for w in words:
        trial = (cur + " " + w).strip()
        if draw.textlength(trial, font=font) <= width or not cur:
            cur = trial
        else:
            lines.append(cur)
            cur = w
    if cur:
        lines.append(cur)
    return lines
