"""The report's charts, drawn by pygal as inline SVG. Each chart comes with its numbers
as rows, which the page shows as a table: the chart is for the eye, the table for a
screen reader and for anyone who wants the figures."""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from xml.etree import ElementTree as ET

import pygal
from pygal.style import Style
from pygal.util import text_len

SVG_NS = "http://www.w3.org/2000/svg"
ET.register_namespace("", SVG_NS)
ET.register_namespace("xlink", "http://www.w3.org/1999/xlink")

# The page's colours for each decision in its mode (report.css), so a bar is the colour
# of its word: the charts kept their own, the light page's WARN 1.9:1 on white and the
# dark page's FAIL 2.1:1. The fallbacks are the light page's.
COLOURS = {
    "PASS": "var(--pass, #2e7d32)",
    "WARN": "var(--warn, #a15c00)",
    "FAIL": "var(--fail, #c62828)",
    "ERROR": "var(--error, #6a1b9a)",
}
STYLE = Style(
    background="transparent",
    plot_background="transparent",
    # Solid: pygal's 70 % let the page through, a colour of 3.5:1 a bar of 2.3:1.
    opacity="1",
    # The page's own colours, which follow its dark mode: pygal's near-black labels and
    # axes were all but invisible on the dark page. Inline SVG takes the page's CSS
    # variables; the fallbacks are pygal's own.
    foreground="var(--fg, rgba(0, 0, 0, .87))",
    foreground_strong="var(--fg, rgba(0, 0, 0, 1))",
    foreground_subtle="var(--muted, rgba(0, 0, 0, .54))",
    font_family="system-ui, -apple-system, 'Segoe UI', sans-serif",
    colors=("#1565c0", "#2e7d32", "#ef8f00", "#c62828", "#6a1b9a", "#00838f"),
    title_font_size=18,
    label_font_size=13,
    major_label_font_size=13,
    legend_font_size=14,
    value_font_size=12,
)


@dataclass
class Chart:
    title: str
    svg: str
    columns: list[str]
    rows: list[list] = field(default_factory=list)
    # Said instead of a chart of nothing but zeros, whose scale pygal makes up ("$1.0000").
    empty: str = ""
    # Said under a chart that shows some of its rows only (BARS_MOST).
    more: str = ""


def _nothing(title: str, empty: str | None, drawn: bool) -> Chart | None:
    """A chart with nothing to draw (no rows, or all zeros on a scale pygal would make up)
    as ``empty``'s sentence, when it gives one."""
    return None if drawn or empty is None else Chart(title, "", [], [], empty)


def _name(el: ET.Element) -> str:
    return el.tag.rsplit("}", 1)[-1] if isinstance(el.tag, str) else ""


# Marks in the page's background colour over a decision's own, in its bars and its legend
# swatch alike: by colour alone, the light page's green, orange and red were one olive to
# a reader without red-green vision (#756b38, #827301, #817420). PASS stays plain.
TEXTURES: dict[str, tuple[int, list[tuple[str, dict[str, str]]]]] = {
    "WARN": (45, [("rect", {"width": "2", "height": "6"})]),  # stripes
    "FAIL": (
        45,
        [("rect", {"width": "2", "height": "6"}), ("rect", {"width": "6", "height": "2"})],
    ),
    "ERROR": (0, [("circle", {"cx": "3", "cy": "3", "r": "1.5"})]),  # dots
}


def _textured(tree: ET.Element, decisions: list[str]) -> None:
    """Each series' bars and legend swatch filled with its decision's texture, if any."""
    defs = ET.Element(f"{{{SVG_NS}}}defs")
    tree.insert(0, defs)
    series = [g for g in tree.iter() if (g.get("class") or "").startswith("series ")]
    legends = {g.get("id"): g for g in tree.iter() if _name(g) == "g" and g.get("id")}
    for i, d in enumerate(decisions):
        if d not in TEXTURES:
            continue
        angle, marks = TEXTURES[d]
        pid = f"{tree.get('id')}-{d}"
        pattern = ET.SubElement(
            defs,
            f"{{{SVG_NS}}}pattern",
            id=pid,
            width="6",
            height="6",
            patternUnits="userSpaceOnUse",
            patternTransform=f"rotate({angle})",
        )
        ET.SubElement(
            pattern, f"{{{SVG_NS}}}rect", width="6", height="6", style=f"fill:{COLOURS[d]}"
        )
        for tag, attrs in marks:
            ET.SubElement(pattern, f"{{{SVG_NS}}}{tag}", attrs, style="fill:var(--bg, #fff)")
        legend = legends.get(f"activate-serie-{i}")
        swatches = [] if legend is None else [r for r in legend if _name(r) == "rect"]
        bars = [r for r in series[i].iter() if _name(r) == "rect"] if i < len(series) else []
        for rect in bars + swatches:
            rect.set("style", f"fill:url(#{pid})")


