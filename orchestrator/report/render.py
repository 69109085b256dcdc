"""The report's three forms: a short text for a terminal, one self-contained HTML page
(inline CSS and SVG, no script, nothing fetched), and JSON for scripts."""

from __future__ import annotations

import re

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup, escape

from orchestrator.logs import one_line, visible
from orchestrator.report import charts
from orchestrator.report.data import stalled_apart
from orchestrator.state.status import (
    CALLS_SAID,
    FAILED_SHOWN,
    REDO_IF,
    REJECT_ON_A_PASS,
    UNWRITTEN_SHOWN,
    held_by_a_reject,
    more_failed,
    more_unwritten,
    raised_by_agents,
    who_ran,
)
from orchestrator.state.words import attempt_words, outcome_words

FAILS_SHOWN = 3  # the terminal's FAIL findings; the page lists up to the report's cut
FAILS_LEFT = "FAIL finding(s) no fixer or person took"

_ENV = Environment(
    loader=PackageLoader("orchestrator.report", "templates"),
    autoescape=select_autoescape(["html", "j2"]),
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    # Every value the page writes (a note's diff, a finding, a path, a reviewer's name),
    # with what a reader cannot see shown: the page's own markup (a chart) is left as is.
    finalize=lambda v: visible(v) if isinstance(v, str) and not isinstance(v, Markup) else v,
)


money = charts.dollars  # the text report, the page and its charts write a cost one way


def duration(seconds: float | None) -> str:
    s = int(seconds or 0)
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h} h {m:02d} min" if h else (f"{m} min {s:02d} s" if m else f"{s} s")


_ENV.globals["FAILS_LEFT"] = FAILS_LEFT
_ENV.globals["REDO_IF"] = REDO_IF
_ENV.globals["REJECT_ON_A_PASS"] = REJECT_ON_A_PASS
_ENV.filters["money"] = money
# A count as the page writes every figure, tokens and costs alike: "48,535" (a tile said
# "48535" beside "141,900,000 tokens").
_ENV.filters["thousands"] = "{:,}".format
_ENV.filters["duration"] = duration


def build_charts(data: dict) -> dict[str, charts.Chart | None]:
    r, t = data["reviewed"], data["trends"]
    nights = len(t["nights"])
    # Each chart of nothing says so: left out, the charts of a first or empty night went
    # without a word, and the page read as broken.
    undecided = "No pair was decided in this period."
    return {
        "by_lens": charts.decisions_by("Decisions per lens", "Lens", r["by_lens"], undecided),
        "by_gate": charts.decisions_by("Decisions per gate", "Gate", r["by_gate"], undecided),
        "cost_by_reviewer": charts.bars(
            "Cost per reviewer (USD)",
            "Reviewer",
            "Cost (USD)",
            # Dearest first, as the other charts are worst first (the table is by name).
            sorted(((x["reviewer"], x["cost_usd"]) for x in r["reviewers"]), key=lambda x: -x[1]),
            money=True,
            empty="No attempt cost anything in this period.",
        ),
        "fail_rate": charts.bars(
            f"FAIL rate per gate, last {nights} nights",
            "Gate",
            "FAIL rate",
            [(g["gate_id"], g["rate"]) for g in t["fail_rate_by_gate"]],
            percent=True,
            empty=f"No gate decided a note in the last {nights} nights.",
        ),
        "cost_by_night": charts.columns(
            "Cost per night (USD)",
            "Night",
            "Cost (USD)",
            [(n["night"], n["cost_usd"]) for n in t["cost_by_night"]],
            empty=f"No cost in the last {nights} nights.",
        ),
        "attempt_failures": charts.bars(
            "Attempt failure rate per reviewer profile (agents that ran)",
            "Reviewer",
            "Failed attempts",
            [(x["reviewer"], x["rate"]) for x in t["attempt_failure_by_reviewer"]],
            percent=True,
            empty=f"No agent ran in the last {nights} nights.",
        ),
    }


def html(data: dict) -> str:
    return _ENV.get_template("report.html.j2").render(d=data, charts=build_charts(data))


