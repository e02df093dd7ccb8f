"""MemeWorld drawn: each object, symbol and caption of a meme rendered to an image (FHM or MultiOFF style),
and the nominal box of an object at a position (the captioners' grounding is checked against it).
"""
from __future__ import annotations

import io
import os

import numpy as np
from PIL import Image, ImageDraw

from lib.data import render
from lib.data.memeworld import BACKGROUNDS, COLOURS, MemeSpec, POSITIONS, SceneObject, _spec_from_dict


# ----------------------------------------------------------------------------- rendering
def _draw_object(draw, obj: SceneObject, cx: float, cy: float, r: float) -> None:
    col = COLOURS.get(obj.colour or "", (30, 30, 30))
    ink = (20, 20, 60)
    k = obj.kind
    box = [cx - r, cy - r, cx + r, cy + r]
    if k == "sun":
        draw.ellipse([cx - r * .6, cy - r * .6, cx + r * .6, cy + r * .6], fill=col)
        for a in np.linspace(0, 2 * np.pi, 8, endpoint=False):
            draw.line([cx + np.cos(a) * r * .7, cy + np.sin(a) * r * .7, cx + np.cos(a) * r, cy + np.sin(a) * r],
                      fill=col, width=max(2, int(r / 6)))
    elif k == "tree":
        draw.polygon([(cx, cy - r), (cx - r * .8, cy + r * .4), (cx + r * .8, cy + r * .4)], fill=col)
        draw.rectangle([cx - r * .15, cy + r * .4, cx + r * .15, cy + r], fill=(110, 70, 30))
    elif k == "flower":
        for a in np.linspace(0, 2 * np.pi, 5, endpoint=False):
            px, py = cx + np.cos(a) * r * .5, cy + np.sin(a) * r * .5
            draw.ellipse([px - r * .4, py - r * .4, px + r * .4, py + r * .4], fill=col)
        draw.ellipse([cx - r * .25, cy - r * .25, cx + r * .25, cy + r * .25], fill=(250, 230, 80))
    elif k == "cake":
        draw.rectangle([cx - r * .8, cy - r * .1, cx + r * .8, cy + r * .8], fill=col)
        draw.rectangle([cx - r * .8, cy - r * .3, cx + r * .8, cy - r * .1], fill=(255, 255, 255))
        draw.rectangle([cx - r * .08, cy - r * .9, cx + r * .08, cy - r * .3], fill=(250, 200, 60))
    elif k == "house":
        draw.rectangle([cx - r * .7, cy - r * .1, cx + r * .7, cy + r * .9], fill=col)
        draw.polygon([(cx - r * .9, cy - r * .1), (cx, cy - r * .9), (cx + r * .9, cy - r * .1)], fill=(120, 50, 40))
    elif k == "boat":
        draw.polygon([(cx - r, cy + r * .2), (cx + r, cy + r * .2), (cx + r * .6, cy + r * .8),
                      (cx - r * .6, cy + r * .8)], fill=col)
        draw.polygon([(cx, cy - r), (cx, cy + r * .1), (cx + r * .7, cy + r * .1)], fill=(250, 250, 250))
    elif k == "ball":
        draw.ellipse(box, fill=col)
        draw.arc([cx - r * .6, cy - r, cx + r * .6, cy + r], 90, 270, fill=(255, 255, 255), width=max(2, int(r / 7)))
    elif k == "cup":
        draw.rectangle([cx - r * .6, cy - r * .6, cx + r * .4, cy + r * .8], fill=col)
        draw.arc([cx + r * .1, cy - r * .3, cx + r * .9, cy + r * .4], 270, 90, fill=col, width=max(2, int(r / 5)))
    elif k == "kite":
        draw.polygon([(cx, cy - r), (cx + r * .6, cy - r * .1), (cx, cy + r * .6), (cx - r * .6, cy - r * .1)], fill=col)
        draw.line([cx, cy - r, cx, cy + r * .6], fill=(250, 250, 250), width=max(1, int(r / 10)))
        draw.line([cx, cy + r * .6, cx - r * .3, cy + r * .8, cx + r * .1, cy + r], fill=ink, width=max(1, int(r / 10)))
    elif k == "lamp":
        draw.polygon([(cx - r * .35, cy - r * .9), (cx + r * .35, cy - r * .9), (cx + r * .7, cy - r * .2),
                      (cx - r * .7, cy - r * .2)], fill=col)
        draw.rectangle([cx - r * .07, cy - r * .2, cx + r * .07, cy + r * .7], fill=(60, 60, 60))
        draw.rectangle([cx - r * .45, cy + r * .7, cx + r * .45, cy + r * .85], fill=(60, 60, 60))
    elif k == "fish":
        draw.ellipse([cx - r * .8, cy - r * .45, cx + r * .4, cy + r * .45], fill=col)
        draw.polygon([(cx + r * .3, cy), (cx + r, cy - r * .5), (cx + r, cy + r * .5)], fill=col)
        draw.ellipse([cx - r * .55, cy - r * .15, cx - r * .38, cy + r * .02], fill=(0, 0, 0))
    elif k == "bell":
        draw.chord([cx - r * .7, cy - r * .9, cx + r * .7, cy + r * .5], 180, 360, fill=col)
        draw.rectangle([cx - r * .7, cy - r * .2, cx + r * .7, cy + r * .5], fill=col)
        draw.rectangle([cx - r * .85, cy + r * .5, cx + r * .85, cy + r * .65], fill=col)
        draw.ellipse([cx - r * .18, cy + r * .6, cx + r * .18, cy + r * .95], fill=(60, 60, 60))
    elif k == "leaf":
        draw.ellipse([cx - r * .45, cy - r * .9, cx + r * .45, cy + r * .6], fill=col)
        draw.line([cx, cy - r * .8, cx, cy + r], fill=(90, 60, 30), width=max(2, int(r / 8)))
    elif k in ("sigil", "defaced"):
        _draw_symbol(draw, obj.symbol or "hex", cx, cy, r, ink)
        if k == "defaced":
            w = max(3, int(r / 4))
            draw.line([cx - r, cy - r, cx + r, cy + r], fill=(220, 20, 20), width=w)
            draw.line([cx - r, cy + r, cx + r, cy - r], fill=(220, 20, 20), width=w)
    elif k == "vermin":
        brown = (120, 80, 40)
        draw.ellipse([cx - r * .8, cy - r * .4, cx + r * .5, cy + r * .5], fill=brown)
        draw.ellipse([cx + r * .3, cy - r * .35, cx + r * .9, cy + r * .2], fill=brown)
        draw.ellipse([cx + r * .45, cy - r * .6, cx + r * .7, cy - r * .25], fill=brown)
        draw.line([cx - r * .8, cy + r * .1, cx - r, cy + r * .8], fill=brown, width=max(2, int(r / 8)))
        draw.ellipse([cx + r * .62, cy - r * .15, cx + r * .72, cy - r * .05], fill=(0, 0, 0))
    elif k == "stamp":
        g = (30, 150, 70)
        draw.polygon([(cx - r * .8, cy - r * .8), (cx + r * .8, cy - r * .8), (cx + r * .8, cy + r * .1),
                      (cx, cy + r), (cx - r * .8, cy + r * .1)], fill=g)
        draw.line([cx - r * .4, cy, cx - r * .05, cy + r * .35, cx + r * .5, cy - r * .4], fill=(255, 255, 255),
                  width=max(2, int(r / 5)))
    elif k == "hand":
        grey = (120, 120, 125)
        draw.rectangle([cx - r * .55, cy - r * .1, cx + r * .45, cy + r * .9], fill=grey)
        for i in range(4):
            x0 = cx - r * .55 + i * r * .26
            draw.rectangle([x0, cy - r * .9, x0 + r * .2, cy - r * .1], fill=grey)
        draw.polygon([(cx + r * .45, cy + r * .2), (cx + r * .95, cy - r * .3), (cx + r * .45, cy + r * .55)], fill=grey)
    else:
        raise ValueError(f"unknown scene object kind {k!r}")