def _svg(
    chart: pygal.graph.graph.Graph, tips: list[list[str]], decisions: list[str] | None = None
) -> str:
    """The chart as inline SVG; ``tips``, per series and bar in the order they were added,
    the words a mouse resting on that bar is shown; ``decisions``, the series' decisions,
    each textured as :data:`TEXTURES` says."""
    tree = chart.render_tree()
    for parent in tree.iter():
        for child in list(parent):
            # pygal always adds a script with its tooltip config; the page runs no script
            # (its Content-Security-Policy forbids them), so the chart is the SVG alone.
            # Its <title>s are "Pygal" for the whole chart and an axis label's position
            # ("0.1666666667") for each guide line, what a resting mouse was shown; its
            # <desc>s are that script's data (a bar's value, its centre to 13 places).
            if _name(child) in ("script", "title", "desc"):
                parent.remove(child)
    # The plot's series come first; pygal repeats them, barless, for its overlays.
    series = [g for g in tree.iter() if (g.get("class") or "").startswith("series ")]
    bars = [
        [bar for bar in serie.iter() if _name(bar) == "g" and bar.get("class") == "bar"]
        for serie in series[: len(tips)]
    ]
    if [len(b) for b in bars] == [len(t) for t in tips]:  # else no tooltip beats a wrong one
        for serie, words in zip(bars, tips, strict=True):
            for bar, said in zip(serie, words, strict=True):
                ET.SubElement(bar, f"{{{SVG_NS}}}title").text = said
    if decisions:
        _textured(tree, decisions)
    svg = ET.tostring(tree, encoding="unicode")
    return svg.replace("<svg ", '<svg role="img" aria-hidden="true" focusable="false" ', 1)


# Units across a chart. The page scales it to its column but never under 520 px
# (report.css's `figure svg`, the one place that number lives), where the smallest
# words (13 units) are still 12 pixels: drawn 800 wide, a phone's 356 pixels made them
# 6. Narrower than the screen, it scrolls in its own box.
WIDTH = 560
# pygal cuts no label of a horizontal chart (its truncate_label is the x axis's): a gate
# id of 117 characters took the whole width, the bars pushed out of the picture. The
# chart's table names each in full.
LABEL_MOST = 36


# Hangul's syllable types, as UAX 29 pairs them into one letter (GB6-GB8): a leading
# consonant (L) before L, a vowel (V) or a syllable (LV, LVT); LV or V before V or a
# trailing consonant (T); LVT or T before T.
_HANGUL_JOINED = {
    *(("L", x) for x in ("L", "V", "LV", "LVT")),
    *((x, y) for x in ("LV", "V") for y in ("V", "T")),
    ("LVT", "T"),
    ("T", "T"),
}


def _hangul(ch: str) -> str:
    c = ord(ch)
    if 0x1100 <= c <= 0x115F or 0xA960 <= c <= 0xA97C:
        return "L"
    if 0x1160 <= c <= 0x11A7 or 0xD7B0 <= c <= 0xD7C6:
        return "V"
    if 0x11A8 <= c <= 0x11FF or 0xD7CB <= c <= 0xD7FB:
        return "T"
    if 0xAC00 <= c <= 0xD7A3:
        return "LV" if (c - 0xAC00) % 28 == 0 else "LVT"
    return ""


