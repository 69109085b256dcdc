"""A moment a person names on the command line (``--since``, ``--until``): a duration back
from now, a date/time, or a time of day on this machine's clock. ``report`` and ``logs``
read them alike."""

from __future__ import annotations

import io
import os
import re
import struct
from collections.abc import Callable
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path

from orchestrator.config import ConfigError, parse_duration
from orchestrator.state.store import parse_timestamp, timestamp


class MomentError(ValueError):
    """A moment that names no time; the message names the option and the reason."""


_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}")
# Digits and a duration's units: parse_duration's own error (its range) says more of it.
_DURATION_LIKE = re.compile(r"[\d.]+\s*[dhms]?(\s*[\d.]+\s*[dhms]?)*")
# Ranges are checked after the match: "24:00" or "08:61" said "not a duration".
_TIME_OF_DAY = re.compile(r"(?P<hour>\d{1,2}):(?P<minute>\d{2})(?::(?P<second>\d{2}))?")
# What a moment takes as a date/time: fromisoformat alone took any character between date and
# time, so "2026-11-22Z" was local midnight ("Z" read as the separator, "+00:00" as the time)
# and "2026-11-22+05:00" five in the morning on the local clock.
_DATE_TIME = re.compile(
    r"(?P<date>\d{4}-\d{2}-\d{2})(?P<time>[T ]\d{2}(?::?\d{2}(?::?\d{2}(?:\.\d+)?)?)?)?"
    r"(?P<offset>Z|[+-]\d{2}(?::?\d{2})?)?"
)


def moment(text: str, option: str, end: datetime) -> tuple[datetime, str | None]:
    """The instant ``text`` names, ``end`` being now, and how to say it to a person (None
    for a duration: the caller says "the last 8h" its own way). A bare date or time is on
    this machine's clock, as cron times are."""
    if _DATE.match(text):
        try:
            start = _date_time(text)
        except (ValueError, OverflowError):
            raise MomentError(f"{option} {text!r}: not a date or time") from None
        typed = None
        try:
            if start.tzinfo is None:
                # A person's "08:00" or "2026-11-22" is on their clock, as cron times
                # are: read as UTC it was hours off. Its first reading: on a day whose
                # midnight the clock skips, the window began an hour into the day before.
                typed = start
                start = _read_on(start.date(), start.time())[0]
            said = timestamp(start)
        except (ValueError, OverflowError):
            # A real date the clock cannot place (0001-01-01 on the local clock, or
            # past year 9999 in UTC): "not a date or time" sent a person looking for a typo.
            raise MomentError(
                f"{option} {text!r}: date out of range (too near the calendar's first "
                "or last year to place in UTC)"
            ) from None
        if typed is not None:
            # In the words typed, then UTC: "since 2026-11-21T18:30Z" for a Kolkata
            # operator's `--since 2026-11-22` named the day before the one they meant.
            wall = f"{typed:%Y-%m-%d %H:%M}" + (f":{typed:%S}" if typed.second else "")
            return parse_timestamp(said), f"{wall} on this machine's clock ({said[:16]}Z)"
        return parse_timestamp(said), f"{said[:16]}Z"
    if m := _TIME_OF_DAY.fullmatch(text.strip()):
        try:
            at = time(int(m["hour"]), int(m["minute"]), int(m["second"] or 0))
        except ValueError:
            raise MomentError(
                f"{option} {text!r}: not a time of day (00:00 to 23:59; midnight is 00:00)"
            ) from None
        start = _last_on_the_clock(at, end)
        said = timestamp(start)
        # Said in the person's words too: "since 2026-11-21T13:00Z" left them to work
        # out that their 08:00 at seven in the morning was yesterday's.
        day = "today" if start.astimezone().date() == end.astimezone().date() else "yesterday"
        return parse_timestamp(said), f"{text.strip()} {day} on this machine's clock ({said[:16]}Z)"
    if text.strip().isdigit():
        # Read as seconds, "20261122" (a date without its dashes) was 234 days back.
        raise MomentError(
            f"{option} {text!r}: a duration needs its unit (30m, 12h, 7d), a date its "
            "dashes (2026-11-22)"
        )
    if not _DURATION_LIKE.fullmatch(text.strip()):
        # "yesterday" was told only of durations, the last form tried, as if the
        # option took no date or time of day.
        raise MomentError(
            f"{option} {text!r}: not a duration (30m, 12h, 7d), a date (2026-11-22) or a "
            "time of day (08:00)"
        )
    try:
        seconds = parse_duration(text, option, years=100)
    except ConfigError as exc:
        raise MomentError(str(exc)) from None
    return parse_timestamp(timestamp(end - timedelta(seconds=seconds))), None