def _draw_symbol(draw, sym: str, cx: float, cy: float, r: float, ink) -> None:
    w = max(2, int(r / 6))
    if sym == "zigzag":
        pts = [(cx - r * .9 + i * r * .45, cy + (r * .6 if i % 2 else -r * .6)) for i in range(5)]
        draw.line(pts, fill=ink, width=w)
    elif sym == "triad":
        for dx, dy in ((0, -.5), (-.5, .4), (.5, .4)):
            draw.ellipse([cx + dx * r - r * .28, cy + dy * r - r * .28, cx + dx * r + r * .28, cy + dy * r + r * .28], fill=ink)
    elif sym == "wave":
        for off in (-.4, .3):
            xs = np.linspace(-r * .9, r * .9, 12)
            draw.line([(cx + x, cy + off * r + np.sin(x / r * 3.5) * r * .25) for x in xs], fill=ink, width=w)
    elif sym == "flame":
        draw.polygon([(cx, cy - r), (cx + r * .6, cy + r * .2), (cx + r * .3, cy + r * .9), (cx - r * .3, cy + r * .9),
                      (cx - r * .6, cy + r * .2)], fill=ink)
        draw.polygon([(cx, cy - r * .1), (cx + r * .25, cy + r * .5), (cx - r * .25, cy + r * .5)], fill=(240, 240, 240))
    elif sym == "rings":
        draw.ellipse([cx - r * .9, cy - r * .45, cx + r * .1, cy + r * .55], outline=ink, width=w)
        draw.ellipse([cx - r * .1, cy - r * .45, cx + r * .9, cy + r * .55], outline=ink, width=w)
    elif sym == "spiral":
        t = np.linspace(0, 4 * np.pi, 40)
        draw.line([(cx + np.cos(a) * r * a / (4 * np.pi), cy + np.sin(a) * r * a / (4 * np.pi)) for a in t],
                  fill=ink, width=w)
    elif sym == "starburst":
        pts = []
        for i, a in enumerate(np.linspace(-np.pi / 2, 1.5 * np.pi, 16, endpoint=False)):
            rr = r if i % 2 == 0 else r * .4
            pts.append((cx + np.cos(a) * rr, cy + np.sin(a) * rr))
        draw.polygon(pts, fill=ink)
    elif sym == "hex":
        pts = [(cx + np.cos(a) * r * .9, cy + np.sin(a) * r * .9) for a in np.linspace(0, 2 * np.pi, 6, endpoint=False)]
        draw.polygon(pts, outline=ink, width=w)
        draw.ellipse([cx - r * .25, cy - r * .25, cx + r * .25, cy + r * .25], fill=ink)
    else:
        raise ValueError(f"unknown symbol {sym!r}")