def _joined(name: str, i: int) -> bool:
    """Whether ``name[i]`` belongs to the letter before it: a combining mark, a
    variation selector, an emoji's skin tone or tag, either side of a zero-width joiner,
    a flag's second half, a consonant after a virama. Unicode's grapheme rules (UAX 29)
    cut short, enough for a name's end without a segmentation library."""
    c, before = ord(name[i]), name[i - 1]
    if (_hangul(before), _hangul(name[i])) in _HANGUL_JOINED:
        return True  # a syllable written as jamo, or a precomposed one with a final added
    if unicodedata.category(name[i]) in ("Mn", "Me", "Mc") or before == "\u200d":
        return True
    if unicodedata.combining(before) == 9 and unicodedata.category(name[i]) == "Lo":
        return True  # a consonant after a virama: one conjunct ("क्ष"), since Unicode 15.1
    if c == 0x200D or 0xFE00 <= c <= 0xFE0F or 0x1F3FB <= c <= 0x1F3FF or 0xE0020 <= c <= 0xE007F:
        return True
    flags = 0  # regional indicators pair up from the start of their run
    while i - flags > 0 and 0x1F1E6 <= ord(name[i - flags - 1]) <= 0x1F1FF:
        flags += 1
    return 0x1F1E6 <= c <= 0x1F1FF and flags % 2 == 1


def _label(name: str) -> str:
    """A bar's name cut in the middle, keeping its lens and its end: "lens/gate-…-end".
    Cut between letters as a person sees them, not inside one: a cut by code point left
    an "é" as "e" and a lone accent, a family emoji as its first person."""
    if len(name) <= LABEL_MOST:
        return name
    head = (LABEL_MOST - 1) * 2 // 3
    tail = len(name) - (LABEL_MOST - 1 - head)
    while head > 0 and _joined(name, head):
        head -= 1
    while tail < len(name) and _joined(name, tail):
        tail += 1
    return name[:head] + "…" + name[tail:]


# Bars a chart shows at most: 200 gates made "Decisions per gate" 6,890 units tall (some
# 9,300 px on a laptop), scrolled past to reach anything under it. The table under the
# chart keeps every row.
BARS_MOST = 25


def _most(keys: list[str], weight, what: str) -> tuple[list[str], str]:
    """The BARS_MOST keys of most weight, in their own order, and the words that say so."""
    if len(keys) <= BARS_MOST:
        return keys, ""
    kept = set(sorted(keys, key=weight, reverse=True)[:BARS_MOST])
    return [k for k in keys if k in kept], (
        f"The {BARS_MOST} of {len(keys)} with {what}; the numbers below list all {len(keys)}."
    )


# Units between two figures of a scale beyond their own width, and what pygal's margins
# and spacing take of a horizontal chart's width besides its bars' names.
FIGURE_GAP = 16
MARGINS = 60


def _figures(
    top: float, fmt: Callable[[float], str], names: list[str], unit: float = 1
) -> list[float]:
    """The value scale of a horizontal chart: steps of 1, 2, 2.5 or 5 times a power of
    ten, each a whole number of ``unit`` (what ``fmt`` shows: 1 a count, 0.01 a rate,
    0.0001 a cost), the finest whose figures fit side by side in the width its bars' names
    leave. pygal's own scale put up to 16 figures there whatever the width: a real KB's
    night drew "0 200400600…3000", each figure running into the next, and its FAIL rates
    "0%10%20%…100%"."""
    if top <= 0:
        return [0]
    names_units = max((text_len(len(n), STYLE.label_font_size) for n in names), default=0)
    room = WIDTH - names_units - MARGINS
    power = 10.0 ** (math.floor(math.log10(top)) - 2)
    while True:
        for times in (1, 2, 2.5, 5):
            step = times * power
            if abs(step / unit - round(step / unit)) > 1e-6 or step < unit:
                continue  # 2.5 % shown as "2%", a quarter of a pair
            ticks = [k * step for k in range(int(top / step + 1e-9) + 1)]
            widest = max(text_len(len(fmt(t)), STYLE.major_label_font_size) for t in ticks)
            if len(ticks) >= 2 and len(ticks) * (widest + FIGURE_GAP) <= room:
                return ticks
            if len(ticks) < 2:
                return [0, top]  # nothing finer fits: the ends alone
        power *= 10