def stalled(st: dict, no_worker: dict | None = None) -> str:
    """One reviewer's jobs that do not move, and the likeliest why, in one sentence.
    ``no_worker``: the report's line on jobs nothing runs, which answers the question."""
    since = (st["last_moved"] or st["oldest"])[:16] + "Z"
    moved = "nothing has run" if st["last_moved"] is None else "no attempt has moved"
    why = (
        f"; {st['never_picked_up']:,} attempt(s) were never picked up by a worker: is a "
        "worker running?"
        if st["never_picked_up"]
        else "; is the control process running, with workers?"
    )
    if no_worker and not st["never_picked_up"]:
        why = ""  # said once above, with who was heard from last and what to start
    if st.get("awaits_control_restart"):
        # The likeliest why, for certain: said by the control itself (settings_stale).
        why = (
            "; the control process started before this profile was added to reviewq.toml "
            "and runs none of its jobs until it is restarted (systemctl reload)"
        )
    outage = ""
    if st["last_not_run"]:  # "outcome: reason", as --json has it
        said = attempt_words(*st["last_not_run"].partition(": ")[::2])
        outage = f"; its last attempt did not run ({said})"
    return (
        f"{st['queued']:,} queued and {st['running']:,} running job(s), {moved} since {since}"
        f"{outage}{why}"
    )


_ENV.filters["stalled"] = stalled
_ENV.globals["stalled_apart"] = stalled_apart


def no_worker_line(idle: dict) -> str:
    """The jobs nothing runs, as the terminal's "needs you" and the page's list count them."""
    what = "worker" if idle["control_running"] else "control process"
    return f"{idle['jobs_waiting']:,} job(s) waiting with no {what}"


_ENV.filters["no_worker_line"] = no_worker_line
_ENV.filters["outcome_words"] = outcome_words


def failed_what(f: dict, most: int = 3) -> str:
    """What a failed job was about: its lens, if any, and its notes (the first few)."""
    notes = f["notes"] or ([f["note_path"]] if f["note_path"] else [])
    shown = ", ".join(notes[:most]) + (
        f" and {len(notes) - most} more note(s)" if len(notes) > most else ""
    )
    return ": ".join(x for x in (f["lens"], shown) if x) or "-"


# A table cell's least width is its longest unbroken run: a URL in a finding, a note path
# in a failed job's reasons, made its table 1,600-2,900 px wide on a 375-px phone. Letting
# such cells break anywhere split their ordinary words ("descrip-tion") as the table
# squeezed, so only a run longer than any word (report.css's `.run`) may break anywhere.
RUN_MOST = 24


def breakable(text: str) -> Markup:
    """``text`` escaped, each run of more than RUN_MOST non-spaces in a ``.run``."""
    return Markup("").join(
        Markup('<span class="run">%s</span>') % part if len(part) > RUN_MOST else escape(part)
        for part in re.split(r"(\s+)", visible(text))
    )


_ENV.filters["failed_what"] = failed_what
_ENV.filters["breakable"] = breakable


def held_sentence(why: str) -> str:
    """:func:`held_by_a_reject` as the page's sentence under an escalation."""
    said = held_by_a_reject(why)
    return said[:1].upper() + said[1:]


_ENV.filters["held_sentence"] = held_sentence


def without_calls(report: str) -> str:
    """An escalation's report without the line of its own calls: the page offers the
    note's calls once above its reports, and said again in each report they were some
    45 % of its bytes (0.4 MB of a 10,000-job night's page)."""
    kept = "\n".join(ln for ln in report.split("\n") if not ln.startswith(CALLS_SAID))
    return kept.rstrip("\n")  # the blank line that stood before it, at the end


_ENV.filters["without_calls"] = without_calls


def path_breaks(path: str) -> Markup:
    """``path`` escaped, free to break after each slash (``<wbr>``) as after its hyphens:
    Chromium breaks a line on neither side of a "/" by itself, so a narrow cell split
    "frontmatter/description-" inside its words."""
    return Markup("/<wbr>").join(escape(part) for part in path.split("/"))


_ENV.filters["path_breaks"] = path_breaks
_ENV.filters["who_ran"] = who_ran
_ENV.filters["raised_by_agents"] = raised_by_agents


def jobs_line(reviewed: dict) -> str:
    """The period's jobs by status, all reviewers together: "2 completed, 1 failed", and
    the queue's whole backlog where it holds jobs queued before the period that never moved:
    "1 queued (3 queued in all)"."""
    jobs: dict[str, int] = {}
    for by_status in reviewed["jobs"].values():
        for st, c in by_status.items():
            jobs[st] = jobs.get(st, 0) + c
    said = ", ".join(f"{c:,} {st}" for st, c in sorted(jobs.items())) or "none"
    if reviewed["queued_all"] > jobs.get("queued", 0):
        said += f" ({reviewed['queued_all']:,} queued in all)"
    return said


