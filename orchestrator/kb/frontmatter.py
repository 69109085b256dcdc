"""A strict fast path for the frontmatter most notes carry.

Parsing YAML costs ~120 µs a note even with libyaml, which alone would spend the
selector's whole budget on a 10,000-note KB (CONTRACT §13). Most frontmatter is a flat
mapping of plain words, simple quoted strings and one-line flow lists, whose YAML
meaning is unambiguous. This module parses exactly that subset and returns None for
anything else, so the caller falls back to a real YAML parser. It must never return
a value YAML would not: tests check it against ``yaml.safe_load``.
"""

from __future__ import annotations

import re

_KEY = r"[A-Za-z_][A-Za-z0-9_-]*"
_LINE = re.compile(rf"^({_KEY}):(?:[ ]+(.*))?$")
# A plain scalar YAML 1.1 resolves to a string: starts with a letter or '/', no
# indicators that change meaning, and not one of the implicit bool/null words.
# U+2028/U+2029 are line breaks to YAML: left to it, which says so (U+0085 is outside already).
_TEXT = "\\x20-\\x7e\\u00a0-\\u2027\\u202a-\\ud7ff\\ue000-\\ufefe\\uff00-\\ufffd"
_PLAIN = re.compile(rf"^[A-Za-z/][{_TEXT}]*$")
_RESERVED = frozenset(["y", "n", "yes", "no", "true", "false", "on", "off", "null"])
_SQUOTED = re.compile(rf"^'([{_TEXT}]*)'$")
_DQUOTED = re.compile(rf'^"([{_TEXT}]*)"$')
_COMMENT = re.compile(rf"^#[{_TEXT}]*$")
_FLOW_ITEM = re.compile(r"^[A-Za-z/][A-Za-z0-9_./-]*$")


def _scalar(value: str) -> tuple[bool, str]:
    m = _SQUOTED.match(value)
    if m and "'" not in m.group(1):
        return True, m.group(1)
    m = _DQUOTED.match(value)
    if m and '"' not in m.group(1) and "\\" not in m.group(1):
        return True, m.group(1)
    if (
        _PLAIN.match(value)
        and value.lower() not in _RESERVED
        and ": " not in value
        and " #" not in value
        and not value.endswith(":")
        and value == value.rstrip()
    ):
        return True, value
    return False, ""


def parse_simple(block: str) -> dict | None:
    """The mapping for a simple frontmatter block, or None if YAML is needed."""
    out: dict = {}
    for raw in block.split("\n"):
        line = raw[:-1] if raw.endswith("\r") else raw
        if line == "":
            continue
        if line.startswith("#"):
            if _COMMENT.match(line):
                continue
            return None
        m = _LINE.match(line)
        if m is None:
            return None
        key, value = m.group(1), m.group(2)
        if key in out or key.lower() in _RESERVED or key == "<<":
            return None
        if value is None or value == "":
            return None  # null or a nested block: let YAML decide
        if value.startswith("["):
            if not value.endswith("]"):
                return None
            inner = value[1:-1].strip()
            items = [i.strip() for i in inner.split(",")] if inner else []
            for item in items:
                if not _FLOW_ITEM.match(item) or item.lower() in _RESERVED:
                    return None
            out[key] = items
            continue
        ok, text = _scalar(value)
        if not ok:
            return None
        out[key] = text
    return out
