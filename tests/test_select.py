"""CONTRACT §3 freshness rules and every `reviewq select` option, through the CLI."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from orchestrator.kb import notecache
from orchestrator.state.store import Store


@pytest.fixture
def small(kb):
    kb.gate("frontmatter/title-check", ["title"])
    kb.gate("frontmatter/desc-check", ["description"])
    kb.gate("frontmatter/meta-check", ["frontmatter"])
    kb.gate("prose/body-check", ["body"])
    kb.gate("prose/align", ["title", "body"], "rewrite(0.5)")
    kb.note("alpha", body="# Alpha\n\n" + "".join(f"line {i}\n" for i in range(10)))
    kb.note("beta", body="Beta body.\n", status="current")
    return kb


ALL = [
    "frontmatter/title-check",
    "frontmatter/desc-check",
    "frontmatter/meta-check",
    "prose/body-check",
    "prose/align",
]


def accept_all(kb, notes=("kb/notes/alpha.md", "kb/notes/beta.md"), partition="m1"):
    kb.accept(partition, [(n, g) for n in notes for g in ALL])


def reasons(result) -> dict[tuple[str, str], str]:
    return {(t["note_path"], t["gate_id"]): t["reason"] for t in result.json()["targets"]}


def test_everything_missing_without_reviews(small, run_cli):
    res = run_cli("select", "--all-gates", "--model", "m1", "--json")
    assert res.exit_code == 0
    data = res.json()
    assert data["model_partition"] == "m1"
    assert {t["reason"] for t in data["targets"]} == {"missing-review"}
    assert len(data["targets"]) == 10
    assert data["counts"] == {
        "missing-review": 10,
        "gate-changed": 0,
        "note-changed": 0,
        "fresh": 0,
    }
    t = data["targets"][0]
    assert set(t) == {"note_path", "gate_id", "gate_path", "lens", "reason"}
    assert t["gate_path"].startswith("kb/instructions/review-gates/")


def test_fresh_pairs_are_counted_not_listed(small, run_cli):
    accept_all(small)
    data = run_cli("select", "--all-gates", "--model", "m1", "--json").json()
    assert data["targets"] == []
    assert data["counts"]["fresh"] == 10


def test_partitions_are_separate(small, run_cli):
    accept_all(small, partition="m1")
    data = run_cli("select", "--all-gates", "--model", "m2", "--json").json()
    assert data["counts"]["missing-review"] == 10


def test_a_partition_with_no_review_among_others_is_warned_about(small, run_cli):
    """A misspelt --model read as 'nothing reviewed', and that JSON piped to create-jobs
    paid for every pair again under the typo."""
    assert run_cli("select", "--all-gates", "--model", "m1").stderr == ""  # a first review
    accept_all(small, partition="m1")
    res = run_cli("select", "--all-gates", "--model", "m-1", "--json")
    assert res.exit_code == 0 and res.json()["counts"]["missing-review"] == 10
    assert res.stderr == (
        "warning: --model m-1: no review recorded in this partition (known: m1); "
        "every pair is missing-review\n"
    )
    assert run_cli("select", "--all-gates", "--model", "m1", "--json").stderr == ""


def test_enqueue_in_a_partition_with_no_review_among_others_is_warned_about(small, run_cli):
    """A profile's partition misspelt in reviewq.toml, or its model changed, reads as
    nothing reviewed: enqueue queued the whole KB again where select --model warns."""
    small.write("reviewq.toml", '[reviewers.r]\nkind = "offline"\npartition = "m-1"\n')
    first = run_cli("enqueue", "--all-gates", "--reviewer", "r")
    assert first.exit_code == 0 and "warning" not in first.stderr  # a first review
    accept_all(small, partition="m1")
    res = run_cli("enqueue", "--all-gates", "--reviewer", "r")
    assert res.exit_code == 0, res.stderr
    assert (
        "warning: reviewer r: no review recorded in its partition m-1 (known: m1); "
        "every pair is missing-review\n"
    ) in res.stderr


def test_partitionless_mode_reports_only_uncovered_pairs(small, run_cli):
    small.accept("m1", [("kb/notes/alpha.md", "prose/body-check")])
    # A change that would be note-changed in m1 is not judged without a partition.
    small.write("kb/notes/alpha.md", small.read("kb/notes/alpha.md") + "more\n")
    data = run_cli("select", "--all-gates", "--json").json()
    assert data["model_partition"] is None
    assert ("kb/notes/alpha.md", "prose/body-check") not in reasons_of(data)
    assert data["counts"] == {"missing-review": 9, "gate-changed": 0, "note-changed": 0, "fresh": 1}


def reasons_of(data):
    return {(t["note_path"], t["gate_id"]): t["reason"] for t in data["targets"]}


def test_gate_change_beats_note_change(small, run_cli):
    accept_all(small)
    small.gate("prose/body-check", ["body"], body="## Failure mode\n\nNew.\n\n## Test\n\nNew.\n")
    small.write("kb/notes/alpha.md", small.read("kb/notes/alpha.md") + "extra\n")
    r = reasons(run_cli("select", "--all-gates", "--model", "m1", "--json"))
    assert r[("kb/notes/alpha.md", "prose/body-check")] == "gate-changed"
    assert r[("kb/notes/beta.md", "prose/body-check")] == "gate-changed"
    assert ("kb/notes/alpha.md", "frontmatter/title-check") not in r  # body-only edit


def test_body_edit_only_stales_body_watchers(small, run_cli):
    accept_all(small)
    small.write(
        "kb/notes/beta.md",
        small.read("kb/notes/beta.md").replace("Beta body.", "Beta body, edited."),
    )
    data = run_cli("select", "--all-gates", "--model", "m1", "--json").json()
    r = reasons_of(data)
    assert r == {
        ("kb/notes/beta.md", "prose/body-check"): "note-changed",
        # rewrite(0.5): one line of one replaced → ratio 1.0 > 0.5
        ("kb/notes/beta.md", "prose/align"): "note-changed",
    }
    target = data["targets"][0]
    assert target["changed_regions"] == ["body"]
    assert target["diff"].startswith("--- a/kb/notes/beta.md\n+++ b/kb/notes/beta.md\n")
    assert "-Beta body.\n+Beta body, edited.\n" in target["diff"]
    assert data["counts"]["fresh"] == 8


@pytest.mark.skipif(shutil.which("patch") is None, reason="patch(1) is not installed")
def test_the_diff_of_a_note_with_no_final_newline_is_one_patch_applies(small, run_cli, tmp_path):
    """difflib glued a last line with no line end to the next line of the diff
    ("-Beta body.+Beta body, edited."), and cut lines at a form feed: no tool took it."""
    import subprocess

    old = small.read("kb/notes/beta.md").replace(
        "Beta body.\n", "Page one\x0cpage two.\nBeta body."
    )
    small.write("kb/notes/beta.md", old)
    accept_all(small)
    new = old.replace("Beta body.", "Beta body, edited.\nAnd more.")
    small.write("kb/notes/beta.md", new)
    data = run_cli("select", "prose/body-check", "--model", "m1", "--json").json()
    diff = data["targets"][0]["diff"]
    assert "-Beta body.\n\\ No newline at end of file\n+Beta body, edited.\n" in diff
    (tmp_path / "beta.md").write_bytes(old.encode())
    subprocess.run(["patch", "--quiet", str(tmp_path / "beta.md")], input=diff.encode(), check=True)
    assert (tmp_path / "beta.md").read_bytes() == new.encode()


def test_rewrite_threshold_and_accumulation(small, run_cli):
    accept_all(small)
    path = "kb/notes/alpha.md"
    original = small.read(path)
    # 2 of 12 body lines changed: ratio well under 0.5 → still fresh for prose/align.
    small.write(path, original.replace("line 1\n", "line one\n").replace("line 2\n", "line two\n"))
    r = reasons(run_cli("select", "prose", "--model", "m1", "--json"))
    assert r == {(path, "prose/body-check"): "note-changed"}
    # More small edits against the same accepted snapshot add up until they cross 0.5.
    text = small.read(path)
    for i in range(3, 9):
        text = text.replace(f"line {i}\n", f"line #{i}\n")
    small.write(path, text)
    data = run_cli("select", "prose/align", "--model", "m1", "--json").json()
    assert reasons_of(data) == {(path, "prose/align"): "note-changed"}
    assert data["targets"][0]["change_ratio"] > 0.5


def test_a_change_exactly_at_the_rewrite_threshold_is_not_over_it(kb, run_cli):
    """3 of 10 lines changed is 0.3, not 0.30000000000000004 > rewrite(0.3): the contract
    says "more than 30 %", and the float made it a needless paid review."""
    kb.gate("prose/rw", ["body"], "rewrite(0.3)")
    body = "".join(f"line {i}\n" for i in range(10))
    path = kb.note("n", body=body)
    kb.accept("m1", [(path, "prose/rw")])
    kb.write(path, kb.read(path).replace("line 0\n", "l0\n").replace("line 1\n", "l1\n"))
    kb.write(path, kb.read(path).replace("line 2\n", "l2\n"))
    data = run_cli("select", "prose/rw", "--model", "m1", "--json").json()
    assert data["targets"] == [] and data["counts"]["fresh"] == 1
    kb.write(path, kb.read(path).replace("line 3\n", "l3\n"))  # 0.4
    data = run_cli("select", "prose/rw", "--model", "m1", "--json").json()
    assert [t["change_ratio"] for t in data["targets"]] == [0.4]


def test_title_change_stales_title_watchers_even_under_rewrite(small, run_cli):
    accept_all(small)
    path = "kb/notes/alpha.md"
    small.write(path, small.read(path).replace("title: Alpha", "title: Alpha renamed"))
    data = run_cli("select", "--all-gates", "--model", "m1", "--json").json()
    r = reasons_of(data)
    assert r == {
        (path, "frontmatter/title-check"): "note-changed",
        (path, "frontmatter/meta-check"): "note-changed",
        (path, "prose/align"): "note-changed",
    }
    assert all(t["changed_regions"] == ["title", "frontmatter"] for t in data["targets"])


def test_title_from_heading_when_frontmatter_has_none(kb, run_cli):
    kb.gate("frontmatter/title-check", ["title"])
    kb.write("kb/notes/n.md", "# First title\n\nbody\n")
    kb.accept("m1", [("kb/notes/n.md", "frontmatter/title-check")])
    kb.write("kb/notes/n.md", "# Second title\n\nbody\n")
    assert reasons(run_cli("select", "--all-gates", "--model", "m1", "--json")) == {
        ("kb/notes/n.md", "frontmatter/title-check"): "note-changed"
    }


def test_yaml_reformatting_changes_nothing(kb, run_cli):
    kb.gate("frontmatter/meta-check", ["frontmatter"])
    kb.write("kb/notes/n.md", "---\ntitle: T\ntags: [a, b]\n---\nbody\n")
    kb.accept("m1", [("kb/notes/n.md", "frontmatter/meta-check")])
    kb.write("kb/notes/n.md", "---\ntags:\n  - a\n  - b\ntitle: 'T'\n---\nbody\n")
    data = run_cli("select", "--all-gates", "--model", "m1", "--json").json()
    assert data["targets"] == [] and data["counts"]["fresh"] == 1


def test_unwatched_region_change_is_fresh(small, run_cli):
    accept_all(small)
    path = "kb/notes/beta.md"
    small.write(path, small.read(path).replace("status: current", "status: draft"))
    r = reasons(run_cli("select", "--all-gates", "--model", "m1", "--json"))
    assert r == {(path, "frontmatter/meta-check"): "note-changed"}


def test_renaming_a_gate_file_keeps_its_reviews(small, run_cli):
    accept_all(small)
    old = small.root / "kb/instructions/review-gates/prose/body-check.md"
    old.rename(old.with_name("renamed.md"))
    data = run_cli("select", "--all-gates", "--model", "m1", "--json").json()
    assert data["targets"] == [] and data["counts"]["fresh"] == 10


def test_snapshot_gone_is_missing_review(small, run_cli):
    accept_all(small)
    small.write("kb/notes/beta.md", small.read("kb/notes/beta.md") + "x\n")
    with Store.open(small.state) as store:
        store.conn.execute("PRAGMA foreign_keys = OFF")
        store.conn.execute("DELETE FROM snapshots WHERE path = 'kb/notes/beta.md'")
    r = reasons(run_cli("select", "--all-gates", "--model", "m1", "--json"))
    assert set(r.values()) == {"missing-review"} and len(r) == 5


def test_reason_filter_keeps_counts(small, run_cli):
    accept_all(small, notes=("kb/notes/alpha.md",))
    small.write("kb/notes/alpha.md", small.read("kb/notes/alpha.md") + "x\n")
    data = run_cli(
        "select", "--all-gates", "--model", "m1", "--reason", "note-changed", "--json"
    ).json()
    assert {t["reason"] for t in data["targets"]} == {"note-changed"}
    assert data["counts"]["missing-review"] == 5


def test_bundle_and_gate_id_selectors(small, run_cli):
    data = run_cli("select", "frontmatter", "prose/body-check", "--json").json()
    assert {t["gate_id"] for t in data["targets"]} == {
        "frontmatter/title-check",
        "frontmatter/desc-check",
        "frontmatter/meta-check",
        "prose/body-check",
    }
    res = run_cli("select", "nonsense")
    assert res.exit_code == 1 and res.stderr.startswith("error: nonsense")
    res = run_cli("select", "--all-gates", "prose")
    assert res.exit_code == 2


def test_nothing_selected_is_refused(small, run_cli):
    res = run_cli("select")
    assert res.exit_code == 1 and "nothing to select" in res.stderr


def test_note_filter_files_and_folders_and_outside_root(small, run_cli, tmp_path):
    small.note("sub/gamma")
    data = run_cli(
        "select", "prose/body-check", "--note", str(small.root / "kb/notes/sub"), "--json"
    ).json()
    assert [t["note_path"] for t in data["targets"]] == ["kb/notes/sub/gamma.md"]
    data = run_cli("select", "prose/body-check", "--note", "kb/notes/beta.md", "--json").json()
    assert [t["note_path"] for t in data["targets"]] == ["kb/notes/beta.md"]
    (tmp_path / "outside.md").write_text("x")
    res = run_cli("select", "prose/body-check", "--note", str(tmp_path / "outside.md"))
    assert res.exit_code == 1 and "outside the KB root" in res.stderr
    res = run_cli("select", "prose/body-check", "--note", "../outside.md")
    assert res.exit_code == 1 and "outside the KB root" in res.stderr


def test_current_filter(small, run_cli):
    data = run_cli("select", "prose/body-check", "--current", "--json").json()
    assert [t["note_path"] for t in data["targets"]] == ["kb/notes/beta.md"]
    assert run_cli("select", "prose/body-check", "--current").stderr == ""  # beta has one


def test_current_on_a_kb_without_status_says_why_it_selects_nothing(kb, run_cli):
    """--current on a KB whose notes keep no status: field selected 0 pairs with no word,
    which read as a KB all reviewed."""
    kb.gate("prose/body-check", ["body"])
    kb.note("alpha", body="Alpha body.\n")
    said = (
        "warning: no note has a status: field, which --current reads (status: current): "
        "nothing is selected\n"
    )
    for args in ((), ("--json",)):
        res = run_cli("select", "prose/body-check", "--current", *args)
        assert res.exit_code == 0, res.stderr
        assert res.stderr == said, res.stderr
    # enqueue (and so sweep) select the same way, and say it the same way.
    res = run_cli("enqueue", "prose/body-check", "--current", "--reviewer", "offline")
    assert res.exit_code == 0, res.stderr
    assert said in res.stderr, res.stderr


def test_current_on_a_kb_whose_notes_say_it_otherwise_says_why_it_selects_nothing(kb, run_cli):
    """N9's case with a status: field that never says `current` as --current reads it
    (`Current`, `active`): 0 pairs and no word, read as a KB all reviewed."""
    kb.gate("prose/body-check", ["body"])
    kb.note("alpha", status="Current")
    kb.note("beta", status="draft")
    res = run_cli("select", "prose/body-check", "--current")
    assert res.stderr == (
        "warning: no note has status: current, which --current reads (their status: fields "
        "say 'Current', 'draft'): nothing is selected\n"
    )
    kb.note("gamma", status="current")
    assert run_cli("select", "prose/body-check", "--current").stderr == ""


def test_type_pairs_are_opt_in(kb, run_cli):
    kb.gate("prose/body-check", ["body"])
    kb.type_spec("definition")
    kb.type_spec("note")
    kb.note("by-name", type="definition")
    kb.note("by-path", type="kb/types/definition.md")
    kb.note("plain", type="note")
    kb.note("untyped")
    kb.note("unknown", type="nonexistent")
    kb.write("kb/notes/sub/types/local.md", "---\nname: local\n---\n# Local type\n")
    kb.write("kb/notes/sub/rel.md", note_text_with_type("./types/local.md"))
    data = run_cli("select", "--all-gates", "--json").json()
    assert {t["gate_id"] for t in data["targets"]} == {"prose/body-check"}
    data = run_cli("select", "type", "--json").json()
    got = {(t["note_path"], t["gate_id"], t["gate_path"]) for t in data["targets"]}
    assert got == {
        ("kb/notes/by-name.md", "type/definition", "kb/types/definition.md"),
        ("kb/notes/by-path.md", "type/definition", "kb/types/definition.md"),
        ("kb/notes/plain.md", "type/note", "kb/types/note.md"),
        ("kb/notes/sub/rel.md", "type/local", "kb/notes/sub/types/local.md"),
    }
    data = run_cli("select", "type/definition", "--json").json()
    assert {t["note_path"] for t in data["targets"]} == {
        "kb/notes/by-name.md",
        "kb/notes/by-path.md",
    }
    assert run_cli("select", "type/nope").exit_code == 1


def test_a_type_spec_in_a_subfolder_of_kb_types_named_by_path_is_reviewed(kb, run_cli):
    """A note naming kb/types/sub/x.md (from the root, or as ../types/sub/x.md) got no
    type pair and no word: the spec was taken for one of the kb/types/*.md scan, which
    does not enter subfolders. Named by a path, it is the note's spec, as one beside the
    note is."""
    kb.write("kb/types/sub/x.md", "---\nname: x\n---\n# X type\n")
    kb.write("kb/notes/rel.md", note_text_with_type("../types/sub/x.md"))
    kb.write("kb/notes/root.md", note_text_with_type("kb/types/sub/x.md"))
    kb.note("named", type="x")  # a name is kb/types/x.md, which is not there
    res = run_cli("select", "type", "--json")
    assert res.exit_code == 0 and res.stderr == (
        "warning: kb/notes/named.md: type 'x' names no type spec (no file kb/types/x.md): "
        "the note has no type pair\n"
    )
    got = {(t["note_path"], t["gate_id"], t["gate_path"]) for t in res.json()["targets"]}
    assert got == {
        ("kb/notes/rel.md", "type/x", "kb/types/sub/x.md"),
        ("kb/notes/root.md", "type/x", "kb/types/sub/x.md"),
    }
    res = run_cli("select", "type/x", "--json")
    assert {t["note_path"] for t in res.json()["targets"]} == {
        "kb/notes/rel.md",
        "kb/notes/root.md",
    }


def note_text_with_type(t: str) -> str:
    return f"---\ntitle: Rel\ntype: {t}\n---\nbody\n"


def test_editing_a_type_spec_stales_exactly_its_notes(kb, run_cli):
    kb.type_spec("definition")
    kb.type_spec("note")
    kb.note("d", type="definition")
    kb.note("n", type="note")
    kb.accept("m1", [("kb/notes/d.md", "type/definition"), ("kb/notes/n.md", "type/note")])
    kb.type_spec("definition", body="# Definition\n\n## Review\n\nStricter now.\n")
    r = reasons(run_cli("select", "type", "--model", "m1", "--json"))
    assert r == {("kb/notes/d.md", "type/definition"): "gate-changed"}


def test_a_gate_edit_is_seen_when_another_selected_gate_holds_its_old_text(kb, run_cli):
    """The aggregated scan took any selected gate's current snapshot as current for every
    gate: a type spec copied from a gate's reviewed text hid that gate's edit."""
    gate = kb.gate("prose/body-check", ["body"])
    kb.type_spec("plain")
    kb.note("a", type="plain")
    kb.accept("m1", [("kb/notes/a.md", "prose/body-check")])
    kb.write("kb/types/gate-template.md", kb.read(gate))
    kb.gate("prose/body-check", ["body"], body="## Failure mode\n\nx\n\n## Test\n\nStricter.\n")
    r = reasons(run_cli("select", "--all-gates", "type", "--model", "m1", "--json"))
    assert r[("kb/notes/a.md", "prose/body-check")] == "gate-changed"


def test_requires_type_and_trait(kb, run_cli):
    kb.type_spec("definition")
    kb.gate("prose/def-only", ["body"], requires_type="definition")
    kb.gate("prose/claims", ["title"], requires_trait=["title-as-claim"])
    kb.note("d", type="kb/types/definition.md")
    kb.note("c", traits=["title-as-claim"])
    kb.note("plain")
    data = run_cli("select", "--all-gates", "--json").json()
    assert {(t["note_path"], t["gate_id"]) for t in data["targets"]} == {
        ("kb/notes/d.md", "prose/def-only"),
        ("kb/notes/c.md", "prose/claims"),
    }
    kb.accept("m1", [("kb/notes/d.md", "prose/def-only")])
    kb.write("kb/notes/d.md", kb.read("kb/notes/d.md") + "more\n")
    r = reasons(run_cli("select", "--all-gates", "--model", "m1", "--json"))
    assert r[("kb/notes/d.md", "prose/def-only")] == "note-changed"


def test_bad_notes_are_warnings_and_the_rest_proceeds(small, run_cli):
    small.write("kb/notes/broken.md", "---\ntitle: [unclosed\n---\nbody\n")
    small.write("kb/notes/latin1.md", "---\ntitle: caf\xe9\n---\n".encode("latin-1"))
    small.write("kb/notes/unclosed.md", "---\ntitle: x\nbody with no end\n")
    res = run_cli("select", "--all-gates", "--json")
    assert res.exit_code == 0
    assert res.json()["counts"]["missing-review"] == 10
    lines = res.stderr.splitlines()
    assert any(line.startswith("warning: kb/notes/broken.md: broken YAML") for line in lines)
    assert any(line.startswith("warning: kb/notes/latin1.md: not UTF-8") for line in lines)
    assert any(
        line.startswith("warning: kb/notes/unclosed.md: frontmatter block is not closed")
        for line in lines
    )
    assert "Traceback" not in res.stderr


def test_invalid_gate_is_skipped_with_a_warning(small, run_cli):
    small.write(
        "kb/instructions/review-gates/prose/bad.md",
        "---\ngate_id: prose/bad\nname: Bad\nlens: prose\n---\n## Failure mode\n## Test\n",
    )
    res = run_cli("select", "--all-gates", "--json")
    assert res.exit_code == 0
    assert "prose/bad" not in {t["gate_id"] for t in res.json()["targets"]}
    assert (
        "warning: kb/instructions/review-gates/prose/bad.md: watches must be a non-empty list"
        in res.stderr
    )
    res = run_cli("select", "prose/bad")
    assert res.exit_code == 1 and "invalid" in res.stderr


@pytest.mark.parametrize("sel", ["pros", "kb", "bad", "prose/ba"])
def test_a_selector_that_names_no_gate_is_not_blamed_on_an_invalid_one(small, run_cli, sel):
    """An unknown selector was told of the first invalid gate whose path held it as a
    part (`pros`, a typo of `prose`, got "invalid: missing name" of `prose/bad.md`)."""
    small.write(
        "kb/instructions/review-gates/prose/bad.md",
        "---\ngate_id: prose/bad\nlens: prose\nwatches: [body]\n---\n## Failure mode\n## Test\n",
    )
    res = run_cli("select", sel)
    assert (res.exit_code, res.stderr.splitlines()[-1]) == (
        1,
        f"error: {sel}: not a bundle, gate id or type request",
    )
    for named in ("prose/bad", "kb/instructions/review-gates/prose/bad.md"):
        res = run_cli("select", named)
        assert res.stderr.splitlines()[-1] == (
            f"error: {named}: not a bundle, gate id or type request (invalid: missing name)"
        )


def test_human_output(small, run_cli):
    res = run_cli("select", "prose/body-check")
    assert res.exit_code == 0
    assert "missing-review  kb/notes/alpha.md  prose/body-check" in res.stdout
    assert res.stdout.strip().endswith(
        "missing-review: 2, gate-changed: 0, note-changed: 0, fresh: 0"
    )


def age_files(root, seconds: float = 3600) -> None:
    """Move every file's mtime into the past, out of the note cache's racy window."""
    import os
    import time

    for p in root.rglob("*.md"):
        t = time.time() - seconds
        os.utime(p, (t, t))


def test_note_cache_never_hides_an_edit(small, run_cli, monkeypatch):
    # A file's ctime cannot be set into the past: trust the stamps at once.
    monkeypatch.setattr(notecache, "_RACY_S", 0.0)
    accept_all(small)
    age_files(small.root)
    first = run_cli("select", "--all-gates", "--model", "m1", "--json").json()
    assert first["targets"] == []
    assert (small.state / "cache" / "notes.pickle").exists()
    # Same size, new content, a different (still old) mtime: the cache must not be trusted.
    path = small.root / "kb/notes/beta.md"
    path.write_text(path.read_text().replace("Beta body.", "Beta BODY."))
    age_files(small.root, 1800)
    data = run_cli("select", "--all-gates", "--model", "m1", "--json").json()
    assert {(t["note_path"], t["gate_id"]) for t in data["targets"]} == {
        ("kb/notes/beta.md", "prose/body-check"),
        ("kb/notes/beta.md", "prose/align"),
    }
    # The accepted text back in place, same size, same inode, and the old mtime put back
    # (what cp -p, rsync -t and tar do): only the ctime says the file changed.
    cached = path.stat()
    with open(path, "r+b") as f:
        data = f.read().replace(b"Beta BODY.", b"Beta body.")
        f.seek(0)
        f.write(data)
    for _ in range(100_000):  # until the coarse clock moves on from the cached ctime
        os.utime(path, ns=(cached.st_atime_ns, cached.st_mtime_ns))
        now = path.stat()
        if now.st_ctime_ns != cached.st_ctime_ns:
            break
    assert (now.st_size, now.st_mtime_ns, now.st_ino) == (
        cached.st_size,
        cached.st_mtime_ns,
        cached.st_ino,
    )
    data = run_cli("select", "--all-gates", "--model", "m1", "--json").json()
    assert data["targets"] == []  # fresh again, not note-changed as the cache remembered


def test_a_note_that_changed_after_its_scan_is_a_warning_not_an_internal_error(
    small, run_cli, monkeypatch
):
    """The text of a note the scan judged by its hash is read only when compared. Edited
    in between (here: the note cache's hash is another text's), and broken, it ended
    select in "internal error"."""
    monkeypatch.setattr(notecache, "_RACY_S", 0.0)
    accept_all(small)
    run_cli("select", "--all-gates", "--model", "m1", "--json")
    rel = "kb/notes/beta.md"
    small.write(rel, "---\ntitle: [Beta\n---\nBeta body.\n")
    cache = notecache.NoteCache.open(small.state)
    cache.put(rel, (small.root / rel).stat(), "0" * 64, cache.entries[rel][2], None)
    cache.save()
    res = run_cli("select", "--all-gates", "--model", "m1", "--json")
    assert res.exit_code == 0, res.output
    assert "warning: kb/notes/beta.md: changed while it was being read" in res.stderr
    assert [t for t in res.json()["targets"] if t["note_path"] == rel] == []


def test_a_damaged_note_cache_is_rebuilt(small, run_cli):
    age_files(small.root)
    run_cli("select", "--all-gates", "--json")
    (small.state / "cache" / "notes.pickle").write_bytes(b"garbage")
    data = run_cli("select", "--all-gates", "--json").json()
    assert data["counts"]["missing-review"] == 10


def test_memo_answers_only_an_identical_question(small, run_cli):
    accept_all(small, notes=("kb/notes/alpha.md",))
    age_files(small.root)
    a = run_cli("select", "--all-gates", "--model", "m1", "--json")
    b = run_cli("select", "--all-gates", "--model", "m1", "--json")
    assert (
        a.stdout == b.stdout and len(list((small.state / "cache" / "select").glob("*.json"))) == 1
    )
    # New acceptance: the memo key changes, the answer too.
    accept_all(small, notes=("kb/notes/beta.md",))
    c = run_cli("select", "--all-gates", "--model", "m1", "--json").json()
    assert c["targets"] == [] and c["counts"]["fresh"] == 10
    # A gate edit changes the answer as well.
    small.gate("prose/body-check", ["body"], body="## Failure mode\n\nNew.\n\n## Test\n\nNew.\n")
    d = run_cli("select", "--all-gates", "--model", "m1", "--json").json()
    assert d["counts"]["gate-changed"] == 2


@pytest.mark.parametrize("partition", [("--model", "m1"), ()], ids=["model", "coverage"])
def test_memo_tells_apart_two_histories_of_one_copy_of_state_db(small, run_cli, partition):
    """Restored from a backup and changed as often as the lost copy was, state.db had the
    same acceptance counter, and the memo served the lost copy's answer. Without --model
    the key held only the number of acceptance rows, which two histories share as well."""
    import shutil

    age_files(small.root)
    Store.open(small.state).close()  # state.db and its schema
    db = small.state / "state.db"
    shutil.copy(db, small.state / "backup.db")
    accept_all(small, notes=("kb/notes/alpha.md",))
    lost = run_cli("select", "--all-gates", *partition, "--json").json()
    assert {t["note_path"] for t in lost["targets"]} == {"kb/notes/beta.md"}
    shutil.copy(small.state / "backup.db", db)
    accept_all(small, notes=("kb/notes/beta.md",))
    now = run_cli("select", "--all-gates", *partition, "--json").json()
    assert {t["note_path"] for t in now["targets"]} == {"kb/notes/alpha.md"}


def test_a_note_folder_above_the_note_roots_selects_only_notes(small, run_cli, monkeypatch):
    """``--note kb`` holds the gates and the KB's README too: they are not notes."""
    monkeypatch.chdir(small.root)  # --note paths are taken from the working folder first
    small.write("kb/README.md", "# About this KB\n")
    whole = run_cli("select", "--all-gates", "--model", "m1", "--json", "--note", "kb")
    assert whole.exit_code == 0, whole.stderr
    picked = {t["note_path"] for t in whole.json()["targets"]}
    assert picked == {"kb/notes/alpha.md", "kb/notes/beta.md"}


@pytest.mark.parametrize(
    ("given", "reason"),
    [
        ("kb/notes/alhpa.md", "no such note file or folder in the KB"),
        ("kb/notes/gone", "no such note file or folder in the KB"),
        ("kb/README.md", "not under the note roots (kb/notes)"),
        ("kb/instructions", "not under the note roots (kb/notes)"),
        ("kb/notes/data.txt", "not a note (notes are .md files)"),
        ("kb/notes/fifo.md", "not a note file or folder (a special file)"),  # selected nothing
    ],
)
@pytest.mark.parametrize("command", ["select", "enqueue"])
def test_a_note_path_that_names_no_note_is_refused_in_one_line(
    small, run_cli, monkeypatch, command, given, reason
):
    """A typo in ``--note`` used to select nothing and say "0 pairs", read as all fresh."""
    monkeypatch.chdir(small.root)
    small.write("kb/README.md", "# About this KB\n")
    small.write("kb/notes/data.txt", "not a note\n")
    os.mkfifo(small.root / "kb/notes/fifo.md")
    args = ["--model", "m1"] if command == "select" else ["--reviewer", "offline"]
    res = run_cli(command, "--all-gates", *args, "--note", given)
    assert res.exit_code != 0
    assert res.stderr.strip().splitlines() == [f"error: --note {given}: {reason}"]
    if command == "enqueue":
        with Store.open(small.state) as store:
            assert store.conn.execute("SELECT count(*) FROM review_jobs").fetchone()[0] == 0


def test_a_note_path_that_is_a_symlink_loop_is_refused_in_one_line(small, run_cli, monkeypatch):
    """pathlib raises RuntimeError for a loop: 'internal error ... (please report it)'."""
    monkeypatch.chdir(small.root)
    (small.root / "kb/notes/self.md").symlink_to("self.md")
    for args in (
        ("select", "--all-gates", "--note", "kb/notes/self.md"),
        ("enqueue", "--all-gates", "--note", "kb/notes/self.md"),
        ("ack", "--model", "m1", "kb/notes/self.md", "prose/body-check"),
    ):
        res = run_cli(*args)
        assert (res.exit_code, res.stderr) == (
            1,
            "error: kb/notes/self.md: a symlink loop, which names no file\n",
        ), args


@pytest.mark.parametrize(
    ("note_roots", "says"),
    [
        ('["kb/Notes"]', "note root kb/Notes: no such folder in"),
        ('["../"]', "note root ..: outside the KB root"),
        # The gates, the type specs and kb/README.md taken as notes to review and fix.
        ('["kb"]', "note root kb: overlaps kb/instructions/review-gates"),
        ('["kb/notes", "kb/instructions"]', "note root kb/instructions: overlaps kb/instr"),
        ('["kb/instructions/review-gates/prose"]', "prose: overlaps kb/instructions/review-"),
    ],
)
def test_a_note_root_that_is_not_there_is_refused_not_read_as_no_notes(
    small, run_cli, note_roots, says
):
    """A typo'd root was 'enqueued 0 job(s)' and exit 0, which reads as all fresh; '../'
    listed the files beside the root as notes."""
    small.write("reviewq.toml", f"[kb]\nnote_roots = {note_roots}\n")
    for command in (("select", "--all-gates"), ("enqueue", "--all-gates")):
        res = run_cli(*command)
        assert res.exit_code == 1 and says in res.stderr, res.stderr


def test_a_note_root_that_is_a_file_is_said_to_be_one(small, run_cli):
    """'no such folder' of a kb/notes that is there, as a file."""
    shutil.rmtree(small.root / "kb/notes")
    small.write("kb/notes", "a file\n")
    for command in (("select", "--all-gates"), ("enqueue", "--all-gates")):
        res = run_cli(*command)
        assert (res.exit_code, res.stderr) == (
            1,
            f"error: note root kb/notes: a file in {small.root}, not a folder "
            "(see [kb] note_roots)\n",
        ), command


def test_a_root_without_a_kb_is_refused(tmp_path, run_cli):
    res = run_cli("select", "--all-gates", root=tmp_path)
    assert res.exit_code == 1
    assert "note root kb/notes: no such folder" in res.stderr
    assert "is --root the folder that holds kb/?" in res.stderr


def test_all_gates_of_a_kb_with_no_gate_folder_is_refused_not_read_as_all_fresh(kb, run_cli):
    """A gate folder misnamed (or a --root one level off) was '0 pairs' and exit 0 for
    --all-gates, which reads as all fresh: a nightly all-gates sweep reviewed nothing."""
    kb.note("alpha")
    kb.write(
        "kb/instructions/review_gates/prose/body-check.md",
        kb.read(kb.gate("prose/body-check", ["body"])),
    )
    (kb.root / "kb/instructions/review-gates/prose/body-check.md").unlink()
    # `enqueue` with no selector asks for every gate too: the line names no option the
    # person did not type.
    for command in (
        ("select", "--all-gates", "--model", "m1"),
        ("enqueue", "--all-gates"),
        ("enqueue", "--reviewer", "offline"),
    ):
        res = run_cli(*command)
        assert (res.exit_code, res.stderr) == (
            1,
            "error: every gate was asked for, and kb/instructions/review-gates holds none "
            "(is --root the folder that holds kb/?)\n",
        ), command
    # A catalog whose every gate is invalid is said gate by gate, as before.
    kb.write("kb/instructions/review-gates/prose/bad.md", "---\ngate_id: prose/bad\n---\n")
    res = run_cli("select", "--all-gates")
    assert res.exit_code == 0 and "warning: kb/instructions/review-gates/prose/bad.md" in res.stderr


def test_a_relative_type_spec_named_like_a_catalog_one_is_warned_about(kb, run_cli):
    """Type specs are gates by name: './types/definition.md' beside kb/types/definition.md
    cannot be a second type/definition, and its notes' type pairs went unreviewed silently."""
    kb.type_spec("definition")
    kb.note("by-name", type="definition")
    kb.write("kb/notes/sub/types/definition.md", "---\nname: definition\n---\n# Local\n")
    kb.write("kb/notes/sub/rel.md", note_text_with_type("./types/definition.md"))
    res = run_cli("select", "type")
    assert res.exit_code == 0, res.stderr
    assert (
        "warning: kb/notes/sub/types/definition.md: type spec named like "
        "kb/types/definition.md (both are type/definition)" in res.stderr
    )
    assert res.stderr.count("type spec named like") == 1


def test_a_symlink_to_no_file_is_said_to_lead_nowhere(small, run_cli):
    """A link loop in the gate folder ended every command in 'internal error: OSError:
    Too many levels of symbolic links'. Among the notes, a link whose note was moved (or a
    loop) was 'a note reviewed under its own name', a note nobody could find."""
    (small.root / "kb/notes/moved.md").symlink_to("gone.md")
    (small.root / "kb/notes/self.md").symlink_to("self.md")
    gates = small.root / "kb/instructions/review-gates/prose"
    (gates / "shared.md").symlink_to("../../../shared/gone.md")
    (gates / "loop.md").symlink_to("loop.md")
    res = run_cli("select", "--all-gates", "--json")
    assert res.exit_code == 0 and res.json()["counts"]["missing-review"] == 10
    for rel in (
        "kb/notes/moved.md",
        "kb/notes/self.md",
        "kb/instructions/review-gates/prose/shared.md",
        "kb/instructions/review-gates/prose/loop.md",
    ):
        assert f"warning: {rel}: a symlink that leads to no file; skipped\n" in res.stderr
    assert "reviewed under its own name" not in res.stderr


def test_a_symlink_named_like_a_note_to_a_folder_is_said_to_be_one(small, run_cli):
    """Not 'leads to no file', which sent a person looking for a target that is there."""
    (small.root / "kb/notes/folder").mkdir()
    (small.root / "kb/notes/folder.md").symlink_to("folder")
    res = run_cli("select", "--all-gates", "--json")
    assert res.exit_code == 0, res.stderr
    assert "warning: kb/notes/folder.md: a symlink to a folder, not a file; skipped\n" in (
        res.stderr
    )


def test_a_symlink_named_like_a_note_to_a_fifo_is_said_to_lead_to_one(small, run_cli):
    """'a symlink that leads to no file' of a link whose FIFO is there to be found."""
    os.mkfifo(small.root / "kb/notes/pipe")
    (small.root / "kb/notes/pipe.md").symlink_to("pipe")
    res = run_cli("select", "--all-gates", "--json")
    assert res.exit_code == 0, res.stderr
    assert (
        "warning: kb/notes/pipe.md: a symlink to a FIFO, not a regular file; skipped\n"
        in res.stderr
    )


def test_a_symlinked_folder_of_notes_is_a_warning_not_silence(small, run_cli):
    """A folder of notes linked into the note root (a real KB keeps drafts elsewhere) is
    not entered, as CONTRACT §1 says, but without a word: its notes never came up in any
    selection and nothing said why. A linked folder holding no note (images) says nothing."""
    shared = small.root / "shared"
    (shared / "drafts").mkdir(parents=True)
    (shared / "drafts" / "draft.md").write_text("---\ntitle: Draft\n---\nBody.\n")
    (shared / "images").mkdir()
    (shared / "images" / "a.png").write_bytes(b"png")
    (small.root / "kb/notes/drafts").symlink_to("../../shared/drafts")
    (small.root / "kb/notes/images").symlink_to("../../shared/images")
    res = run_cli("select", "--all-gates", "--json")
    assert res.exit_code == 0 and res.json()["counts"]["missing-review"] == 10
    assert (
        "warning: kb/notes/drafts: a symlink to a folder holding notes, not entered: they are "
        "not reviewed (link each note, or move the folder in); skipped\n"
    ) in res.stderr
    assert "kb/notes/images" not in res.stderr


def test_a_symlinked_folder_whose_notes_are_reviewed_under_their_names_says_nothing(small, run_cli):
    """A link to a folder inside the note roots (`latest -> 2026-11`, a link to the root
    itself) leads to notes reviewed under their own names: the warning that they are not
    reviewed, and to move the folder in, was false, and said at every command."""
    (small.root / "kb/notes/2026-11").mkdir()
    (small.root / "kb/notes/2026-11/gamma.md").write_text("---\ntitle: Gamma\n---\nBody.\n")
    (small.root / "kb/notes/latest").symlink_to("2026-11")
    (small.root / "kb/notes/all").symlink_to(".")
    res = run_cli("select", "--all-gates", "--json")
    assert res.exit_code == 0 and res.json()["counts"]["missing-review"] == 15
    assert "symlink to a folder" not in res.stderr, res.stderr


def test_a_note_named_md_in_capitals_is_a_warning_not_silence(small, run_cli):
    """Only ``*.md`` files are notes (CONTRACT §1), but ``NOTE.MD`` (a Windows or macOS
    editor's name) was left out without a word: its pairs never came up."""
    (small.root / "kb/notes/UPPER.MD").write_text("---\ntitle: Upper\n---\nBody.\n")
    res = run_cli("select", "--all-gates", "--json")
    assert res.exit_code == 0 and res.json()["counts"]["missing-review"] == 10
    assert (
        "warning: kb/notes/UPPER.MD: only names ending in .md (in small letters) are read; "
        "skipped\n"
    ) in res.stderr


def test_a_fifo_named_like_a_note_or_gate_is_a_warning_not_silence(small, run_cli):
    """A FIFO (or socket) named ``x.md`` among the notes or gates was left out without a
    word: its pairs never came up, and nothing said why (CONTRACT §10: a file that had to
    be skipped is a ``warning:`` line)."""
    os.mkfifo(small.root / "kb/notes/pipe.md")
    os.mkfifo(small.root / "kb/instructions/review-gates/prose/pipe.md")
    res = run_cli("select", "--all-gates", "--json")
    assert res.exit_code == 0 and res.json()["counts"]["missing-review"] == 10
    for rel in ("kb/notes/pipe.md", "kb/instructions/review-gates/prose/pipe.md"):
        assert f"warning: {rel}: not a regular file (a FIFO); skipped\n" in res.stderr


def test_a_symlink_among_the_notes_to_a_gate_is_no_note(small, run_cli):
    """Listed (and so reviewed and fixed) as a note: the gate under a note's name."""
    alias = small.root / "kb/notes/gate-alias.md"
    alias.symlink_to(small.root / "kb/instructions/review-gates/prose/body-check.md")
    (small.root / "kb/notes/beta-alias.md").symlink_to(small.root / "kb/notes/beta.md")
    said = (
        "warning: kb/notes/gate-alias.md: a symlink to "
        "kb/instructions/review-gates/prose/body-check.md, a gate or type spec, not a note"
    )
    res = run_cli("select", "--all-gates", "--json")
    assert res.exit_code == 0, res.stderr
    assert said in res.stderr
    # An alias of a note was reviewed twice, and fixed through both names.
    assert (
        "warning: kb/notes/beta-alias.md: a symlink to kb/notes/beta.md, a note reviewed "
        "under its own name; skipped" in res.stderr
    )
    notes = {t["note_path"] for t in res.json()["targets"]}
    assert notes == {f"kb/notes/{n}.md" for n in ("alpha", "beta")}
    res = run_cli("select", "--all-gates", "--note", str(alias))  # named, it is refused
    assert res.exit_code == 1 and "not under the note roots (kb/notes)" in res.stderr


def test_a_relative_type_spec_that_leads_outside_the_root_is_not_read(kb, run_cli, tmp_path):
    """Read through its symlink, the outside file became type/evil: a pair create-jobs then
    refused, listed as missing for good."""
    outside = tmp_path / "outside-spec.md"
    outside.write_text("---\nname: evil\n---\n# Evil\n")
    kb.note("a", type="./evil.md")
    (kb.root / "kb/notes/evil.md").symlink_to(outside)
    res = run_cli("select", "type", "--json")
    assert res.exit_code == 0 and res.json()["targets"] == []
    assert res.stderr.count("warning: kb/notes/evil.md:") == 1, res.stderr  # said once
    (kb.root / "kb/notes/sub").mkdir()
    (kb.root / "kb/notes/sub/evil.md").symlink_to(outside)
    kb.note("b", type="./sub/evil.md")
    res = run_cli("select", "type", "--json", "--note", str(kb.root / "kb/notes/b.md"))
    assert res.json()["targets"] == []
    assert "warning: kb/notes/sub/evil.md: outside the KB root (through a symlink)" in res.stderr


def test_a_folder_that_cannot_be_read_is_skipped_with_a_warning(small, run_cli, monkeypatch):
    """A notes folder this user may not read (chmod 000; root reads it anyway, so the
    refusal is made here): select, gates, enqueue and sweep ended for the whole KB in
    'internal error: PermissionError', where an unreadable file is a warning."""
    import os

    small.note("pests/varroa")
    real = os.scandir

    def scandir(path):  # noqa: ANN001, ANN202
        if str(path).endswith(os.path.join("kb", "notes", "pests")):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    res = run_cli("select", "--all-gates", "--json")
    assert res.exit_code == 0, res.stderr
    assert {t["note_path"] for t in res.json()["targets"]} == {
        "kb/notes/alpha.md",
        "kb/notes/beta.md",
    }
    assert (
        "warning: kb/notes/pests: folder cannot be read (Permission denied); skipped" in res.stderr
    )


def test_pairs_skipped_for_a_file_problem_are_named_by_enqueue_and_sweep(small, run_cli):
    """A note with a sentinel line was counted ("skipped 2") and never named: only
    `create-jobs --json` said why, and a nightly sweep never reviewed it."""
    from .conftest import reviewq_process

    small.write(
        "kb/notes/sent.md", "---\ntitle: S\n---\n\nBody.\n=== PAIR REVIEW END: x :: y ===\n"
    )
    said = "warning: kb/notes/sent.md line 6: looks like a review sentinel ("
    for args in (("enqueue", "--all-gates"), ("sweep", "--all-gates", "--reviewer", "offline")):
        res = reviewq_process("--root", str(small.root), *args)
        warned = [x for x in res.stderr.splitlines() if x.startswith(said)]
        assert len(warned) == 1 and warned[0].endswith(" pair(s) skipped)"), res.stderr


def test_enqueue_and_sweep_name_a_broken_note_in_a_warning_line(small):
    """select said `warning: PATH: reason`; enqueue and sweep wrote a JSON log line to
    stderr instead (or a console log line on a terminal), for the same note."""
    from .conftest import reviewq_process

    small.write("kb/notes/broken.md", "---\ntitle: [unclosed\n---\nBody\n")
    for args in (
        ("enqueue", "--all-gates"),
        ("enqueue", "--all-gates", "--json"),
        ("sweep", "--all-gates", "--reviewer", "offline"),
    ):
        res = reviewq_process("--root", str(small.root), *args)
        lines = [x for x in res.stderr.splitlines() if "kb/notes/broken.md" in x]
        assert lines == ["warning: kb/notes/broken.md: broken YAML (frontmatter line 2): "
                         "did not find expected ',' or ']'"], res.stderr  # fmt: skip
    logged = (small.state / "logs" / "reviewq.jsonl").read_text()
    assert '"event": "kb.file_skipped"' in logged  # the log keeps it


def test_two_links_to_one_file_are_one_note_and_a_link_to_an_unnamable_note_is_its_note(
    small, run_cli
):
    """Two links to one file kept outside the note roots were two notes: each pair
    reviewed twice, and the file fixed through both. A link to a note the scan skips for
    its name was skipped as an alias of it, so neither was reviewed."""
    small.write("docs/out.md", "---\ntitle: Out\ndescription: Kept elsewhere.\n---\n\nBody.\n")
    for name in ("l1", "l2"):
        (small.root / f"kb/notes/{name}.md").symlink_to(small.root / "docs/out.md")
    small.write("kb/notes/a\\b.md", "---\ntitle: AB\ndescription: D.\n---\n\nBody.\n")
    (small.root / "kb/notes/ab.md").symlink_to(small.root / "kb/notes/a\\b.md")
    res = run_cli("select", "--all-gates", "--json")
    assert res.exit_code == 0, res.stderr
    assert (
        "warning: kb/notes/l2.md: a symlink to docs/out.md, which kb/notes/l1.md names too; "
        "skipped" in res.stderr
    )
    notes = {t["note_path"] for t in res.json()["targets"]}
    assert {"kb/notes/l1.md", "kb/notes/ab.md"} <= notes
    assert "kb/notes/l2.md" not in notes


def test_which_of_two_links_is_the_note_does_not_depend_on_the_selection(small, run_cli):
    """The first by name was judged within the selection: `--note kb/notes/sub` reviewed
    l2, which a full select skips, and a folder's sweep reviewed the file a second time."""
    small.write("docs/out.md", "---\ntitle: Out\ndescription: Kept elsewhere.\n---\n\nBody.\n")
    (small.root / "kb/notes/sub").mkdir()
    (small.root / "kb/notes/l1.md").symlink_to(small.root / "docs/out.md")
    (small.root / "kb/notes/sub/l2.md").symlink_to(small.root / "docs/out.md")
    res = run_cli("select", "--all-gates", "--note", str(small.root / "kb/notes/sub"), "--json")
    assert res.exit_code == 0, res.stderr
    assert not res.json()["targets"]
    assert "kb/notes/sub/l2.md: a symlink to docs/out.md, which kb/notes/l1.md names" in (
        res.stderr
    )


def test_a_link_excluded_by_kb_exclude_takes_no_file_from_the_link_after_it(small, run_cli):
    """Two links to one file, the first by name excluded ([kb] exclude): the second was
    skipped as a second name of the first, so the file was reviewed under neither; and an
    excluded second name was warned of, where excluded notes are counted, never named."""
    small.write("docs/out.md", "---\ntitle: Out\ndescription: Kept elsewhere.\n---\n\nBody.\n")
    for name in ("README", "later", "templates/z"):
        (small.root / f"kb/notes/{name}.md").parent.mkdir(exist_ok=True)
        (small.root / f"kb/notes/{name}.md").symlink_to(small.root / "docs/out.md")
    small.write("reviewq.toml", '[kb]\nexclude = ["README.md", "templates/**"]\n')
    res = run_cli("select", "--all-gates", "--json")
    assert res.exit_code == 0, res.stderr
    assert "kb/notes/later.md" in {t["note_path"] for t in res.json()["targets"]}
    assert res.stderr == "2 note(s) excluded by [kb] exclude: not reviewed\n", res.stderr


def test_a_link_to_a_note_whose_name_is_not_utf8_is_its_note(small, run_cli):
    import os

    bad = os.fsencode(small.root / "kb/notes") + b"/bad\xff.md"
    Path(os.fsdecode(bad)).write_text("---\ntitle: Bad\ndescription: D.\n---\n\nBody.\n")
    (small.root / "kb/notes/good-name.md").symlink_to(os.fsdecode(bad))
    res = run_cli("select", "--all-gates", "--json")
    assert res.exit_code == 0, res.stderr
    assert "kb/notes/good-name.md" in {t["note_path"] for t in res.json()["targets"]}


def test_a_long_notes_change_ratio_is_measured_once(kb, run_cli, monkeypatch):
    """The exact difflib ratio of a long note of repeated lines took seconds, and a note
    edited under its rewrite threshold was measured again at every select (a select that
    another note's edit kept from its memo). It is kept by the texts' hashes."""
    import difflib

    from orchestrator.review import freshness

    kb.gate("prose/rw", ["body"], "rewrite(0.5)")
    body = "".join("| a | b |\n" if i % 2 else "\n" for i in range(1000))
    path = kb.note("long", body=body)
    other = kb.note("other")
    kb.accept("m1", [(path, "prose/rw"), (other, "prose/rw")])
    kb.write(path, kb.read(path).replace("| a | b |\n", "| a | c |\n", 1))
    measured: list[int] = []

    class Counting(difflib.SequenceMatcher):
        def __init__(self, isjunk, a, b, **kwargs) -> None:  # noqa: ANN001
            measured.append(len(a))
            super().__init__(isjunk, a, b, **kwargs)

    monkeypatch.setattr(freshness.difflib, "SequenceMatcher", Counting)
    for edit in ("one edit", "another edit"):
        kb.write(other, kb.read(other) + f"{edit}\n")  # the select memo cannot answer
        data = run_cli("select", "prose/rw", "--model", "m1", "--json").json()
        assert data["counts"]["fresh"] == 2, data
    assert [n for n in measured if n > 100] == [1000]


def test_a_sweeps_selection_keeps_long_notes_ratios_too(kb, run_cli):
    """The nightly sweep selects again every night: the ratio memo is its too."""
    kb.gate("prose/rw", ["body"], "rewrite(0.5)")
    body = "".join("| a | b |\n" if i % 2 else "\n" for i in range(1000))
    path = kb.note("long", body=body)
    kb.accept("offline", [(path, "prose/rw")])
    kb.write(path, kb.read(path).replace("| a | b |\n", "| a | c |\n", 1))
    assert run_cli("enqueue", "prose").exit_code == 0
    assert (kb.state / "cache" / "ratios.pickle").is_file()


@pytest.mark.parametrize(
    "damage",
    [
        b"not a pickle",
        __import__("pickle").dumps({"version": 1, "en}ries": {}}),  # no entries
    ],
)
def test_a_damaged_ratio_memo_is_rebuilt(kb, run_cli, damage):
    """A damaged ratios.pickle made every select, sweep and enqueue an internal error
    (KeyError), where a cache is to be rebuilt, never trusted."""
    kb.gate("prose/rw", ["body"], "rewrite(0.5)")
    body = "".join("| a | b |\n" if i % 2 else "\n" for i in range(1000))
    path = kb.note("long", body=body)
    kb.accept("m1", [(path, "prose/rw")])
    kb.write(path, kb.read(path).replace("| a | b |\n", "| a | c |\n", 1))
    (kb.state / "cache").mkdir(exist_ok=True)
    (kb.state / "cache" / "ratios.pickle").write_bytes(damage)
    res = run_cli("select", "prose/rw", "--model", "m1", "--json")
    assert res.exit_code == 0, res.stderr
    assert res.json()["counts"]["fresh"] == 1


def test_many_files_skipped_for_one_reason_are_three_lines_and_a_count(small, tmp_path):
    """200 `.MD` files (or links out of the KB, FIFOs, notes over the size limit) were
    200 warnings at every command. Each kind of reason names its first files, then one
    line counts the rest and says where each is named; a lone file is said as before."""
    from .conftest import reviewq_process

    outside = tmp_path / "elsewhere.md"
    outside.write_text("---\ntitle: Out\n---\nBody\n")
    notes = small.root / "kb/notes"
    for i in range(7):
        (notes / f"UP{i}.MD").write_text("x\n")
        (notes / f"out{i}.md").symlink_to(outside)
        os.mkfifo(notes / f"fifo{i}.md")
        small.note(f"big{i}", body="A line of a note that grew.\n" * (20 + i))
    small.write("kb/notes/broken.md", "---\ntitle: [unclosed\n---\nBody\n")
    small.write("reviewq.toml", "[limits]\nmax_note_bytes = 400\n")
    for args in (("select", "--all-gates"), ("enqueue", "--all-gates")):
        res = reviewq_process("--root", str(small.root), *args)
        assert res.returncode == 0, res.stderr
        lines = [x for x in res.stderr.splitlines() if x.startswith("warning: ")]
        for kind in ("in small letters", "to outside the KB root", "(a FIFO)", "max_note_bytes"):
            said = [x for x in lines if kind in x]
            assert len(said) == 4, (kind, res.stderr)
            assert said[3].startswith("warning: … and 4 more file(s) for the same reason (")
            assert "reviewq logs --event kb.file_skipped" in said[3]
        assert [x for x in lines if "broken" in x] == [
            "warning: kb/notes/broken.md: broken YAML (frontmatter line 2): "
            "did not find expected ',' or ']'"
        ]
    # The log keeps one line a file: what the count's pointer leads to.
    logged = (small.state / "logs" / "reviewq.jsonl").read_text()
    assert logged.count('"event": "kb.file_skipped"') == 7 * 4 + 1
    # A sweep's summary (stdout, what cron mails) lists them the same way.
    res = reviewq_process(
        "--root", str(small.root), "sweep", "--all-gates", "--reviewer", "offline"
    )
    assert res.returncode == 0, res.stderr
    assert "29 file(s) left out of the sweep:\n" in res.stdout, res.stdout
    listed = [x for x in res.stdout.splitlines() if x.startswith("  ") and "kb/notes/" in x]
    assert len(listed) == 4 * 3 + 1, res.stdout
    assert res.stdout.count("  … and 4 more file(s) for the same reason (") == 4, res.stdout
    status = reviewq_process("--root", str(small.root), "status")
    said = [x for x in status.stdout.splitlines() if x.startswith("note not reviewed: ")]
    assert len(said) == 4 and said[3].startswith("note not reviewed: … and 4 more"), status.stdout


@pytest.mark.parametrize(
    ("reason", "kind"),
    [
        # The count line said "(not UTF-… (byte …))": the 8 of UTF-8 is no particular.
        ("not UTF-8 (byte 12)", "not UTF-8 (byte …)"),
        ("file name is not UTF-8; skipped", "file name is not UTF-8; skipped"),
        ("broken YAML (frontmatter line 2): x", "broken YAML (frontmatter line …): x"),
        ("a symlink to docs/out.md, which kb/notes/l1.md names too; skipped",
         "a symlink to …, which … names too; skipped"),
    ],
)  # fmt: skip
def test_a_skip_reasons_kind_blanks_paths_and_numbers_not_the_words(reason, kind):
    """The kind groups the capped warnings and is quoted in their count line."""
    from orchestrator.kb.notes import FileProblem

    assert FileProblem("kb/notes/a.md", reason).kind == kind


def test_an_exclude_glob_matches_a_name_however_its_accents_are_encoded(small, run_cli):
    """A KB synced from a Mac keeps names decomposed (NFD: 'U' and a combining '¨'), a
    glob typed in reviewq.toml is composed (NFC): 'Übersicht/**' excluded nothing."""
    import unicodedata

    folder = small.root / "kb/notes" / unicodedata.normalize("NFD", "Übersicht")
    folder.mkdir()
    (folder / "index.md").write_text("---\ntitle: Index\ndescription: D.\n---\n\nBody.\n")
    small.write("reviewq.toml", '[kb]\nexclude = ["Übersicht/**"]\n')
    res = run_cli("select", "--all-gates", "--json")
    assert res.exit_code == 0, res.stderr
    assert not any("index" in t["note_path"] for t in res.json()["targets"])
    assert res.stderr == "1 note(s) excluded by [kb] exclude: not reviewed\n", res.stderr


def test_a_link_to_an_excluded_note_is_not_said_to_be_reviewed_under_its_own_name(small, run_cli):
    """A link among the notes to a template [kb] exclude leaves out was skipped as "a note
    reviewed under its own name": it is reviewed under no name."""
    small.write("kb/notes/templates/t.md", "---\ntitle: T\ndescription: D.\n---\n\nBody.\n")
    (small.root / "kb/notes/alias.md").symlink_to(small.root / "kb/notes/templates/t.md")
    small.write("reviewq.toml", '[kb]\nexclude = ["templates/**"]\n')
    res = run_cli("select", "--all-gates")
    assert res.exit_code == 0, res.stderr
    assert res.stderr.splitlines() == [
        "warning: kb/notes/alias.md: a symlink to kb/notes/templates/t.md, a note "
        "[kb] exclude leaves out; skipped",
        "1 note(s) excluded by [kb] exclude: not reviewed",
    ], res.stderr


def test_a_type_naming_no_spec_is_one_line_whatever_it_holds(small, run_cli):
    """`type: "defin\\niton"` (a line break in a quoted YAML value): the hint quoted the
    value but not the spec path made of it, and its line broke in two on stderr, the
    second no `warning:` line at all."""
    small.note("broken", type="defin\niton")
    res = run_cli("select", "type")
    lines = res.stderr.splitlines()
    assert lines and all(line.startswith(("warning: ", "error: ")) for line in lines), lines
    assert "(no file kb/types/defin\\niton.md)" in res.stderr


def test_a_note_whose_type_names_no_spec_is_a_warning_of_select_type(small, run_cli):
    """`type: definiton` (a typo): `select type` gave the note no conformance pair and
    said nothing, where a gate's `requires_type` of no spec is a warning."""
    small.type_spec("definition")
    small.note("typed", type="definition")
    small.note("typo", type="definiton")
    res = run_cli("select", "type", "--json")
    assert res.exit_code == 0
    assert [t["note_path"] for t in res.json()["targets"]] == ["kb/notes/typed.md"]
    assert res.stderr.splitlines() == [
        "warning: kb/notes/typo.md: type 'definiton' names no type spec (no file "
        "kb/types/definiton.md): the note has no type pair"
    ]
    assert run_cli("select", "type/definition").stderr == ""
    for i in range(4):
        small.note(f"typo{i}", type="definiton")
    said = run_cli("select", "type").stderr.splitlines()
    assert len(said) == 4 and said[-1] == (
        "warning: … and 2 more note(s) whose type names no type spec"
    )
    res = run_cli("enqueue", "type", "--reviewer", "offline")
    assert res.exit_code == 0 and "… and 2 more note(s)" in res.stderr
    # A hint, not a file skipped: the note is reviewed for its other gates.
    assert "kb.file_skipped" not in (small.state / "logs/reviewq.jsonl").read_text()
