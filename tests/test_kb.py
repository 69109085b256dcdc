"""Notes and regions (CONTRACT §1), and the fast frontmatter path checked against YAML."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.kb.atomicfile import atomic_write, mode_of
from orchestrator.kb.frontmatter import parse_simple
from orchestrator.kb.notes import KB, KBError, NoteParseError, parse_note_text, split_frontmatter


def test_regions_from_frontmatter():
    p = parse_note_text("---\ntitle: T\ndescription: D\ntags: [b, a]\n---\n# Heading\n\nBody.\n")
    r = p.regions()
    assert r["title"] == "T" and r["description"] == "D"
    assert r["frontmatter"] == '{"description":"D","tags":["b","a"],"title":"T"}'
    assert r["body"] == "# Heading\n\nBody.\n"


def test_title_falls_back_to_first_heading_and_description_to_empty():
    r = parse_note_text("Intro\n\n# The heading\n\n## Sub\n").regions()
    assert r["title"] == "The heading" and r["description"] == "" and r["frontmatter"] == "{}"


def test_split_keeps_body_exact():
    assert split_frontmatter("---\na: 1\n---\n\nbody\n") == ("a: 1\n", "\nbody\n")
    assert split_frontmatter("---\r\na: 1\r\n---\r\nbody") == ("a: 1\r\n", "body")
    assert split_frontmatter("no frontmatter\n---\n") == (None, "no frontmatter\n---\n")
    with pytest.raises(NoteParseError, match="not closed"):
        split_frontmatter("---\na: 1\n")


def test_broken_and_non_mapping_frontmatter():
    with pytest.raises(NoteParseError, match="broken YAML"):
        parse_note_text("---\ntitle: [x\n---\n")
    with pytest.raises(NoteParseError, match="not a mapping"):
        parse_note_text("---\n- a\n- b\n---\n")


def test_rel_refuses_paths_outside_the_root(tmp_path):
    (tmp_path / "root" / "kb" / "notes").mkdir(parents=True)
    kb = KB.open(tmp_path / "root")
    assert kb.rel(tmp_path / "root" / "kb" / "notes") == "kb/notes"
    for bad in (tmp_path, "../x.md", "/etc/passwd"):
        with pytest.raises(KBError, match="outside the KB root"):
            kb.rel(bad)
    with pytest.raises(KBError):
        kb.check_rel("kb/../../x")


WORDS = st.sampled_from(
    [
        "note",
        "yes",
        "No",
        "on",
        "null",
        "True",
        "kb/types/note.md",
        "a b",
        "x: y",
        "it's",
        "C#",
        "a #b",
        "12",
        "1.5",
        "2024-01-01",
        ".inf",
        "~",
        "",
        "é",
        "-x",
        "[a]",
        "{a}",
        "&a",
        "*a",
        "!x",
        "|",
        ">",
        "'q'",
        '"dq"',
        "a,b",
        "trailing ",
        "%x",
        "@x",
        "`x`",
        "x:",
        "ü ber",
    ]
)
KEYS = st.sampled_from(
    ["title", "description", "type", "status", "tags", "traits", "on", "yes", "x-y"]
)


@st.composite
def blocks(draw):
    lines = []
    for _ in range(draw(st.integers(0, 6))):
        key = draw(KEYS)
        kind = draw(
            st.sampled_from(["plain", "squote", "dquote", "list", "blank", "comment", "indent"])
        )
        w = draw(WORDS)
        if kind == "plain":
            lines.append(f"{key}: {w}")
        elif kind == "squote":
            lines.append(f"{key}: '{w}'")
        elif kind == "dquote":
            lines.append(f'{key}: "{w}"')
        elif kind == "list":
            items = draw(st.lists(WORDS, max_size=3))
            lines.append(f"{key}: [{', '.join(items)}]")
        elif kind == "blank":
            lines.append("")
        elif kind == "comment":
            lines.append(f"# {w}")
        else:
            lines.append(f"  {w}")
    return "\n".join(lines) + "\n"


@settings(max_examples=400, deadline=None)
@given(blocks())
def test_fast_path_agrees_with_yaml(block):
    fast = parse_simple(block)
    if fast is None:
        return
    assert fast == (yaml.safe_load(block) or {})


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_fast_path_never_disagrees_on_arbitrary_text(text):
    fast = parse_simple(text)
    if fast is None:
        return
    assert fast == (yaml.safe_load(text) or {})


@pytest.mark.parametrize("sep", ["\u2028", "\u2029"])
def test_fast_path_leaves_yamls_line_separators_to_yaml(sep):
    """YAML breaks a line at U+2028/U+2029: taken by the fast path, a pasted one made a note
    readable or 'broken YAML' depending on other, unrelated keys."""
    block = f"title: Brood\ndescription: eggs, larvae{sep}and pupae\n"
    assert parse_simple(block) is None
    with pytest.raises(yaml.YAMLError):
        yaml.safe_load(block)


def test_fast_path_takes_the_common_shape():
    block = "title: Varroa is the main cause\ndescription: 'A mite, not the cold, kills colonies.'\ntype: kb/types/note.md\nstatus: current\ntags: [pests, winter]\n"
    assert parse_simple(block) == yaml.safe_load(block)


def test_atomic_write_keeps_a_notes_mode_and_leaves_no_temp_file(tmp_path):
    note = tmp_path / "note.md"
    note.write_text("old\n")
    note.chmod(0o640)
    atomic_write(note, "new\n", durable=True, mode=mode_of(note))
    assert note.read_text() == "new\n" and note.stat().st_mode & 0o777 == 0o640
    rendering = tmp_path / "sub" / "MANIFEST.json"
    atomic_write(rendering, b"{}")
    assert rendering.read_bytes() == b"{}" and rendering.stat().st_mode & 0o777 == 0o600
    with pytest.raises(TypeError):
        atomic_write(note, object())  # type: ignore[arg-type]
    assert note.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["MANIFEST.json", "note.md", "sub"]


def test_atomic_write_replaces_a_file_whose_name_is_as_long_as_the_system_allows(tmp_path):
    # 255 bytes each; the second's 200-byte head for the temp name cuts an "é" in two.
    for name in ("n" * 252 + ".md", "a" + "é" * 125 + "b.md"):
        note = tmp_path / name
        note.write_text("old\n")
        atomic_write(note, "new\n", durable=True)
        assert note.read_text() == "new\n"
    assert len(list(tmp_path.iterdir())) == 2


def test_frontmatter_delimiters_may_carry_trailing_blanks():
    """An editor's stray space after the opening '---' made the whole block body text: the
    note lost its type, status and description without a word."""
    from orchestrator.kb.notes import parse_note_text

    for text in ("--- \ntitle: A\n---\nBody.\n", "---\ntitle: A\n---  \nBody.\n"):
        parsed = parse_note_text(text)
        assert parsed.meta == {"title": "A"}, text


def test_the_title_is_the_first_h1_outside_fenced_code():
    """A shell comment in a code block before the real H1 was the note's title: editing the
    real title left title-watching gates fresh, editing the comment made them stale."""
    from orchestrator.kb.notes import _first_heading

    body = "```sh\n# install deps\n```\n\n~~~\n# not this\n~~~\n# Swarms start when congested #\n"
    assert _first_heading(body) == "Swarms start when congested"
    assert _first_heading("  # Indented title\n") == "Indented title"
    assert _first_heading("# C# in a title\n") == "C# in a title"
    # A closing fence has no info string; a backtick fence's info string has no backtick.
    assert _first_heading("```python\n# x\n```python\n# y\n```\n# Title\n") == "Title"
    assert _first_heading("``` a ` b\n# Title\n") == "Title"
    assert _first_heading("~~~~\n# a\n~~~\n# b\n~~~~\n# Title\n") == "Title"
    assert _first_heading("#\tTabbed title #\n") == "Tabbed title"
    assert _first_heading("#5 bolts\n####### seven\n# Title\n") == "Title"


def test_a_fix_write_killed_midway_leaves_no_temp_file_once_written_again(tmp_path):
    """SIGKILL (an OOM kill, a power cut) during a fix's durable write left its temp file
    in the person's notes folder for good, the fixed text in it, for `git add -A` to take.
    The write that follows (the fix is still due) clears it; a live writer's is kept."""
    import os
    import subprocess
    import sys

    from orchestrator.cycles.fixes import replace_note

    note = tmp_path / "notes" / "alpha.md"
    note.parent.mkdir()
    note.write_text("# Alpha\n\nAlpha body.\n")
    killed = (
        "import os, pathlib\n"
        "from orchestrator.cycles import fixes\n"
        "os.fsync = lambda fd: os.kill(os.getpid(), 9)  # the kill lands mid-write\n"
        f"fixes.replace_note(pathlib.Path({str(note)!r}), b'FIXED')\n"
    )
    assert subprocess.run([sys.executable, "-c", killed], check=False).returncode == -9
    left = [p.name for p in note.parent.iterdir() if p.name.endswith(".tmp")]
    assert len(left) == 1, left
    live = note.parent / f".alpha.md.{os.getpid()}-999.tmp"  # a writer still at work
    live.write_text("")
    odd = note.parent / ".alpha.md.99999999999999999999-0.tmp"  # no pid: left alone
    odd.write_text("")
    replace_note(note, b"# Alpha\n\nAlpha body, fixed.\n")
    assert sorted(p.name for p in note.parent.iterdir()) == sorted(
        ["alpha.md", live.name, odd.name]
    )
    assert note.read_bytes() == b"# Alpha\n\nAlpha body, fixed.\n"


def test_a_yaml_set_in_frontmatter_is_one_value_however_it_is_ordered():
    # CONTRACT §1: re-formatting the YAML without changing a value changes nothing. A `!!set`
    # came out in hash order: reordered in the file, the note read as frontmatter-changed.
    items = [f"w{i}" for i in range(12)]
    a = parse_note_text("---\nt: !!set {" + ", ".join(items) + "}\n---\n").regions()
    b = parse_note_text("---\nt: !!set {" + ", ".join(reversed(items)) + "}\n---\n").regions()
    assert a["frontmatter"] == b["frontmatter"]
    assert a["frontmatter"] == '{"t":[' + ",".join(f'"{w}"' for w in sorted(items)) + "]}"