_ENV.filters["jobs_line"] = jobs_line


def full_command(period: dict) -> str:
    """The command that lists every item of this report's lists: its own period, named.
    `reviewq report --full` alone reports since the last report, which this one has just
    become: run after it, the rest of a cut list was in no page."""
    if period["run"] is not None:
        return f"reviewq report --full --run {period['run']}"
    return f"reviewq report --full --since {period['since']}"


_ENV.filters["full_command"] = full_command


def machine_words(m: dict) -> str:
    """One host of the report's machines: "worker45: 40 attempt(s) run, 3 failed, 2 lost
    (2 worker processes, last heard 07:28:25Z)"."""
    return (
        f"{m['host']}: {m['attempts']:,} attempt(s) run, {m['failed']:,} failed, {m['lost']:,} lost "
        f"({m['workers']} worker process(es), last heard "
        f"{(m['last_heard_at'] or '-')[:19].replace('T', ' ')}{'Z' if m['last_heard_at'] else ''})"
    )


def paused_line(paused: list[dict]) -> str:
    """ "2 paused reviewer(s), 4 job(s) waiting for them": the backlog behind a pause."""
    held = sum(p["jobs_waiting"] for p in paused)
    return f"{len(paused)} paused reviewer(s)" + (
        f", {held:,} job(s) waiting for them" if held else ""
    )


_ENV.filters["paused_line"] = paused_line


def gates_said(g: dict) -> str:
    """An escalated note's "3 gate(s)", and its escalations when they are more (a gate
    escalated in two partitions): their count under the name of gates named one twice."""
    said = f"{len(g['gates'])} gate(s)"
    escs = g["escalations"]
    if len(escs) > len(g["gates"]):
        partitions = len({e["model_partition"] for e in escs})
        said += f", {len(escs)} escalation(s) in {partitions} partitions"
    return said


_ENV.filters["gates_said"] = gates_said


def decide_line(g: dict) -> str:
    """An escalated note's calls as the sweep's summary offers them, the recommended one
    named: the recommended command alone ("reviewq decide 1 reject") read as if it were
    the only answer."""
    cmds, suggested = g["commands"], g["suggested"]
    if any(e["only_reject"] for e in g["escalations"]):
        return cmds["reject"]  # the only call decide takes (said on the next line)
    target = cmds["approve"].removesuffix(" approve")
    recommended = cmds[suggested].removeprefix(target + " ")
    if cmds["redo"].startswith(target + " redo"):
        return f"{target} approve|redo|reject (recommended: {recommended})"
    # A redo takes one partition's escalations at a time: decide refuses a note-wide one.
    recommended = "redo" if suggested == "redo" else recommended
    return f"{target} approve|reject, or {cmds['redo']} (recommended: {recommended})"