def _last_on_the_clock(at: time, end: datetime) -> datetime:
    """The last time before ``end`` the local clock read ``at``: a person's "08:00" is
    this morning's, or yesterday's when it is not yet eight. Days are counted on the
    clock, so a change to or from daylight time between keeps the hour."""
    today = end.astimezone().date()
    later = [t for t in _read_on(today, at) if t < end]
    return later[-1] if later else _read_on(today - timedelta(days=1), at)[-1]


def _read_on(day: date, at: time) -> list[datetime]:
    """When the local clock read ``at`` on ``day``, earliest first: twice in the hour
    repeated when daylight time ends (fold 0 alone was the first, not the last); in the
    hour skipped when it begins, the moment the clock jumped past it (fold 0 alone was up
    to an hour before the clock read it, or a day back)."""
    wall = datetime.combine(day, at)
    first = wall.astimezone()
    try:
        second = wall.replace(fold=1).astimezone()
    except (ValueError, OverflowError):  # looked for past the calendar's last day
        second = first
    both = sorted({first, second})
    if all(t.replace(tzinfo=None) == wall for t in both):
        return both  # it was read (twice in a fold)
    # Skipped: the first instant the clock read past it, found in whole seconds between
    # the two readings (an hour or so apart, so some twelve halvings).
    lo, hi = int(both[0].timestamp()), int(both[-1].timestamp())
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if datetime.fromtimestamp(mid).replace(tzinfo=None) < wall:
            lo = mid
        else:
            hi = mid
    return [datetime.fromtimestamp(hi).astimezone()]


def _date_time(text: str) -> datetime:
    """A date or date and time (``--since``, ``--until``), naive unless it carries an
    offset; a date with an offset is that day's midnight at the offset."""
    m = _DATE_TIME.fullmatch(text.strip())
    if m is None:
        raise ValueError(text)
    return parse_timestamp(m["date"] + (m["time"] or "T00:00") + (m["offset"] or ""))


def local_zone() -> str:
    """The name of the zone this process reads its clock in (cron times, a person's
    "08:00"): its ``TZ``, else the zoneinfo name /etc/localtime links to, else UTC (glibc's
    default). Read once, as the C library reads it when the process starts."""
    tz = os.environ.get("TZ")
    if tz is None:
        tz = "/etc/localtime" if os.path.exists("/etc/localtime") else ""
    tz = tz.removeprefix(":")
    if tz.startswith("/"):
        # TZ=:/etc/localtime (a unit's usual setting) as /etc/localtime itself: the zone it
        # links to now, which `timedatectl set-timezone` relinks and this process never rereads.
        tz = os.path.realpath(tz)
    # A path (TZ=:/usr/share/zoneinfo/Europe/Berlin, or /etc/localtime's target): its name.
    return tz.rpartition("/zoneinfo/")[2] if "/zoneinfo/" in tz else (tz or "UTC")


# Rules kept for a zone no name finds again later: larger, it is no zone file.
_RULES_MAX = 1 << 20


def zone_rules(name: str) -> bytes | None:
    """The rules of zone ``name`` (a :func:`local_zone`) as a TZif file, when zoneinfo
    cannot find them again by the name: a file that is not a zone's (a copied
    /etc/localtime: the bytes this process read, before anything replaces them), or a
    POSIX rule (``CET-1CEST,M3.5.0,M10.5.0/3``, as the footer of a TZif file with no
    transitions). None for a zone's name, or what zoneinfo cannot read."""
    if name.startswith("/"):
        rules = _file_rules(name)
    elif "\n" in name or _zone(name) is not None:
        return None
    else:
        # RFC 8536: a header and one UTC type for the v1 and v2 blocks, then the rule.
        head = b"TZif2" + bytes(15) + struct.pack(">6l", 0, 0, 0, 0, 1, 4)
        block = head + struct.pack(">lbB", 0, 0, 0) + b"UTC\0"
        rules = block + block + b"\n" + name.encode("utf-8", "surrogateescape") + b"\n"
    if rules is None or _zone(name, rules) is None:
        return None
    return rules