def _config(rows: int, **kw) -> dict:
    # No pygal title: the page's <figcaption> names the chart once, in HTML.
    return {
        "style": STYLE,
        "js": [],
        "disable_xml_declaration": True,
        "width": WIDTH,
        "height": max(220, 90 + 34 * rows),
        "print_values": False,
        "legend_at_bottom": True,
        "truncate_label": 48,
        "truncate_legend": 30,
        **kw,
    }


def decisions_by(
    title: str, label: str, counts: dict[str, dict[str, int]], empty: str | None = None
) -> Chart | None:
    """Stacked horizontal bars: PASS, WARN, FAIL, ERROR per lens or gate."""
    if not counts:
        return _nothing(title, empty, drawn=False)
    shown, more = _most(
        list(counts),
        lambda k: tuple(counts[k].get(d, 0) for d in ("FAIL", "ERROR", "WARN")),
        "the most FAIL, then ERROR, then WARN",
    )
    keys = shown[::-1]  # pygal draws the first bar at the bottom; read top-down
    decisions = [
        d for d in ("PASS", "WARN", "FAIL", "ERROR") if any(d in c for c in counts.values())
    ]
    style = Style(**{**STYLE.__dict__, "colors": tuple(COLOURS[d] for d in decisions)})
    names = [_label(k) for k in keys]
    fmt = "{:,.0f}".format
    top = max(sum(counts[k].values()) for k in keys)
    chart = pygal.HorizontalStackedBar(
        **_config(len(keys), style=style, value_formatter=fmt, y_labels=_figures(top, fmt, names))
    )
    chart.x_labels = names
    for d in decisions:
        chart.add(d, [counts[k].get(d, 0) for k in keys])
    tips = [[f"{k}: {d} {counts[k].get(d, 0)}" for k in keys] for d in decisions]
    rows = [[k, *(counts[k].get(d, 0) for d in decisions)] for k in counts]
    return Chart(title, _svg(chart, tips, decisions), [label, *decisions], rows, more=more)


def dollars(v: float | None) -> str:
    """A cost as the whole page gives one: "$0.0123"."""
    return f"${v or 0:,.4f}"


def bars(
    title: str,
    label: str,
    value: str,
    items: list[tuple[str, float]],
    *,
    percent: bool = False,
    money: bool = False,
    empty: str | None = None,
) -> Chart | None:
    # A rate's scale is 0 to 100 % whatever its figures: all at 0 % is a chart still.
    if said := _nothing(title, empty, drawn=bool(items) and (percent or any(v for _, v in items))):
        return said
    if not items:
        return None
    if percent or money:
        fmt = (lambda v: f"{v:.0%}") if percent else dollars
    else:
        fmt = lambda v: f"{v:,.4f}".rstrip("0").rstrip(".")  # noqa: E731
    extra = {"range": (0, 1)} if percent else {}  # a rate's scale is 0 to 100 %, always
    values = dict(items)
    keys, more = _most([k for k, _ in items], values.get, "the highest")
    names = [_label(k) for k in keys][::-1]
    top = 1.0 if percent else max(values[k] for k in keys)
    chart = pygal.HorizontalBar(
        **_config(
            len(keys),
            show_legend=False,
            value_formatter=fmt,
            y_labels=_figures(top, fmt, names, 0.01 if percent else 0.0001),
            **extra,
        )
    )
    chart.x_labels = names
    chart.add(value, [values[k] for k in keys][::-1])
    tips = [[f"{k}: {fmt(values[k])}" for k in keys][::-1]]
    rows = [[k, fmt(v)] for k, v in items]
    return Chart(title, _svg(chart, tips), [label, value], rows, more=more)


def columns(
    title: str, label: str, value: str, items: list[tuple[str, float]], empty: str | None = None
) -> Chart | None:
    """Vertical bars over time (cost per night)."""
    if said := _nothing(title, empty, drawn=any(v for _, v in items)):
        return said
    if not items:
        return None
    chart = pygal.Bar(**_config(6, show_legend=False, value_formatter=dollars, x_label_rotation=35))
    chart.x_labels = [k for k, _ in items]
    chart.add(value, [v for _, v in items])
    tips = [[f"{k}: {dollars(v)}" for k, v in items]]
    return Chart(title, _svg(chart, tips), [label, value], [[k, dollars(v)] for k, v in items])
