"""`make report`: the executed notebooks as one static HTML site, a paper to read in a browser.

    python -m lib.compendium.report --profile embedded            # -> artifacts/embedded/report/index.html

The front page is the README (its results tables included) followed by a table of contents in
notebook order; every page of docs/ becomes docs/<name>.html, and every local link of the README and the docs
leads to its page or to a copy of the file it names; each notebook is one page (nbconvert's HTML exporter: code, outputs and the
figures embedded in the page itself), with links to the previous and next notebook; the figure
index (`figures/README.md`) becomes `figures.html` beside a copy of the profile's PNGs. The site
is plain files: open index.html, or serve the folder with any static server.

Safety: every HTML fragment a notebook carries (text/html and markdown outputs, raw HTML in
markdown cells, JavaScript outputs) is sanitised by an allow-list (tables, text formatting,
images from data:image/png|jpeg|gif|webp, links to http(s), mailto or relative targets; no
script, style, event handler or javascript: URL); `--trust-html` renders a notebook's HTML as it is,
for notebooks you wrote and ran yourself. Every file name is escaped in text and percent-encoded in
links. The report writes only its own pages and the copies they link (with the mode the umask gives a new
file); nothing else already in the output folder is touched.

Embedded notebooks are read from notebooks/ (they are executed in place); another profile's from
artifacts/<profile>/notebooks/, where the runner writes them.
"""
from __future__ import annotations

import argparse
import html
import json
import posixpath
import re
import shutil
import sys
from pathlib import Path
from typing import Any, Sequence
from urllib.parse import quote, unquote, urlsplit

import bleach
from markdown_it import MarkdownIt