def _file_rules(path: str) -> bytes | None:
    """The bytes of the zone file at ``path``; None when it is not a regular file that
    can be read, or larger than any zone's."""
    from orchestrator.regularfile import NotRegular, open_regular

    try:
        fd = open_regular(Path(path))
        if fd is None:
            return None
        with open(fd, "rb") as f:
            rules = f.read(_RULES_MAX + 1)
    except (OSError, NotRegular):
        return None
    return rules if len(rules) <= _RULES_MAX else None


class _Ending(io.BytesIO):
    """A zone file's bytes whose reading past the end fails. zoneinfo reads a version 2+
    file's last line a byte at a time until its newline: cut short (a copy that filled
    the disk), it never returned, and a control reading its copied /etc/localtime at its
    start never started."""

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        if not data and size is not None and size > 0:
            raise EOFError("the zone file ends early")
        return data


def _zone(name: str, rules: bytes | None = None):  # noqa: ANN202 - ZoneInfo, imported late
    """Zone ``name`` read from ``rules`` (:func:`zone_rules`), else by its name or path;
    None when zoneinfo cannot read it."""
    from zoneinfo import ZoneInfo  # not at import: only `status` and a control's start

    if rules is None and name.startswith("/"):  # a copied /etc/localtime: names no zone
        rules = _file_rules(name)
        if rules is None:
            return None
    try:
        if rules is not None:
            return ZoneInfo.from_file(_Ending(rules), key=name)
        return ZoneInfo(name)
    except Exception:  # noqa: BLE001 - zoneinfo's loader asserts on a damaged file: unread
        return None


def _same_offsets(theirs: Callable[[datetime], timedelta | None]) -> bool:
    """Whether a zone (``theirs``: its UTC offset at an instant) reads the clock as this
    process does over the coming year: each day at this time, and each quarter hour of a
    day in which their offsets change. A day a month missed zones whose daylight time
    starts days apart (Athens and Jerusalem: two days in March) or hours apart."""
    start = datetime.now(UTC).replace(second=0, microsecond=0)
    day, quarter = timedelta(days=1), timedelta(minutes=15)
    before = None
    for i in range(367):
        at = start + i * day
        offsets = (theirs(at), at.astimezone().utcoffset())
        if offsets[0] != offsets[1]:
            return False
        if before is not None and offsets != before:
            for j in range(1, 96):
                if theirs(at - j * quarter) != (at - j * quarter).astimezone().utcoffset():
                    return False
        before = offsets
    return True


def zone_offset(
    name: str, at: datetime | None = None, rules: bytes | None = None
) -> timedelta | None:
    """The UTC offset of zone ``name`` (by ``rules`` when given, see :func:`zone_rules`)
    at ``at`` (now), None when zoneinfo cannot read it."""
    zone = _zone(name, rules)
    if zone is None:
        return None
    return (at or datetime.now(UTC)).astimezone(zone).utcoffset()


def same_clock(name: str, rules: bytes | None = None) -> bool:
    """Whether zone ``name`` (another process's :func:`local_zone`, its ``rules`` if it
    kept them) reads the clock as this process does, now and over the coming year; by
    name when zoneinfo cannot read it."""
    if name == local_zone() and rules is None:
        return True
    zone = _zone(name, rules)
    if zone is None:
        return name == local_zone()
    return _same_offsets(lambda at: at.astimezone(zone).utcoffset())


def said_offset(offset: timedelta | None) -> str:
    """``+01:00``, ``-03:00``, ``+10:30``; "" when unknown."""
    if offset is None:
        return ""
    minutes = int(offset.total_seconds()) // 60
    sign, minutes = ("-" if minutes < 0 else "+"), abs(minutes)
    return f"{sign}{minutes // 60:02d}:{minutes % 60:02d}"