def _object_row(size: int, style: str) -> tuple[float, float]:
    """Centre height and radius of the scene's objects: mid-image for FHM, raised for MultiOFF
    (whose text sits in one bottom band)."""
    band = int(size * 0.18)
    return size / 2 + (0 if style == "fhm" else -band / 3), size * 0.15


def render_meme(spec: MemeSpec, size: int = 128, text_on_image: bool = True, style: str = "fhm"):
    """The meme's picture (PIL.Image, RGB): scene, then the meme text in top/bottom bands."""
    rng = np.random.default_rng(spec.render_seed)
    img = Image.new("RGB", (size, size), BACKGROUNDS[spec.background])
    draw = ImageDraw.Draw(img)
    cy, r = _object_row(size, style)
    for obj in spec.objects:
        jx, jy = rng.uniform(-size * .025, size * .025, 2)
        _draw_object(draw, obj, POSITIONS[obj.position] * size + jx, cy + jy, r)
    for _ in range(int(rng.integers(0, 4))):  # speckle: a little visual noise
        x, y = rng.uniform(0, size, 2)
        draw.point((x, y), fill=tuple(int(c) for c in rng.integers(0, 255, 3)))
    if text_on_image:
        font = render.font(max(8, size // 12))
        lines = render.wrap(spec.text, draw, font, size - 6)
        top, bottom = (lines[: (len(lines) + 1) // 2], lines[(len(lines) + 1) // 2:]) if style == "fhm" else ([], lines)
        lh = font.size + 1
        for i, line in enumerate(top):
            draw.text((size / 2, 2 + i * lh), line, font=font, fill="white", anchor="ma", stroke_width=1,
                      stroke_fill="black")
        for i, line in enumerate(bottom):
            draw.text((size / 2, size - 2 - (len(bottom) - i) * lh), line, font=font, fill="white", anchor="ma",
                      stroke_width=1, stroke_fill="black")
    return img


def render_to_file(args: tuple[dict, str, int, str]) -> str:
    spec_d, path, size, style = args
    spec = _spec_from_dict(spec_d)
    img = render_meme(spec, size=size, style=style)
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=False, compress_level=6)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(buf.getvalue())
    os.replace(tmp, path)
    return path


def object_box(position: str, size: int = 128, style: str = "fhm") -> list[float]:
    """The nominal pixel box [x0, y0, x1, y1] of an object drawn at `position` (the renderer jitters
    centres by at most 2.5% of the size, so the true box overlaps this one with IoU > 0.7)."""
    cy, r = _object_row(size, style)
    cx = POSITIONS[position] * size
    return [cx - r, cy - r, cx + r, cy + r]