from lib import ROOT
from lib.compendium.artifacts import ARTIFACTS_ROOT, cli_error, figures_dir, figures_index, write_text
from lib.compendium.params import ProfileError, profile_path, stages

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;max-width:1100px;margin:0 auto;padding:1.5rem;
line-height:1.5;color:#222} table{border-collapse:collapse;font-size:.9rem} td,th{border:1px solid #ccc;padding:.25rem .5rem}
th{background:#f3f3f3} code{background:#f5f5f5;padding:0 .2rem} nav.site{display:flex;gap:1rem;flex-wrap:wrap;
padding:.5rem 0;border-bottom:1px solid #ddd;margin-bottom:1rem;font-size:.95rem} ol.toc li{margin:.4rem 0}
ol.toc .blurb{color:#555;font-size:.9rem} img{max-width:100%}
"""


ALLOWED_TAGS = frozenset({
    "a", "abbr", "b", "blockquote", "br", "caption", "code", "col", "colgroup", "dd", "del", "details", "div", "dl",
    "dt", "em", "figcaption", "figure", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "i", "img", "ins", "kbd", "li",
    "mark", "ol", "p", "pre", "q", "s", "samp", "small", "span", "strong", "sub", "summary", "sup", "table", "tbody",
    "td", "tfoot", "th", "thead", "tr", "u", "ul", "var"})
_COMMON_ATTRS = {"class", "id", "title", "align", "lang", "dir"}
_TAG_ATTRS = {"a": {"href"}, "img": {"src", "alt", "width", "height"}, "td": {"colspan", "rowspan"},
              "th": {"colspan", "rowspan", "scope"}, "table": {"border"}, "ol": {"start"}, "col": {"span"},
              "colgroup": {"span"}}
_DATA_IMAGE = re.compile(r"data:image/(png|jpeg|gif|webp);base64,[A-Za-z0-9+/=\s]*\Z", re.I)
_SCRIPT_STYLE = re.compile(r"<(script|style)\b[^>]*>.*?</\1\s*>", re.I | re.S)


def _attribute_ok(tag: str, name: str, value: str) -> bool:
    if name not in _COMMON_ATTRS and name not in _TAG_ATTRS.get(tag, ()):
        return False
    if name in ("href", "src"):
        v = value.strip()
        if tag == "img" and name == "src" and v.lower().startswith("data:"):
            return bool(_DATA_IMAGE.match(v))
        scheme = re.match(r"([a-zA-Z][a-zA-Z0-9+.\-]*):", v)
        return scheme is None or scheme.group(1).lower() in ("http", "https", "mailto")
    return True


def sanitize_html(fragment: Any) -> str:
    """An HTML fragment with only ALLOWED_TAGS and their safe attributes kept: scripts and styles
    removed with their content, event handlers and javascript: / data: links dropped (data: only
    for images in raster formats)."""
    text = fragment.decode() if isinstance(fragment, bytes) else str(fragment)
    text = _SCRIPT_STYLE.sub("", text)
    return bleach.clean(text, tags=ALLOWED_TAGS, attributes=_attribute_ok,
                        protocols=["http", "https", "mailto", "data"], strip=True, strip_comments=True)


def _href(name: str) -> str:
    """A relative link to a file name, percent-encoded ('#', '%', quotes, spaces) and attribute-safe."""
    return html.escape(quote(name), quote=True)


def notebook_dir(profile: str) -> Path:
    return ROOT / "notebooks" if profile == "embedded" else ARTIFACTS_ROOT / profile / "notebooks"


def notebooks(profile: str) -> list[Path]:
    """The profile's executed notebooks, in stage order (only those that exist)."""
    d = notebook_dir(profile)
    return [d / st.notebook.name for st in stages() if st.notebook is not None and (d / st.notebook.name).exists()]


def _markdown(text: str) -> str:
    return sanitize_html(MarkdownIt("commonmark", {"html": True}).enable("table").render(text))


def _markdown_inline(text: str) -> str:
    return sanitize_html(MarkdownIt("commonmark").renderInline(text))


def _title_and_blurb(nb_path: Path) -> tuple[str, str]:
    """The notebook's first heading and the first paragraph after it."""
    nb = json.loads(nb_path.read_text(encoding="utf-8"))
    for c in nb["cells"]:
        if c["cell_type"] == "markdown":
            lines = "".join(c["source"]).strip().splitlines()
            title = lines[0].lstrip("# ").strip() if lines else nb_path.stem
            rest, para = lines[1:], []
            for line in rest:
                if line.strip() and not line.startswith(("|", "#")):
                    para.append(line.strip())
                elif para:
                    break
            return title, " ".join(para)
    return nb_path.stem, ""


def _nav(pages: list[tuple[str, str]], i: int | None, depth: int = 0) -> str:
    up = "../" * depth
    links = [f'<a href="{up}index.html">Contents</a>', f'<a href="{up}figures.html">Figures</a>']
    if i is not None:
        if i > 0:
            links.insert(1, f'<a href="{_href(pages[i - 1][0])}">&larr; {html.escape(pages[i - 1][1])}</a>')
        if i + 1 < len(pages):
            links.append(f'<a href="{_href(pages[i + 1][0])}">{html.escape(pages[i + 1][1])} &rarr;</a>')
    return '<nav class="site">' + " | ".join(links) + "</nav>"


def _title(md: Path) -> str:
    first = next((ln for ln in md.read_text(encoding="utf-8").splitlines() if ln.startswith("#")), md.stem)
    return first.lstrip("# ").strip()


#: the markdown files the site renders, by their path in the repository -> their page in the site
def site_page(rel: str) -> str | None:
    """The site page of a repository file that the site renders (README.md, docs/*.md), or None."""
    if rel == "README.md":
        return "index.html"
    if rel.startswith("docs/") and rel.endswith(".md") and "/" not in rel[5:]:
        return rel[:-3] + ".html"
    return None


_HREF = re.compile(r'(href|src)="([^"]*)"')


def _local_links(body: str, source: Path, page: str, out: Path) -> str:
    """Links of a rendered markdown file made to work in the site: a link to a rendered page (README.md,
    docs/*.md) points at its HTML page, a link to another file of the repository points at a copy of it in the
    site (at the same place), both relative to `page`; external links and anchors are left as they are."""
    def fix(m: re.Match) -> str:
        attr, href = m.group(1), html.unescape(m.group(2))
        parts = urlsplit(href)
        if parts.scheme or parts.netloc or not parts.path or href.startswith("#"):
            return m.group(0)
        target = (source.parent / unquote(parts.path)).resolve()
        try:
            rel = target.relative_to(ROOT).as_posix()
        except ValueError:
            return m.group(0)                     # outside the repository: left alone (and reported as broken)
        dest = site_page(rel)
        if dest is None and target.is_file():
            dest = rel
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(target, out / rel)
        if dest is None:
            return m.group(0)
        new = posixpath.relpath(dest, posixpath.dirname(page) or ".") + (f"#{parts.fragment}" if parts.fragment else "")
        return f'{attr}="{html.escape(new, quote=True)}"'
    return _HREF.sub(fix, body)


def broken_links(site: Path) -> list[str]:
    """Every local link or image of the site's pages that resolves to no file of the site ("page: link")."""
    bad = []
    for page in sorted(site.rglob("*.html")):
        for _, href in _HREF.findall(page.read_text(encoding="utf-8")):
            parts = urlsplit(html.unescape(href))
            if parts.scheme or parts.netloc or not parts.path:
                continue
            if not (page.parent / unquote(parts.path)).resolve().is_file():
                bad.append(f"{page.relative_to(site).as_posix()}: {href}")
    return bad


def _page(title: str, body: str, nav: str) -> str:
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>{nav}{body}{nav}</body></html>\n")


def build(profile: str = "embedded", out: Path | None = None, trust_html: bool = False) -> Path:
    """Render the site; returns the path of index.html. `trust_html`: render the notebooks' own
    HTML and JavaScript outputs unsanitised (only for notebooks you ran yourself)."""
    from nbconvert import HTMLExporter
    profile_path(profile)              # a plain name (ProfileError otherwise): the site stays inside artifacts/
    out = Path(out or ARTIFACTS_ROOT / profile / "report")
    nbs = notebooks(profile)
    if not nbs:
        raise FileNotFoundError(f"no executed notebooks for profile {profile!r} in {notebook_dir(profile)} "
                                f"(run `make reproduce PROFILE={profile}` first)")
    meta = {p: _title_and_blurb(p) for p in nbs}
    pages = [(f"{p.stem}.html", meta[p][0]) for p in nbs]
    exporter = HTMLExporter(template_name="lab")
    exporter.exclude_input_prompt = True
    exporter.exclude_output_prompt = True
    if not trust_html:
        exporter.sanitize_html = True                      # text/html, markdown, JavaScript outputs and cells
        exporter.filters = {**exporter.filters, "clean_html": sanitize_html}
    write = write_text                       # atomic, and with the mode a plain open gives (a static server reads it)
    for i, p in enumerate(nbs):
        body, _ = exporter.from_filename(str(p))
        nav = _nav(pages, i)
        # the exported page is a full document: the site's navigation goes first and last in its body
        start = body.index(">", body.index("<body")) + 1
        end = body.rindex("</body>")
        write(out / pages[i][0], body[:start] + nav + body[start:end] + nav + body[end:])
    toc = ['<h2 id="contents">The notebooks</h2><ol class="toc">']
    for (fname, title), p in zip(pages, nbs):
        toc.append(f'<li><a href="{_href(fname)}">{html.escape(title)}</a><br><span class="blurb">'
                   f'{_markdown_inline(meta[p][1])}</span></li>')
    toc.append("</ol>")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    front = "\n".join(toc) + _local_links(_markdown(readme), ROOT / "README.md", "index.html", out)
    write(out / "index.html", _page("Research compendium", front, _nav(pages, None)))
    for md in sorted((ROOT / "docs").glob("*.md")):        # the pages the README links: rendered, their links kept
        page = f"docs/{md.stem}.html"
        body = _local_links(_markdown(md.read_text(encoding="utf-8")), md, page, out)
        write(out / page, _page(_title(md), body, _nav(pages, None, depth=1)))
    # figures: the index and the PNGs it links
    figs_src = figures_dir(profile, ROOT)
    if figs_src.exists():
        dest = out / profile
        dest.mkdir(parents=True, exist_ok=True)
        for png in figs_src.glob("*.png"):
            shutil.copy2(png, dest / png.name)
    index_md = figures_index(profile, ROOT)
    fig_body = _markdown(index_md.read_text(encoding="utf-8")) if index_md.exists() else "<p>No figure index yet (make reproduce NB=07).</p>"
    if figs_src.exists():
        fig_body += "".join(
            f'<h3 id="{html.escape(png.stem, quote=True)}">{html.escape(png.stem)}</h3>'
            f'<img src="{_href(profile)}/{_href(png.name)}" alt="{html.escape(png.stem, quote=True)}">'
            for png in sorted(figs_src.glob("*.png")))
    write(out / "figures.html", _page("Figures", fig_body, _nav(pages, None)))
    return out / "index.html"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lib.compendium.report", description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default="embedded")
    ap.add_argument("--out", help="output folder (default artifacts/<profile>/report)")
    ap.add_argument("--trust-html", action="store_true",
                    help="render the notebooks' HTML and JavaScript outputs unsanitised (notebooks you ran yourself)")
    a = ap.parse_args(argv)
    try:
        index = build(a.profile, Path(a.out) if a.out else None, trust_html=a.trust_html)
    except ProfileError as e:
        return cli_error(e)
    bad = broken_links(index.parent)
    print(f"report: {index} ({len(list(index.parent.rglob('*.html')))} pages)")
    for b in bad:
        print(f"warning: a link leads nowhere in the site: {b}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