def text(data: dict, html_path: str | None) -> str:
    """What a person reads at a terminal before opening the page."""
    n, k, r = data["needs_you"], data["kb_changes"], data["reviewed"]
    dec = r["decisions"]
    lines = [
        f"reviewq report: {data['period']['label']}, to {data['period']['until'][:16]}Z",
        "jobs: " + jobs_line(r),
        f"pairs reviewed: {r['pairs']:,} (PASS {dec.get('PASS', 0):,}, WARN {dec.get('WARN', 0):,}, "
        f"FAIL {dec.get('FAIL', 0):,}, ERROR {dec.get('ERROR', 0):,})",
        f"cost: {money(r['cost_usd'])}, {r['tokens']:,} tokens, wall time {duration(r['wall_time_s'])}",
        f"fixes: {k['fixes_applied']:,} applied ({k['fixes_committed']:,} committed), "
        f"{k['fix_results'].get('unchanged', 0):,} changed nothing, "
        # Not "while the fixer ran": a write that waited (a full disk) meets later edits too.
        f"{k['human_edits_total']:,} not applied (the note was edited, moved or decided before the "
        "fix was written)",
    ]
    needs = []
    if n["no_worker"]:  # first: nothing below moves until it is started
        needs.append(no_worker_line(n["no_worker"]))
    if n["escalations_open"]:
        needs.append(
            f"{n['escalations_open']:,} escalation(s) on {n['escalated_notes']:,} note(s)"
            + raised_by_agents(n["agents_failed"])
        )
    if n["failed_total"]:
        needs.append(f"{n['failed_total']:,} failed job(s)")
    if n["paused_reviewers"]:
        needs.append(paused_line(n["paused_reviewers"]))
    if n["budgets_reached"]:
        needs.append(f"{len(n['budgets_reached'])} budget(s) reached")
    if n["sweeps_not_run"]:
        needs.append(f"{len(n['sweeps_not_run'])} cron sweep(s) that did not run")
    if n["fixes_unwritten_total"]:
        needs.append(f"{n['fixes_unwritten_total']:,} fixed note(s) not written to the KB")
    if apart := stalled_apart(n["stalled"], n["no_worker"]):
        needs.append(f"{len(apart)} reviewer(s) whose jobs do not move")
    if r["fails_left_total"]:
        needs.append(f"{r['fails_left_total']:,} {FAILS_LEFT}")
    if r["machines"]:
        lines.append("machines: " + "; ".join(machine_words(m) for m in r["machines"]))
    lines.append("needs you: " + ("; ".join(needs) if needs else "nothing"))
    if n["no_worker"]:
        lines.append(f"  {n['no_worker']['says']}")
    for a in n["agents_failed"]:
        lines.append(f"  {a['says']}")
    for g in n["escalations"][:5]:
        lines.append(f"  {g['note_path']} ({gates_said(g)}): {decide_line(g)}")
        for why in dict.fromkeys(e["only_reject"] for e in g["escalations"] if e["only_reject"]):
            lines.append(f"    {why}: only reject closes it")
        if held := [
            e["changed_since_fail"]
            for e in g["escalations"]
            if e.get("changed_since_fail") and not e["only_reject"]
        ]:
            lines.append(f"    {held_by_a_reject(*held)}")
    # Each list cut here says how many it left out and where they are: "… 3 more note(s)"
    # said no where, and the failed jobs and fixes past the third went without a word.
    if len(n["escalations"]) > 5 or n["escalated_notes"] > len(n["escalations"]):
        lines.append(
            f"  … {n['escalated_notes'] - min(5, len(n['escalations'])):,} more note(s): "
            "reviewq escalations lists every one"
        )
    for f in n["failed_jobs"][:FAILED_SHOWN]:
        lines.append(
            f"  job {f['id']} failed ({failed_what(f)}): "
            f"{(f['reasons'] or ['no reason recorded'])[0]}"
        )
    if more := more_failed(n["failed_total"]):
        lines.append(f"  {more}")
    for p in n["paused_reviewers"]:
        lines.append(f"  {p['says']}")
    for b in n["budgets_reached"]:
        # The sweep summary's words, with the run that takes the jobs over: "1 job(s)
        # wait" named no way on.
        lines.append(f"  {b['says']}")
    for x in n["sweeps_not_run"]:
        lines.append(f"  {one_line(x['says'])}")  # an error may name a file with a line break
    for f in n["fixes_unwritten"][:UNWRITTEN_SHOWN]:
        lines.append(f"  fix job {f['job_id']} not written to {f['note_path']}: {f['error']}")
    if more := more_unwritten(n["fixes_unwritten_total"]):
        lines.append(f"  {more}")
    for st in n["stalled"]:
        lines.append(f"  reviewer {st['reviewer']}: {stalled(st, n['no_worker'])}")
    # Only the FAILs nothing came of: a fixed one, or an escalated one (its decide line
    # is above), named here read as work left.
    for f in [f for f in r["fails"] if f["then"] is None][:FAILS_SHOWN]:
        lines.append(
            f"  FAIL {f['note_path']} {f['gate_id']}: {f['finding']} (reviewq job {f['job_id']})"
        )
    if r["fails_left_total"] > FAILS_SHOWN:
        lines.append(
            f"  … {r['fails_left_total'] - FAILS_SHOWN:,} more {FAILS_LEFT}: on the page, every "
            f"one with {full_command(data['period'])}"
        )
    for gate in data["trends"]["suspect_gates"]:
        lines.append(f"  gate {gate} fails far more notes than the others: check the gate too")
    if html_path:
        lines.append(f"report: {html_path}")
    return "\n".join(lines) + "\n"
