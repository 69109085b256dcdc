"""The two Huey queues (CONTRACT §6): ``review`` (agents; any number of workers, anywhere)
and ``control`` (finalize and bookkeeping; exactly one consumer, next to state.db), and
:func:`send`, the one way a message is put on either.

SQLite files in the state folder by default; ``queue.url = "redis://…"`` puts both on
Redis. Results are off: every outcome travels as a message to the control queue.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import socket
import sqlite3
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

from orchestrator.logs import import_without
from orchestrator.regularfile import NotAFolder, make_folder, make_private

# `huey.storage` imports the redis package for its Redis backend whatever the queue
# (redis.asyncio and all: ~50-90 ms of CPU in each process of a sweep on SQLite). The
# workers' modules take Huey from here, first, with redis hidden: Huey takes it as not
# installed, and _with_redis hands it the package once a queue is on Redis.
import_without("huey.storage", "redis")

from huey import RedisHuey, SqliteHuey  # noqa: E402
from huey.api import Huey  # noqa: E402
from huey.consumer import Consumer, ConsumerStopped, ThreadEnvironment  # noqa: E402, F401 - workers.consumers'
from huey.signals import SIGNAL_INTERRUPTED  # noqa: E402, F401 - workers.app's
from huey.storage import RedisStorage, SqliteStorage  # noqa: E402
from tenacity import Retrying, retry, retry_if_exception, stop_after_delay, wait_exponential  # noqa: E402

from orchestrator import faults, logs  # noqa: E402
from orchestrator.config import ConfigError, Settings  # noqa: E402
from orchestrator.control import messages  # noqa: E402
from orchestrator.state.store import StoreError  # noqa: E402

from .doorbell import Doorbell  # noqa: E402

_MAX_PAUSE = 2.0
_app: App | None = None


@dataclass
class App:
    review: Huey
    control: Huey
    settings: Settings
    wrappers: dict[str, object] = field(default_factory=dict)  # task name -> TaskWrapper
    # The app this one replaced as the process's (install_app), while something holds it:
    # this one closed, it is the process's again.
    replaced: Callable[[], App | None] = field(default=lambda: None, repr=False)

    def close(self) -> None:
        """Close both queues' connections and doorbells, and stop being this process's
        app. Whatever makes an app for a while (a command that nudges the control,
        doctor, an in-process sweep) closes it: left to the process's end, each such
        command in one process (the test suite's in-process runs) kept ~9 descriptors
        open for good, and a process past 1,024 cannot select() at all."""
        global _app
        for huey in (self.review, self.control):
            close_huey(huey)
        if _app is self:
            _app = self.replaced()

    def __enter__(self) -> App:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _PatientReads:
    """A queue that cannot be read (Redis restarting, the queue file locked past its busy
    timeout) is waited out here, with a growing pause and one log line a minute, instead
    of Huey logging a traceback at every poll (tens a second) until it is back.

    The queue is back when every read that failed succeeds again: a Redis full under
    `noeviction` refuses BLMOVE (a write) while the schedule's script, finding nothing
    due, writes nothing and goes through, and a read that counted as the queue back
    logged "available" and the outage again each second (a line a minute promised)."""

    _said_at = 0.0
    after_outage: Callable[[], None] | None = None  # run as a read finds the queue back
    where = ""  # the file and URL, as queue_where says them (huey_for)
    _refusal_said = False  # a refused password said in this outage

    def __init__(self, *args, **kwargs):  # noqa: ANN002, ANN003 - the storage's own
        # Made here, not at the first read: on Python 3.12+ a cached_property has no
        # lock, and two threads' first failed reads could each make a dict of their own,
        # one read's failure then forgotten.
        self._pauses: dict[str, float] = {}  # each read failing now: its pause
        # The reads' threads (the consumer's, the scheduler's) end an outage together:
        # each took its own failure off, then found none left, and both said it back.
        self._pauses_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def dequeue(self):  # noqa: ANN201 - Huey's signature
        return self._patiently("dequeue", super().dequeue, None)  # type: ignore[misc]

    def read_schedule(self, timestamp):  # noqa: ANN001, ANN201 - Huey's signature
        return self._patiently(
            "read_schedule",
            lambda: super(_PatientReads, self).read_schedule(timestamp),  # type: ignore[misc]
            [],
        )

    def _patiently(self, kind: str, read, empty):  # noqa: ANN001, ANN202
        try:
            data = read()
        except QUEUE_UNAVAILABLE as exc:
            now = time.monotonic()
            # A password the server no longer takes (changed under a running process) is
            # no passing outage: said at once, with the file to mend, whatever was said
            # of the outage before it (its connections closed), then once a minute.
            refused = isinstance(exc, _CREDENTIALS_REFUSED)
            with self._pauses_lock:
                say = now - self._said_at >= 60 or (refused and not self._refusal_said)
                if say:
                    self._said_at = now
                    self._refusal_said = self._refusal_said or refused
                pause = min(_MAX_PAUSE, max(0.1, self._pauses.get(kind, 0) * 2))
                self._pauses[kind] = pause
            if say:
                why = {"reason": f"{self.where}: {credentials_refused(exc)}"} if refused else {}
                logs.get().error(
                    "queue.unavailable",
                    queue=self.name,
                    error=logs.error_said(exc),
                    retry_s=_MAX_PAUSE,
                    **why,
                )
            time.sleep(pause)
            return empty
        except Exception:
            # The server answered, refusing it for another reason (an ACL without WATCH
            # for the claim) that the caller says: left failing, a read tried once (the
            # claim) kept the queue "unavailable" for good, its end never said again.
            self._back(kind)
            raise
        self._back(kind)
        return data

    def _back(self, kind: str) -> None:
        if not self._pauses:  # the usual read, with no outage: no lock taken
            return
        with self._pauses_lock:
            if self._pauses.pop(kind, None) is None or self._pauses:
                return
            self._said_at = 0.0
            self._refusal_said = False
        if self.after_outage is not None:
            self.after_outage()  # before the line: what follows it sees it done
        logs.get().info("queue.available", queue=self.name)


class _Holding:
    """The control queue's read: a message handed to the consumer stays on the queue,
    *held*, until :meth:`release` takes it off once what it says is kept (the control
    task's transaction committed). A control process killed meanwhile finds it again
    when it restarts, where a taken message would be gone with its outcome (and the
    agent's run with it). Only for a queue with one consumer thread.

    A message handed out and not released was not run (Huey could not read it, or failed
    around the task): it is handed out again, and after ``GIVE_UP`` such tries taken off
    with an error line, so one message cannot hold the queue. A message that kills the
    process it runs in would be handed first to every process that follows: the first
    message a process is handed counts in the queue itself (:meth:`_count_first`), and is
    dropped once ``GIVE_UP`` processes were handed it first and none of them ran it."""

    GIVE_UP = 3
    holds = False
    held: object = None  # the token of the message handed out and not yet released
    _tries = 0
    _handed_one = False
    _released_one = False

    def _hand_out(self, token: object, data: bytes) -> bytes | None:
        again = self.held is not None and token == self.held
        # Held before the count below is written: a count that fails (the queue gone
        # meanwhile) leaves the message held here, handed out again at the next read.
        self.held = token
        if not self._handed_one:
            starts = self._count_first(token, data)
            self._handed_one = True
            if starts > self.GIVE_UP:
                return self._drop(
                    starts, f"the {self.GIVE_UP} control processes handed it first died"
                )
        if again:
            self._tries += 1
            if self._tries >= self.GIVE_UP:
                return self._drop(self._tries, "handed out and never run (Huey failed around it)")
        else:
            self._tries = 0
        return data

    @property
    def holding_first(self) -> bool:
        """The message held is the first this process was handed: its task must run it
        alone, or a death the count blames on it could be another message's."""
        return self.held is not None and not self._released_one

    def _drop(self, tries: int, reason: str) -> None:
        """Take the held message off the queue unrun, with an error line."""
        logs.get().error(
            "message.dropped",
            queue=self.name,  # type: ignore[attr-defined]
            tries=tries,
            reason=reason,
        )
        self.release()
        return None

    def release(self) -> None:
        """Take the held message off the queue (its task has run); no-op if none."""
        if self.held is not None:
            self._take_off(self.held)
            self.held = None
            self._released_one = True

    def add_to_schedule(self, data, ts):  # noqa: ANN001, ANN201 - Huey's signature
        super().add_to_schedule(data, ts)  # type: ignore[misc]
        # On the control queue Huey schedules only a failed task's retry: the held
        # message it replaces goes once it is written. Released before (by the task), a
        # process killed in between lost it; killed after, both run (they are idempotent).
        self.release()

    def _take_off(self, token: object) -> None:
        """Delete the message and its count of first hand-outs, in one transaction. Any
        message's count, not only this process's first: a count left behind would be
        met again by a later message given the same token (SQLite reuses a free id)."""
        raise NotImplementedError

    def _count_first(self, token: object, data: bytes) -> int:
        """Count one more process handed this message first; the count so far."""
        raise NotImplementedError


class QueueStorage(_Holding, _PatientReads, SqliteStorage):
    """Huey's SQLite storage at synchronous=NORMAL: in WAL mode still safe against a
    crashed process (only a power cut can lose the last messages, and the reaper resends
    what state.db says was not done), without an fsync for each of a job's messages.

    With a :class:`~workers.doorbell.Doorbell` beside the file it is a blocking storage,
    like Redis's: an empty read waits for a ring (or ``idle_look`` seconds, for a sender
    that could not ring) instead of the consumer sleeping a fixed poll."""

    def __init__(self, name, filename, idle_look=1.0, holds=False, **kwargs):  # noqa: ANN001 - Huey's
        super().__init__(name, filename, **kwargs)
        self.idle_look = idle_look
        self.holds = holds
        self.bell = Doorbell(Path(filename).with_suffix(".bell"))
        self.blocking = self.bell.usable

    # How often a process looks whether the queue file's path still names the file it has
    # open (a stat): at most once a second, as the doorbell does.
    FILE_LOOK_S = 1.0
    _opened: tuple[int, int] | None = None  # (st_dev, st_ino) of the file the connection has
    _looked_at = 0.0

    def _create_connection(self):  # noqa: ANN202 - Huey's signature
        if self._replaced_once:  # its folder gone too (`rm -r STATE/queue`): made again
            with contextlib.suppress(OSError):
                os.makedirs(os.path.dirname(self.filename), mode=0o700, exist_ok=True)
        with contextlib.suppress(OSError):  # SQLite says what keeps it from the file
            make_private(Path(self.filename))
        conn = super()._create_connection()
        conn.execute("pragma synchronous=1")
        self._opened = _file_id(self.filename)
        self._looked_at = time.monotonic()
        if self._opened is not None and self._replaced_once:
            for sql in self.ddl:  # a file made anew at the path: Huey's tables in it
                conn.execute(sql)
        return conn

    _replaced_once = False
    file_generation = 0  # how many times the file at the path was opened anew

    def _same_file(self, now: float | None = None) -> None:
        """Close the connection if the file at the path is no longer the one it has open
        (deleted, or another moved there, while this process ran): each process went on
        with the file it had, and one started after made another at the path, so the
        control sent reviews no new worker read, or a new worker outcomes no control read,
        for good. Its next use opens the file at the path. Under the storage's lock;
        ``now`` given: looked at whenever it was last (a message about to be written)."""
        if now is None:
            now = time.monotonic()
            if now - self._looked_at < self.FILE_LOOK_S:
                return
        if self._conn is None:
            return
        self._looked_at = now
        there = _file_id(self.filename)
        if there == self._opened:
            return
        with contextlib.suppress(sqlite3.Error):
            self._conn.close()
        self._conn = None
        self._replaced_once = True
        # Row ids name rows of the old file: one held, or a batch's read by waiting(), must
        # not take another message of the same id off the new one.
        self.file_generation += 1
        self.held = None
        logs.get().warning(
            "queue.file_replaced",
            queue=self.name,
            file=self.filename,
            reason="the queue file was deleted or replaced while this process ran (never do "
            "that with a reviewq process running): it now uses the file at that path; "
            "messages left in the old one are gone, and the control's reaper sends their "
            "attempts again",
        )

    @contextlib.contextmanager
    def db(self, commit=False, close=False):  # noqa: ANN001, ANN201 - Huey's signature
        # Huey's rolls back on an Exception only. A Ctrl-C (a KeyboardInterrupt) comes
        # most often while `begin exclusive` waits for the lock, and is raised as soon as
        # it has it: the transaction stayed open on the connection, and the queue file
        # locked for the other processes (a sweep's control and worker, told to stop)
        # until this one ended.
        with self.lock:
            self._same_file()
            conn = self.conn
            cursor = conn.cursor()
            try:
                if commit:
                    cursor.execute(self.begin_sql)
                yield cursor
                if commit:
                    conn.commit()
            except BaseException:
                if conn.in_transaction:
                    # Guarded: a rollback that fails (SQLite rolled back already) must
                    # not hide what led here.
                    with contextlib.suppress(sqlite3.Error):
                        conn.rollback()
                raise
            finally:
                cursor.close()
                if close:
                    conn.close()
                    self._conn = None

    def take_rows(self, tokens: list[object]) -> None:
        """Delete the rows :func:`waiting` read, by their tokens, of this file alone: the
        look at the path comes first (:meth:`db`), so a row of a file gone is never taken
        for the row of the same id in the file that replaced it."""
        with self.db(commit=True) as curs:
            ids = [i for file, i in tokens if file == self.file_generation]  # type: ignore[misc]
            curs.execute(
                "delete from task where id in (select value from json_each(?))", (json.dumps(ids),)
            )

    def enqueue(self, data, priority=None):  # noqa: ANN001, ANN201 - Huey's signature
        with self.lock:  # a message written to a file deleted is one nothing will read
            self._same_file(time.monotonic())
        super().enqueue(data, priority)
        self.bell.ring()

    def close(self):  # noqa: ANN201 - Huey's signature
        closed = super().close()
        self.bell.close()  # reopened if the storage is used again
        return closed

    def delete_data(self, key):  # noqa: ANN001, ANN201 - Huey's signature
        # Huey clears a task's revoke flag after every task it runs, in an exclusive
        # transaction on the queue file, which each worker thread and the control then wait
        # on in turn. reviewq never revokes a task: look first, with a read.
        if not self.sql(
            "select 1 from kv where queue = ? and key = ? limit 1", (self.name, key), results=True
        ):
            return False
        return super().delete_data(key)

    def _take(self):  # noqa: ANN202
        if not self.holds:
            return super().dequeue()
        return self._patiently("dequeue", self._peek, None)

    def _peek(self):  # noqa: ANN202
        found = self.sql(
            "select id, data from task where queue = ? order by priority desc, id limit 1",
            (self.name,),
            results=True,
        )
        if not found:
            return None
        data = self._hand_out(*found[0])
        return data if data is not None else self._peek()

    def _take_off(self, token: object) -> None:
        with self.db(commit=True) as curs:
            if token != self.held:  # the file was replaced as this began: its id is another's
                return
            curs.execute("delete from task where id = ?", (token,))
            curs.execute(
                "delete from counter where queue = ? and key = ?", (self.name, f"first:{token}")
            )

    def _count_first(self, token: object, data: bytes) -> int:
        found = self.sql(
            "insert into counter (queue, key, value) values (?, ?, 1) on conflict (queue, key) "
            "do update set value = value + 1 returning value",
            (self.name, f"first:{token}"),
            commit=True,
            results=True,
        )
        return found[0][0]

    def dequeue(self):  # noqa: ANN201 - Huey's signature
        data = self._take()
        if data is not None or not self.blocking:
            return data
        # About to wait: the bytes waiting are stale (their messages were taken without
        # them) unless a message came since the look above, so drop them and look again.
        if self.bell.drain():
            data = self._take()
        if data is None:
            if not self.bell.wait(self.idle_look):
                return None
            data = self._take()
            if data is None:
                return None
        # Found after a drain or a wake-up: another message's byte may have been dropped
        # with the stale ones, so wake one more consumer to look.
        self.bell.ring()
        return data


class RedisQueueStorage(_Holding, _PatientReads, RedisStorage):
    """Held messages wait in a list of their own (``…held``), moved there as they are
    read (BLMOVE); the first read of a control process puts back on the queue what a
    killed one held."""

    def __init__(self, name="huey", holds=False, **kwargs):  # noqa: ANN001 - Huey's
        _with_redis()  # given a url= or connection settings, not a pool of redis_pool's
        super().__init__(name, **kwargs)
        self.holds = holds
        self.held_key = self.queue_key + ".held"
        self._restored = False
        self._move = self.conn.register_script(_MOVE_DUE_LUA)

    def dequeue(self):  # noqa: ANN201 - Huey's signature
        if not self.holds:
            return super().dequeue()
        return self._patiently("dequeue", self._peek, None)

    def close(self):  # noqa: ANN201 - Huey's signature
        self.pool.disconnect()  # each queue has a pool of its own (redis_pool)
        return True

    def read_schedule(self, timestamp):  # noqa: ANN001, ANN201 - Huey's signature
        return self._patiently("read_schedule", lambda: self._move_due(timestamp), [])

    def _move_due(self, timestamp) -> list:  # noqa: ANN001 - Huey's datetime
        """Move the messages due onto the queue in one script, and hand Huey none to
        enqueue. Huey's pop took them off the schedule and its scheduler pushed them after:
        a Redis full under `noeviction` lets the pop through (it frees memory) and refuses
        the push, and a control task's retry due then was gone (its outcome with it)."""
        self._move(keys=[self.schedule_key, self.queue_key], args=[self.convert_ts(timestamp)])
        return []

    def _peek(self):  # noqa: ANN202
        if not self._restored:
            moved = self.restore()
            self._restored = True
            if moved:
                logs.get().warning("queue.messages_restored", queue=self.name, messages=moved)
        if self.held is not None:  # handed out and not run: the same again
            data = self._hand_out(self.held, self.held)  # type: ignore[arg-type]
            if data is not None:
                return data
        try:
            data = self.conn.blmove(
                self.queue_key, self.held_key, self.read_timeout, src="RIGHT", dest="LEFT"
            )
        except _RedisTimeout:  # an empty queue, as Huey's own read takes it
            return None
        if data is None:
            return None
        data = self._hand_out(data, data)
        return data if data is not None else self._peek()  # dropped: the next one

    def _take_off(self, token: object) -> None:
        with self.conn.pipeline(transaction=True) as pipe:
            pipe.lrem(self.held_key, 1, token)
            pipe.hdel(self.held_key + ".first", _digest(token))
            pipe.execute()

    def _count_first(self, token: object, data: bytes) -> int:
        return self.conn.hincrby(self.held_key + ".first", _digest(data), 1)

    def missing_commands(self) -> list[str]:
        """What this queue needs and this server does not know: BLMOVE and LMOVE, for
        holding, came with Redis 6.2, and an older server answers "unknown command" at
        every read. Each is tried on a key that is never there (a move from it moves
        nothing), and so is a write on this queue's keys, which every queue needs: a
        server that refuses it, a read-only replica or an ACL without the command or the
        keys, is a :class:`ConfigError` (a worker read the queue into a traceback at every
        poll, ~40 a second)."""
        from redis.exceptions import NoPermissionError, OutOfMemoryError, ResponseError

        probe = _probe_key(self.queue_key)
        tries = {"RPOPLPUSH": lambda: self.conn.rpoplpush(probe, probe)}
        if self.holds:
            tries["BLMOVE"] = lambda: self.conn.blmove(probe, probe, 0.01, src="RIGHT", dest="LEFT")
            tries["LMOVE"] = lambda: self.conn.lmove(probe, probe, src="RIGHT", dest="RIGHT")
        missing = []
        for name, attempt in tries.items():
            try:
                attempt()
            except (OutOfMemoryError, _Unsaved):
                continue  # known, and refused while full or unsaved: an outage, waited for
            except (_Demoted, ResponseError) as exc:
                if "unknown command" in str(exc).lower():
                    missing.append(name)
                    continue
                why = (
                    "a read-only replica: give the URL its master"
                    if isinstance(exc, _Demoted)  # READONLY, as the pool's connections say it
                    else "its ACL user needs reviewq's commands on the keys huey.* and "
                    "reviewq.* (`+@all -@dangerous ~huey.* ~reviewq.*`)"
                    if isinstance(exc, NoPermissionError)
                    else "what it refuses, no worker or control can use"
                )
                raise ConfigError(f"the Redis server refused {name} ({exc}); {why}") from None
        return missing

    def restore(self) -> int:
        """Put the messages a killed control process held back on the queue, at its
        reading end (they are the oldest); the number put back."""
        moved = 0
        while self.conn.lmove(self.held_key, self.queue_key, src="RIGHT", dest="RIGHT"):
            moved += 1
        return moved


# Each message pushed before it leaves the schedule: a push refused (a full Redis) ends
# the script with it and the ones after it still there, none lost and none pushed twice.
_MOVE_DUE_LUA = """
for _, data in ipairs(redis.call('zrangebyscore', KEYS[1], '-inf', ARGV[1])) do
    redis.call('lpush', KEYS[2], data)
    redis.call('zrem', KEYS[1], data)
end
"""


def _file_id(path: str) -> tuple[int, int] | None:
    """Which file ``path`` names (device, inode), or None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _digest(data: bytes) -> str:
    """A Redis message's name in the count of first hand-outs (messages run to MiBs)."""
    return hashlib.sha256(data).hexdigest()


def check_server(huey: Huey, settings: Settings) -> None:
    """Refuse, in one line naming the file and the URL, a queue server that cannot serve
    this queue (:meth:`RedisQueueStorage.missing_commands`), before a process reads from
    it."""
    storage = huey.storage
    if not isinstance(storage, RedisQueueStorage):
        return
    try:
        missing = storage.missing_commands()
    except QUEUE_UNAVAILABLE:
        return  # Redis not up yet: the consumer waits for it, as it always has
    except ConfigError as exc:
        raise ConfigError(f"{queue_where(settings)}: {exc}") from None
    if missing:
        raise ConfigError(
            f"{queue_where(settings)}: the Redis server lacks {' and '.join(missing)}, which "
            "the control queue needs (Redis 6.2 or later)"
        )
    if (small := _too_small(storage, settings)) is not None:
        raise ConfigError(f"{queue_where(settings)}: {small}")


# What an outcome holds beside the output: its logs' tails, its telemetry, the rest.
_OUTCOME_BESIDE_OUTPUT = 2 * messages.LOG_TAIL_BYTES + messages.TELEMETRY_BYTES + 64 * 1024


def _too_small(storage: RedisQueueStorage, settings: Settings) -> str | None:
    """Why the server cannot take an outcome as large as one may be, or None: Redis closes
    the connection on a message over its `proto-max-bulk-len` (1 MiB at the least), which
    the client takes for an outage ("Broken pipe"): such an outcome was retried for an hour,
    its attempt kept alive by its beats, then dropped and its agent run again. A server
    that does not tell (CONFIG refused: an ACL, a managed Redis) is not guessed at."""
    try:
        said = storage.conn.config_get("proto-max-bulk-len")
        limit = int(said["proto-max-bulk-len"])
    except Exception:  # noqa: BLE001 - refused, renamed, away: nothing is known
        return None
    need = settings.max_output_bytes + _OUTCOME_BESIDE_OUTPUT
    if limit >= need:
        return None
    return (
        f"the Redis server takes no message over {limit} bytes (its proto-max-bulk-len), "
        f"and an agent's outcome may be {need} (an output of up to {settings.max_output_bytes} "
        "bytes, [limits] max_output_bytes, with its logs): a larger one would be retried as an "
        "outage and its agent run again; raise it (`CONFIG SET proto-max-bulk-len 64mb`, and "
        "in its configuration file) or lower max_output_bytes"
    )


def eviction_risk(huey: Huey, settings: Settings) -> str | None:
    """The words for a Redis that evicts any key when full (``maxmemory`` set, an
    ``allkeys-*`` policy: a Redis shared as a cache), or None. Each of the queue's keys
    holds every message of its queue: evicted, the reviews sent were run again a lease
    later and the outcomes waiting lost (their agents' runs paid again), with nothing
    said but each ``attempt.lost``. A server that does not tell (INFO refused by an ACL,
    a managed Redis) is not guessed at."""
    storage = huey.storage
    if not isinstance(storage, RedisStorage):
        return None
    try:
        memory = storage.conn.info("memory")
    except Exception:  # noqa: BLE001 - refused, or away: nothing is known
        return None
    policy, limit = str(memory.get("maxmemory_policy", "")), memory.get("maxmemory") or 0
    if not policy.startswith("allkeys-") or not limit:
        return None
    return (
        f"{queue_where(settings)}: the Redis server evicts any key once full (maxmemory "
        f"{limit} bytes, maxmemory-policy {policy}), the queue's among them, each holding "
        "every message of its queue: the reviews sent then run again a lease later and "
        "outcomes waiting are lost, their agents' runs paid again; set maxmemory-policy "
        "noeviction (or a volatile-* one: it evicts only keys that expire, and reviewq's "
        "queues and a move's marks do not; its control's claim does), or give reviewq a "
        "Redis of its own"
    )


# How a connection to Redis over TCP notices that its peer is gone (a partition; the other
# host restarted while the link was down), whatever the redis-py release: before 8.0 there
# was neither a socket timeout nor keepalive, and a worker waiting on BRPOP through a cut
# the server gave up on waited for a reply for good, taking no message again. No socket
# timeout: redis-py 8's default (5 s) bounds a whole write, so an outcome of a few MiB over
# a slow link timed out at every try and never arrived. Keepalive probes find a silent
# peer while a reply is awaited, TCP_USER_TIMEOUT one that stopped acknowledging a write:
# a dead link is noticed within about 30 s, a slow one is waited for.
REDIS_CONNECT_TIMEOUT_S = 10
_REDIS_TCP = {"TCP_KEEPIDLE": 15, "TCP_KEEPINTVL": 5, "TCP_KEEPCNT": 3, "TCP_USER_TIMEOUT": 30_000}


def redis_pool(url: str):  # noqa: ANN201 - a redis ConnectionPool (redis is optional)
    """The connections of one queue. Settings named in the URL's query
    (``?socket_timeout=5``) win over these."""
    _with_redis()
    from redis import ConnectionPool

    if url.startswith("unix://"):  # a local socket: no link to lose, nor a timeout
        # redis-py's default (5 s) timed out every write Redis held past it (`CLIENT
        # PAUSE 8000 WRITE`, as a failover's tooling sends): "Timeout reading from
        # socket", an outage said of a server that answered a moment later.
        pool = ConnectionPool.from_url(url, socket_timeout=None)
    else:
        options = {getattr(socket, k): v for k, v in _REDIS_TCP.items() if hasattr(socket, k)}
        pool = ConnectionPool.from_url(
            url,
            socket_timeout=None,
            socket_connect_timeout=REDIS_CONNECT_TIMEOUT_S,
            socket_keepalive=True,
            socket_keepalive_options=options,
        )
    pool.connection_class = _demotable(pool.connection_class)
    return pool


@functools.cache
def _demotable(base: type) -> type:
    """``base`` taking a server made read-only under it (a failover made it a replica) as
    gone: the connection is closed, so that the next one is opened afresh (to the new
    primary, where the name now points), and the error is an unavailable queue's (sends
    retry, consumers wait), as redis-py's Sentinel connections take it. READONLY was a
    ResponseError: each read of the queue a traceback, each outcome dropped. So is the
    UNBLOCKED a read blocked at that moment is given ("instance state changed"), and the
    EXECABORT of a transaction whose commands came before it and whose EXEC after ("because
    of: READONLY"; a message larger than the server reads at once leaves that gap): the
    release of a control message raised it, unretried, a traceback from Huey.

    A server whose last snapshot failed (its disk full, under Redis's default
    `stop-writes-on-bgsave-error yes`) refuses every write with MISCONF, a ResponseError
    too: it is kept as an unavailable queue's as well (:class:`_Unsaved`), the connection
    kept, until a snapshot succeeds."""
    from redis.exceptions import ExecAbortError, ReadOnlyError, ResponseError

    class Demotable(base):
        def read_response(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - redis-py's
            try:
                return super().read_response(*args, **kwargs)
            except ResponseError as exc:
                said = str(exc)
                if said.startswith("MISCONF") or (
                    isinstance(exc, ExecAbortError) and "MISCONF" in said
                ):
                    raise _Unsaved(said) from None
                if not (
                    isinstance(exc, ReadOnlyError)
                    or said.startswith("UNBLOCKED")
                    or (isinstance(exc, ExecAbortError) and "READONLY" in said)
                ):
                    raise
                self.disconnect()
                raise _Demoted(str(exc)) from None

    return Demotable


def shown_url(url: str) -> str:
    """A queue URL as a message may show it: its password, if any, as ``***``, whether
    in the user part or in the query (``?password=``, which redis-py takes too, and a TLS
    key's ``ssl_password``)."""
    base, mark, query = url.partition("?")
    if query:
        query = "&".join(
            f"{key}=***" if logs.secret_name(key) and sep else f"{key}{sep}{value}"
            for key, sep, value in (item.partition("=") for item in query.split("&"))
        )
    parts = urlsplit(base)
    userinfo, at, hostport = parts.netloc.rpartition("@")
    if at and ":" in userinfo:
        user = userinfo.partition(":")[0]
        base = urlunsplit(parts._replace(netloc=f"{user}:***@{hostport}"))
    return base + mark + query


# The first byte of every reply a Redis server gives (RESP2 and RESP3).
_RESP_FIRST = frozenset(b"+-:$*_,#!=(%~>|")
_PROBE_S = 5.0


def queue_where(settings: Settings) -> str:
    """Where a queue's problem lies, as every line about it names it: the file and the URL
    (never its password)."""
    return f"{settings.config_path or 'reviewq.toml'} [queue] url {shown_url(settings.queue.url)}"


def out_of_reach(settings: Settings, exc: BaseException) -> str:
    """The words for a Redis queue that does not answer (refused, no route, no name, no
    answer), for doctor: an outage the consumers wait out, or a host or port mistyped; a
    host name that does not resolve is refused at start, and said so."""
    if problem := _unresolved(settings.queue.url):
        return f"{queue_where(settings)}: {problem}; a worker or control started now refuses it"
    from redis.exceptions import BusyLoadingError

    if isinstance(exc, BusyLoadingError):
        # A Redis restarted with a large dataset answers LOADING for as long as it reads
        # it: up and at the right address, so "start Redis there" sent the reader astray.
        return (
            f"{queue_where(settings)}: the Redis server is still loading its dataset after a "
            f"restart ({exc}); a worker or control started now waits for it to finish"
        )
    if _MAXCLIENTS in str(exc) or _at_maxclients(settings.queue.url):
        # Up at the right address, but it closes every new connection: over TCP the
        # client reads why; over a unix socket its write meets the close first ("Broken
        # pipe"), and only a probe that reads hears the server's line.
        return (
            f"{queue_where(settings)}: the Redis server is up but at its `maxclients`: it "
            "closes every new connection, this one too; a worker or control started now "
            "waits for one to close: end what holds its connections (another application, "
            "processes left running: `ss -xp` or `ss -tnp` on its machine) or raise its "
            "`maxclients` (in its configuration; a client already connected may CONFIG SET it)"
        )
    return (
        f"{queue_where(settings)}: out of reach ({exc}); a worker or control started now "
        "waits for it: start Redis there, or put its host and port in the URL"
    )


def stall_problem(settings: Settings) -> str | None:
    """What to say of a Redis queue that takes a connection and answers nothing within
    the probe's timeout, asked once; None when it answers (a refusal is an answer) or
    cannot be reached (:func:`out_of_reach`). The queue's own connections have no read
    timeout, so that a stall is waited out (K80), and `doctor` waited with them for good."""
    if not settings.queue.url:
        return None
    _with_redis()
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    # Closed on every way out (a client is its own context manager).
    with redis.Redis.from_url(
        settings.queue.url,
        socket_connect_timeout=_PROBE_S,
        socket_timeout=_PROBE_S,
        retry=Retry(NoBackoff(), 0),
    ) as client:
        try:
            client.ping()
        except redis.exceptions.TimeoutError:
            if not _takes_connections(settings.queue.url):
                return None  # a connect that timed out: out of reach, said as such
            return (
                f"{queue_where(settings)}: the Redis server takes connections but answered "
                f"nothing in {_PROBE_S:g} s: its process is stopped (a SIGSTOP, a debugger), "
                "it is paused (CLIENT PAUSE ... ALL) or its one thread is held (a long "
                "command, a slow disk); a worker or control waits for it: look at its "
                "process and its log"
            )
        except Exception:  # noqa: BLE001 - out of reach, or an answer: said by the checks after
            return None
        try:
            # A write as the queue's checks make one (a move from its key that is never
            # there): `CLIENT PAUSE ... WRITE`, as a failover's tooling sends, answers the
            # PING and holds every write, and doctor's check of the queue's commands waited.
            review = huey_for(settings, "review")  # its key's name: no connection made
            close_huey(review)
            probe = _probe_key(review.storage.queue_key)
            client.rpoplpush(probe, probe)
        except redis.exceptions.TimeoutError:
            return (
                f"{queue_where(settings)}: the Redis server answers but held a write for "
                f"{_PROBE_S:g} s: it is paused for writes (CLIENT PAUSE ... WRITE, as a "
                "failover's tooling sends; CLIENT UNPAUSE ends it); a worker or control "
                "waits for it: look at what paused it"
            )
        except Exception:  # noqa: BLE001 - an answer (a refusal too): said by the checks after
            return None
    return None


def _probe_key(queue_key: str) -> str:
    """A key of the queue's that is never there: a move from it moves nothing."""
    return queue_key + ".probe"


_MAXCLIENTS = "max number of clients reached"


def _takes_connections(url: str) -> bool:
    """Whether the server ``url`` names accepts a connection (at the socket: no TLS, no
    word read), within the probe's timeout."""
    try:
        sock = _plain_socket(urlsplit(url))
    except OSError:
        return False
    sock.close()
    return True


def _at_maxclients(url: str) -> bool:
    """Whether the plain-text Redis at ``url`` answers a new connection with its
    `maxclients` refusal (a rediss:// one is not asked: its line comes inside TLS)."""
    parts = urlsplit(url)
    if parts.scheme not in ("unix", "redis"):
        return False
    try:
        sock = _plain_socket(parts)
    except OSError:
        return False
    with sock:
        try:  # the server writes its refusal at the accept: read whatever a PING meets
            with contextlib.suppress(OSError):
                sock.sendall(b"PING\r\n")
            said = sock.recv(64)
        except OSError:
            return False
    return said.startswith(b"-ERR " + _MAXCLIENTS.encode())


def check_queue(settings: Settings) -> None:
    """Refuse, in one line naming the file and the URL (never its password), a Redis queue
    that answers but will never take this process: a password or user it refuses,
    something other than Redis at that address, redis:// to a TLS port or rediss:// to a
    port without TLS, a certificate the client does not trust. Taken for an outage (a
    reset, a handshake timed out, a refused certificate at every try), each was waited on
    for good, a ``queue.unavailable`` line a minute, by a worker or control that looked
    alive. A server out of reach (refused, timed out, restarting) is no mistake of the
    file: the consumers wait for it as they always have."""
    url = settings.queue.url
    if not url:
        return
    where = queue_where(settings)
    problem = _unresolved(url) or _probe_problem(url)
    if problem is not None:
        raise ConfigError(f"{where}: {problem}")
    _with_redis()
    import redis
    from redis.exceptions import (
        AuthenticationError,
        AuthorizationError,
        InvalidResponse,
        NoPermissionError,
        ResponseError,
    )

    client = redis.Redis.from_url(url, socket_connect_timeout=_PROBE_S, socket_timeout=_PROBE_S)
    try:
        client.ping()
    except (AuthenticationError, AuthorizationError, NoPermissionError) as exc:
        raise ConfigError(f"{where}: {credentials_refused(exc)}") from None
    except InvalidResponse as exc:
        raise ConfigError(f"{where}: not a Redis server ({exc}); check the host and port") from None
    except ResponseError as exc:
        if "DB index is out of range" in str(exc) or "not an integer or out of range" in str(exc):
            # SELECT of a database past the server's `databases`: a worker so started read
            # nothing and said nothing, for good.
            raise ConfigError(
                f"{where}: the Redis server has no such database ({exc}); name one from 0 "
                "to its `databases` setting less one (16 by default: 0 to 15)"
            ) from None
        if not str(exc).startswith("DENIED"):
            return  # a busy or a loading server answers so for a while: waited for
        # A Redis without a password answers only its own machine: DENIED to every
        # command from another, for good (it was a traceback at start).
        raise ConfigError(
            f"{where}: the Redis server is in protected mode and takes no client from another "
            "machine while it has no password; give it one (requirepass) and put it in the "
            "URL (redis://:PASSWORD@HOST:6379/0)"
        ) from None
    except QUEUE_UNAVAILABLE as exc:
        if url.startswith("rediss://") and (problem := _probe_problem(url, True)):
            raise ConfigError(f"{where}: {problem}") from None
        if _untrusted(exc):
            raise ConfigError(
                f"{where}: the server's TLS certificate is not trusted ({exc.__context__}); "
                f"{_trust_hint(url, str(exc.__context__))}"
            ) from None
        return  # away: waited for
    finally:
        client.close()


def credentials_refused(exc: BaseException) -> str:
    """The words for a Redis server that refuses this client's user or password."""
    return (
        f"the Redis server refused this client ({exc}); set the user and password it "
        "expects in the URL (redis://USER:PASSWORD@HOST:6379/0)"
    )


def _unresolved(url: str) -> str | None:
    """Why the URL's host name does not resolve here, or None. At start it is a name to
    mend, whatever the resolver says: a mistyped host that it answered with a temporary
    failure (EAI_AGAIN, as a resolver out of reach or a search domain's server says it)
    was waited for as an outage, for good. After a good start, the consumers wait out
    such a failure as any outage."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        return None
    try:
        socket.getaddrinfo(parts.hostname, parts.port or 6379, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        why = getattr(exc, "strerror", None) or exc
        return (
            f"the host {parts.hostname!r} does not resolve ({why}); check its spelling, "
            "or this machine's DNS"
        )
    except ValueError:  # a port past 65535: the client's own check says it
        return None
    return None


def _untrusted(exc: BaseException) -> bool:
    """A TLS certificate the client refused (an unknown CA, another host's name, expired):
    the same at every try."""
    import ssl

    return isinstance(exc.__context__ or exc.__cause__, ssl.SSLCertVerificationError)


# What OpenSSL says of a CA certificate Python 3.13's strict checks (VERIFY_X509_STRICT,
# on by default there) refuse, which 3.11 and 3.12 trust.
_STRICT_X509 = ("key usage", "Basic Constraints", "Key Identifier")


def _trust_hint(url: str, refused: str) -> str:
    """What to do about a certificate the client refused: name its CA, unless the URL
    names one already, which told a person to add what was there (Python 3.13 refuses a
    CA file older Pythons took, for the extensions it lacks)."""
    named = parse_qs(urlsplit(url).query).get("ssl_ca_certs")
    if not named:
        return "name its CA with ssl_ca_certs=/path/ca.crt in the URL's query"
    hint = f"the CA file ssl_ca_certs names ({named[-1]}) does not vouch for it"
    if any(word in refused for word in _STRICT_X509):
        return (
            f"{hint}: Python 3.13 and later refuse a CA certificate without the key usage "
            "extension, or whose basic constraints are not critical; make the CA again "
            "with -addext 'basicConstraints=critical,CA:TRUE' -addext "
            "'keyUsage=critical,keyCertSign,cRLSign'"
        )
    return f"{hint}: name the CA that signed the server's certificate"


def _probe_problem(url: str, after_tls_failed: bool = False) -> str | None:
    """What a plain-text Redis PING at ``url`` shows is wrong with the URL, or None: a
    reply that is not Redis's (a wrong port), a port that speaks only TLS to a redis://
    URL, a Redis without TLS to a rediss:// one. Each was taken for an outage: the
    connection reset, or the handshake timed out, at every try. No answer at all is no
    mistake shown (a proxy whose Redis is down closes at once)."""
    parts = urlsplit(url)
    if parts.scheme == "rediss" and not after_tls_failed:
        return None  # the client's handshake comes first: a TLS port logs a plain PING
    host, port = parts.hostname or "localhost", parts.port or 6379
    try:
        sock = _plain_socket(parts)
    except OSError:
        return None  # out of reach: an outage, waited for
    with sock:
        try:
            sock.sendall(b"PING\r\n")  # an inline command: every Redis answers it, +PONG or -NOAUTH
            said = sock.recv(64)
        except OSError:
            said = b""
    if parts.scheme == "rediss":
        if said and said[0] in _RESP_FIRST:
            return "a Redis without TLS answers there; the URL takes redis://"
        return None  # TLS, or nothing: the client's handshake says
    if said and said[0] not in _RESP_FIRST:
        line = said.split(b"\n")[0].rstrip(b"\r")
        text = line.decode("ascii", "replace")
        shown = repr(text) if text.isascii() and text.isprintable() else repr(line[:16])
        return f"not a Redis server (it answered {shown}); check the host and the port"
    if not said and parts.scheme == "redis" and _speaks_tls(host, port):
        return "the port speaks only TLS; the URL takes rediss://"
    return None


def _plain_socket(parts) -> socket.socket:  # noqa: ANN001 - a urlsplit result
    """A socket connected to the server a unix:// or redis(s):// URL names, no TLS, each
    call bounded by the probe's timeout; OSError when it cannot be reached."""
    if parts.scheme != "unix":
        host, port = parts.hostname or "localhost", parts.port or 6379
        return socket.create_connection((host, port), timeout=_PROBE_S)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(_PROBE_S)
    try:
        sock.connect(parts.path)
    except OSError:
        sock.close()
        raise
    return sock


def _speaks_tls(host: str, port: int) -> bool:
    """Whether a TLS handshake with ``host:port`` goes through (whoever's certificate)."""
    import ssl

    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with (
            socket.create_connection((host, port), timeout=_PROBE_S) as raw,
            context.wrap_socket(raw, server_hostname=host),
        ):
            return True
    except (OSError, ValueError):
        return False


# On Redis, the key a control process writes at each tick: a worker's queue that no
# control has ever fed is one on another database (redis://host/3 where the control uses
# /0) or another server, and its worker would sit idle for good. (On SQLite the state
# folder tells: ``_unfed_queue`` of the CLI.)
FED_KEY = "reviewq.control"


def beside_a_control(settings: Settings) -> bool:
    """A worker started in the KB root or in a control's state folder (the Procfile's, a
    sweep's): a control may yet start there and feed its queue, so a queue not fed yet is
    no mistake of its settings."""
    return (settings.root / "kb").is_dir() or any(
        (settings.state_dir / name).exists() for name in ("state.db", "control.lock")
    )


def mark_fed(
    huey: Huey,
    state_dir: Path,
    reviewers: dict[str, str] | None = None,
    every: float | None = None,
) -> float | None:
    """Say on a Redis queue that a control process feeds it: where, when, and its reviewer
    profiles with their partitions, which every worker must have (a no-op on SQLite).
    ``every``: how often it says so (its tick), so that a worker can tell when it stopped;
    the time is also given by the queue's clock, which the worker reads alike, and
    returned (None on SQLite)."""
    storage = huey.storage
    if isinstance(storage, RedisStorage):
        now = queue_clock(huey)
        storage.conn.set(
            FED_KEY,
            json.dumps(
                {
                    "host": socket.gethostname(),
                    "state": str(state_dir),
                    "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "reviewers": reviewers or {},
                    "queue_at": now,
                    "every": every,
                    "v": messages.VERSION,  # its release's messages: a worker's must match
                }
            ),
        )
        return now
    return None


def fed_late(fed: dict, now: float) -> float | None:
    """How long past its time the control that wrote ``fed`` (:func:`fed_by`) has been
    silent, by the queue's clock ``now``; None while it is on time, or when the key does
    not say (a control of an earlier release). Five of its ticks, as a lost tick is."""
    at, every = fed.get("queue_at"), fed.get("every")
    if not isinstance(at, int | float) or not isinstance(every, int | float) or every <= 0:
        return None
    silent = now - at
    return silent if silent > max(5 * every, 2.0) else None


def stale_problem(settings: Settings, fed: dict, silent: float) -> str:
    """The words for a queue its control process fed once and no longer does."""
    where = queue_where(settings)
    return (
        f"{where}: no control process has fed this queue for "
        f"{f'{silent:.0f} s' if silent < 120 else f'{silent / 60:.0f} min'} (the last, "
        f"on {fed.get('host')}, state folder {fed.get('state')}, at {fed.get('at')}): it "
        "stopped, or it now uses another Redis database or server; a worker here waits for "
        "it. Start it, or give the URL the database (the /N or ?db=N) and server of the "
        "control's reviewq.toml"
    )


def profiles_unlike(settings: Settings, fed: dict) -> dict[str, str]:
    """By profile name, how this worker's profiles fail the control's that :func:`mark_fed`
    wrote: one it lacks, or one writing another partition. Every worker takes messages of
    every profile (one review queue), and fails such a one's as a launch failure, which
    pauses the profile for every worker."""
    theirs = fed.get("reviewers")
    if not isinstance(theirs, dict):
        return {}
    where = settings.config_path or "reviewq.toml"
    found = {}
    for name, partition in sorted(theirs.items()):
        mine = settings.reviewers.get(name)
        if mine is None:
            found[name] = (
                f"the control's reviewer profile {name!r} is not in {where}: this worker "
                "would fail each of its jobs it takes as a launch failure, which pauses the "
                f"profile for every worker; add [reviewers.{name}]"
            )
        elif isinstance(partition, str) and partition != mine.partition:
            found[name] = (
                f"[reviewers.{name}] of {where} writes partition {mine.partition!r}, the "
                f"control's writes {partition!r}: this worker would refuse each of its jobs, "
                f"which pauses the profile for every worker; give it the control's model, or "
                f"partition = {partition!r}"
            )
    return found


def release_unlike(fed: dict) -> str | None:
    """How the control that wrote ``fed`` (:func:`mark_fed`) speaks another message version
    than this reviewq: every message either sends the other refuses (``message.refused``),
    and no job runs on this worker. None when they match, or the key does not say (a
    control of an earlier release)."""
    theirs = fed.get("v")
    if not isinstance(theirs, int) or theirs == messages.VERSION:
        return None
    return (
        f"the control process that feeds this queue (on {fed.get('host')}, state folder "
        f"{fed.get('state')}) sends messages of version {theirs}, this reviewq speaks "
        f"{messages.VERSION}: each refuses the other's messages and no job would run here; "
        "install the control's reviewq release on this machine (or upgrade both)"
    )


def fed_by(huey: Huey) -> dict | None:
    """What :func:`mark_fed` last wrote on this Redis queue: {} for a queue no control
    process has fed, None on SQLite. Raises what the queue raises when it cannot be read."""
    storage = huey.storage
    if not isinstance(storage, RedisStorage):
        return None
    raw = storage.conn.get(FED_KEY)
    if raw is None:
        return {}
    try:
        said = json.loads(raw)
    except ValueError:
        said = None
    return said if isinstance(said, dict) and said else {"host": "?"}


def other_feeder(huey: Huey, state_dir: Path, since: float | None = None) -> dict | None:
    """What another control process, of another state folder or host, wrote on this Redis
    queue's key within five of its ticks (:func:`fed_late`): two installs on one database,
    whose workers take each other's review messages and whose controls take each other's
    outcomes (job ids are small numbers in both). None when the key is this control's,
    late, absent, of a release that wrote no time, or written before ``since`` (by the
    queue's clock: a control's own last mark, which a control that stopped never
    overwrites, as the one it replaced on another host, a container's new name, did)."""
    fed = fed_by(huey)
    if not fed or not isinstance(fed.get("queue_at"), int | float):
        return None
    if since is not None and fed["queue_at"] <= since:
        return None
    if (fed.get("host"), fed.get("state")) == (socket.gethostname(), str(state_dir)):
        return None
    return fed if fed_late(fed, queue_clock(huey)) is None else None


def shared_problem(settings: Settings, fed: dict) -> str:
    """The words for a Redis database another control process feeds too."""
    return (
        f"{queue_where(settings)}: another control process feeds this Redis database too "
        f"(on {fed.get('host')}, state folder {fed.get('state')}, at {fed.get('at')}): the "
        "queue names are fixed, so the workers of each take the other's review messages "
        "and each control may take the other's outcomes; give each state folder its own "
        "database (the /N or ?db=N) or Redis"
    )


# On Redis, the key a control process holds while it runs (:func:`claim_queue`): the
# queue names are fixed, so a second control on one database took the first's ticks and
# outcomes, and its start put back on the queue the message the first was running.
CLAIM_KEY = "reviewq.control.claim"


def claim_queue(huey: Huey, install: int, state_dir: Path, every: float) -> dict | None:
    """Claim this Redis database for the control process of state folder ``install``
    (:meth:`Store.install_id`), or renew its claim, for five of its ticks (``every``),
    as :func:`fed_late` counts a control gone; None when done (and on SQLite), or what the
    live claim of another install's control says, which is left as it is. A control
    replaced on another host (a rollout: a new container, the same state folder) takes
    its own install's claim over; one of a copy of its state folder on its host does not
    (:func:`_ours`)."""
    storage = huey.storage
    if not isinstance(storage, RedisStorage):
        return None
    mine = {
        "install": install,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "state": str(state_dir),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    lapse_ms = int(max(5 * every, 2.0) * 1000)

    def claim(pipe: Any) -> dict | None:  # noqa: ANN401 - a redis Pipeline
        if (held := _foreign_claim(pipe, install, state_dir)) is not None:
            return held
        pipe.multi()
        pipe.set(CLAIM_KEY, json.dumps(mine), px=lapse_ms)
        return None

    return storage.conn.transaction(claim, CLAIM_KEY, value_from_callable=True)


def claim_when_up(huey: Huey, install: int, state_dir: Path, every: float) -> dict | None:
    """:func:`claim_queue` at a control's start, a Redis that does not answer yet (a boot
    that starts the control first) waited for as a read is (:class:`_PatientReads`): the
    first read comes next, so the claim cannot be left to the first tick."""
    storage = huey.storage
    if not isinstance(storage, RedisQueueStorage):
        return claim_queue(huey, install, state_dir, every)
    unread = {}
    while (
        held := storage._patiently(
            "claim", lambda: claim_queue(huey, install, state_dir, every), unread
        )
    ) is unread:
        pass
    return held


def claimed_by_another(settings: Settings, install: int) -> dict | None:
    """What the live claim of another install's control on this Redis queue says
    (:func:`claim_queue`), for a sweep to refuse before it records its jobs or starts a
    worker; None on SQLite, with no such claim, or when Redis does not answer (the
    sweep's control then says it at its start)."""
    if not settings.queue.url:
        return None
    client = huey_for(settings, "control").storage.conn
    try:
        return _foreign_claim(client, install, settings.state_dir)
    except Exception:  # noqa: BLE001 - away or refused: the control's start says which
        return None
    finally:
        client.connection_pool.disconnect()


def _foreign_claim(conn: Any, install: int, state_dir: Path) -> dict | None:  # noqa: ANN401 - a redis client
    held = _claim_of(conn.get(CLAIM_KEY))
    if held is None or _ours(held, install, state_dir):
        return None
    return {**held, "lapses_s": max(0, conn.pttl(CLAIM_KEY)) / 1000}


def _ours(held: dict, install: int, state_dir: Path) -> bool:
    """Whether a claim is this state folder's own. A KB folder copied whole (a staging
    copy, a second KB started from a backup) keeps state.db's install id: on one host, a
    control of another state folder is another's, where a rollout's new host is not."""
    if held.get("install") != install:
        return False
    if held.get("host") != socket.gethostname() or held.get("state") == str(state_dir):
        return True
    try:  # the same folder by another path (a bind mount): a sweep beside its control
        return os.path.samefile(held.get("state"), state_dir)
    except (OSError, TypeError):
        return False


def unclaim_queue(huey: Huey, install: int, state_dir: Path) -> None:
    """Give up this install's claim (:func:`claim_queue`) as its control stops, so that
    a control of another KB moved onto this database need not wait for it to lapse."""
    storage = huey.storage
    if not isinstance(storage, RedisStorage):
        return

    def unclaim(pipe: Any) -> None:  # noqa: ANN401 - a redis Pipeline
        held = _claim_of(pipe.get(CLAIM_KEY))
        pipe.multi()
        if held is not None and _ours(held, install, state_dir):
            pipe.delete(CLAIM_KEY)

    storage.conn.transaction(unclaim, CLAIM_KEY)


def _claim_of(raw: bytes | None) -> dict | None:
    """A claim as :func:`claim_queue` wrote it; one it cannot read is another's."""
    if raw is None:
        return None
    try:
        said = json.loads(raw)
    except ValueError:
        said = None
    return said if isinstance(said, dict) else {"host": "?"}


def claim_problem(settings: Settings, held: dict) -> str:
    """The words for a control refused a Redis database another control has claimed."""
    return (
        f"{queue_where(settings)}: another control process runs on this Redis database "
        f"(on {held.get('host')}, pid {held.get('pid')}, state folder {held.get('state')}, "
        f"its claim renewed at {held.get('at')}): the queue names are fixed, so each would take the "
        "other's ticks, outcomes and review messages; give each state folder its own "
        "database (the /N or ?db=N) or Redis. If that control has stopped, its claim "
        f"lapses in {held.get('lapses_s', 0):.0f} s"
    )


class StopRequests:
    """The control process's one word back to a worker: stop the agent of an attempt it
    no longer wants (finalized by hand, or given up as lost and run again elsewhere). An
    agent such an attempt left running cost its tokens to its deadline, for an output the
    control then discarded. A key per attempt beside the review queue (Huey's key-value
    store: a table of review.db, a hash on Redis), set when a heartbeat comes from such an
    attempt, read by the worker after each heartbeat it sends, taken off by it or by the
    control once the attempt's outcome has come."""

    def __init__(self, huey: Huey) -> None:
        self.huey = huey

    PREFIX = "reviewq.stop."

    @classmethod
    def _key(cls, job_id: int, attempt: int) -> str:
        return f"{cls.PREFIX}{job_id}.{attempt}"

    def ask(self, job_id: int, attempt: int, reason: str, opened_at: object = None) -> None:
        """``opened_at``: the opening of the attempt whose agent is meant, as its beat
        carried it. The key names the attempt by numbers alone, which a state.db put back
        from a backup hands out again: with the opening, an agent of the other history
        is not stopped by it. A worker of an earlier release reads the pair as a reason
        and stops as before."""
        value = {"reason": reason, "opened_at": opened_at} if isinstance(opened_at, str) else reason
        self.huey.put(self._key(job_id, attempt), value)

    def asked(self, job_id: int, attempt: int, opened_at: object = None) -> str | None:
        """Why the control wants this attempt's agent stopped, or None. Looked at with a
        read first: nearly always there is nothing, and a SQLite pop writes the file. A
        request for an agent of another opening than ``opened_at`` (the review message's)
        is left where it is, for that agent or the control's sweep."""
        key = self._key(job_id, attempt)
        peeked = self.huey.get(key, peek=True)
        if peeked is None or not _meant_for(peeked, opened_at):
            return None
        value = self.huey.get(key)
        if isinstance(value, dict):
            return str(value.get("reason"))
        return str(value) if value is not None else None

    def forget(self, job_id: int, attempt: int) -> None:
        self.huey.delete(self._key(job_id, attempt))

    def pending(self) -> list[tuple[int, int]]:
        """The (job, attempt) of every request on the queue, for the reaper's sweep."""
        found = []
        for key in self.huey.storage.result_items():
            if key.startswith(self.PREFIX):
                job_id, _, attempt = key.removeprefix(self.PREFIX).partition(".")
                if job_id.isdigit() and attempt.isdigit():
                    found.append((int(job_id), int(attempt)))
        return found


def _meant_for(request: object, opened_at: object) -> bool:
    """Whether a stop request is for the agent of the attempt opened at ``opened_at``:
    either side unsaid (a release before openings were sent) is taken as a match."""
    said = request.get("opened_at") if isinstance(request, dict) else None
    return not isinstance(said, str) or not isinstance(opened_at, str) or said == opened_at


def refuses_writes(huey: Huey) -> tuple[str, str] | None:
    """Why the Redis queue refuses every write, in :func:`full_problem`'s words, or None:
    full (`maxmemory` under `noeviction`) or unable to save its snapshot (MISCONF).
    Tried with a write that changes nothing: a move from a key that is never there,
    which Redis refuses before it runs while either lasts."""
    from redis.exceptions import OutOfMemoryError

    probe = _probe_key(huey.storage.queue_key)
    try:
        huey.storage.conn.rpoplpush(probe, probe)
    except OutOfMemoryError:
        return (
            "full: `maxmemory` under `noeviction`",
            "make room on the server (another application's keys) or raise its `maxmemory`",
        )
    except _Unsaved:
        return (
            "its last snapshot failed, and `stop-writes-on-bgsave-error` stops writes until "
            "one succeeds",
            "its log says why the snapshot failed: make room on its disk (or its `dir` "
            f"writable), then a BGSAVE (or its next snapshot) lets writes through again; "
            f"{_moving_dir(huey.storage.conn)}, and `CONFIG SET stop-writes-on-bgsave-error "
            "no` lets writes through at once but leaves it unsaved",
        )
    except Exception:  # noqa: BLE001 - away or refused otherwise: not this question's
        return None
    return None


def _moving_dir(conn) -> str:  # noqa: ANN001 - a redis.Redis
    """How a snapshot folder elsewhere is had on this server: Redis 7 refuses `CONFIG SET
    dir` at run time under `enable-protected-configs no` (its default), takes it from its
    own machine under `local` and from anyone under `yes`, and Redis 6.2 (no such setting)
    takes it; said as a restart alone, an operator of one that takes it restarted it."""
    try:
        said = conn.config_get("enable-protected-configs")
    except Exception:  # noqa: BLE001 - CONFIG refused (an ACL, renamed): not known
        said = None
    setting = said.get("enable-protected-configs") if isinstance(said, dict) else None
    if said == {} or setting == "yes":
        return "`CONFIG SET dir FOLDER` moves the snapshot elsewhere, then a BGSAVE"
    if setting == "local":
        return (
            "`CONFIG SET dir FOLDER` from a client on its own machine (`enable-protected-configs "
            "local`) moves the snapshot elsewhere, then a BGSAVE"
        )
    if setting == "no":
        return (
            "a snapshot folder elsewhere takes a restart (Redis refuses `CONFIG SET dir` while "
            "it runs: `enable-protected-configs no`)"
        )
    return (
        "a snapshot folder elsewhere: `CONFIG SET dir FOLDER` where the server takes it "
        "(Redis 7 refuses it under `enable-protected-configs no`, its default), else a restart"
    )


def refusal_problem(settings: Settings, why: tuple[str, str]) -> str:
    """The words for a Redis queue that answers but refuses every write (``why``:
    :func:`refuses_writes`'s reason and remedy), as doctor says it beside its "answers"."""
    reason, remedy = why
    return (
        f"{queue_where(settings)}: the Redis server refuses writes ({reason}): no review is "
        f"sent and no outcome comes back until it takes them again (the control and the "
        f"workers wait it out); {remedy}"
    )


def full_problem(settings: Settings, fed: dict, why: tuple[str, str]) -> str:
    """The words for a queue whose control is silent because its Redis refuses writes
    (``why``: :func:`refuses_writes`'s reason and remedy)."""
    reason, remedy = why
    return (
        f"{queue_where(settings)}: the Redis server refuses writes ({reason}), so the control "
        f"(the last, on {fed.get('host')}, state folder {fed.get('state')}) cannot say it "
        f"feeds this queue, nor any process send a message; {remedy}"
    )


def unfed_problem(settings: Settings) -> str:
    """The words for a Redis queue no control process has fed, for doctor and the worker."""
    where = queue_where(settings)
    return (
        f"{where}: no control process has ever fed this queue, so a worker here would wait "
        "for good: give the URL the Redis database (the /N or ?db=N) and server of the "
        "control's reviewq.toml, or, on a new install, start `reviewq control` first"
    )


class _Unrevoked:
    """Huey reads a task's revoke flags before it runs it and clears its own after, two
    reads of the queue for every message (the worker's and the control's); reviewq never
    revokes a task, so neither ever found one. A key of its own (a stop request) is read
    and deleted as ever."""

    def is_revoked(self, task, timestamp=None, peek=True) -> bool:  # noqa: ANN001 - Huey's
        return False

    def delete(self, key):  # noqa: ANN001, ANN201 - Huey's signature
        if isinstance(key, str) and key.startswith("r:"):  # Task.revoke_id
            return False
        return super().delete(key)  # type: ignore[misc]


class _Readable:
    """A message Huey cannot read (a pickle cut short or damaged, a task name this release
    does not register: a later release's) is dropped as it is met, in one line: Huey's
    consumer logged a traceback at each read, and the control queue handed the same one
    out three times before it went. Nothing reads it later: its attempt runs again once
    the control gives it up (a review message found gone, an outcome never come)."""

    def dequeue(self):  # noqa: ANN201 - Huey's signature
        data = self.storage.dequeue()  # type: ignore[attr-defined]
        if data is None:
            return None
        try:
            return self.deserialize_task(data)  # type: ignore[attr-defined]
        except Exception as exc:  # noqa: BLE001 - whatever unpickling raises
            # Off the queue: a held one released, any other taken by the read already.
            self.storage._drop(  # type: ignore[attr-defined]
                1,
                f"unreadable ({type(exc).__name__}: {exc}): damaged, or sent by a reviewq "
                "release with a task this one does not have; its attempt runs again once "
                "the control gives it up",
            )
            return None


class _SqliteHuey(_Readable, _Unrevoked, SqliteHuey):
    pass


class _RedisHuey(_Readable, _Unrevoked, RedisHuey):
    pass


def close_huey(huey: Huey) -> None:
    """Close what ``huey`` holds open (a SQLite connection and its doorbell, or Redis
    connections); it opens them again if used after."""
    huey.storage.close()


def huey_for(settings: Settings, queue: str) -> Huey:
    url = settings.queue.url
    if url:
        # blocking=True: idle workers wait on BRPOP and see a message at once.
        huey = _RedisHuey(
            f"reviewq-{queue}",
            connection_pool=redis_pool(url),
            results=False,
            utc=True,
            blocking=True,
            read_timeout=1,
            storage_class=RedisQueueStorage,
            holds=queue == "control",
        )
        huey.storage.where = queue_where(settings)
        return huey
    folder = settings.state_dir / "queue"
    try:
        make_folder(folder, "its SQLite queues")
    except NotAFolder as exc:
        raise StoreError(str(exc)) from None
    path = folder / f"{queue}.db"
    try:
        return _SqliteHuey(
            queue,
            filename=str(path),
            results=False,
            utc=True,
            timeout=30,
            storage_class=QueueStorage,
            idle_look=settings.queue.poll_seconds,
            holds=queue == "control",
        )
    except sqlite3.DatabaseError as exc:
        if isinstance(exc, sqlite3.OperationalError):  # locked, read-only: the caller's
            raise
        raise StoreError(
            f"{path}: {exc}. The file holds queue messages only: stop every reviewq process, "
            "move it aside and start again; queued jobs are sent again from state.db and "
            "attempts in flight re-run"
        ) from None


# What a queue backend raises while it is unavailable (Redis down or restarting, or full:
# `maxmemory` reached under `noeviction` refuses every write, BLMOVE and LPUSH alike, until
# room is made, and so does a Redis whose last snapshot failed (MISCONF, a full disk) until
# one succeeds; a SQLite queue file locked past its busy timeout): sends retry on it,
# consumers wait it out.
# Redis's own join it in _with_redis, before any Redis connection can raise them; read it
# as `queues.QUEUE_UNAVAILABLE` where it is caught, not as a copy taken at import.
QUEUE_UNAVAILABLE: tuple[type[BaseException], ...] = (sqlite3.OperationalError, ConnectionError)


class _RedisTimeout(Exception):  # noqa: N818 - redis's TimeoutError once _with_redis ran
    pass


class _Demoted(Exception):  # noqa: N818 - a redis ConnectionError once _with_redis ran
    pass


class _Unsaved(Exception):  # noqa: N818 - a redis ResponseError once _with_redis ran
    pass


# A Redis that refuses this client's user or password (redis's own, once _with_redis ran).
_CREDENTIALS_REFUSED: tuple[type[BaseException], ...] = ()


def _with_redis() -> None:
    """What a Redis queue needs of the redis package, imported here rather than with Huey
    (see the top of this module): Huey's storage module given the names its import
    went without, and Redis's unavailable errors among QUEUE_UNAVAILABLE."""
    global QUEUE_UNAVAILABLE, _RedisTimeout, _Demoted, _Unsaved, _CREDENTIALS_REFUSED
    import huey.storage
    from redis import ConnectionPool, Redis
    from redis.exceptions import (
        AuthenticationError,
        AuthorizationError,
        OutOfMemoryError,
        ResponseError,
    )
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeout

    if huey.storage.Redis is None:
        huey.storage.ConnectionPool, huey.storage.Redis = ConnectionPool, Redis
        huey.storage.ConnectionError = RedisConnectionError
        huey.storage.TimeoutError = RedisTimeout
        huey.storage.RedisStorage.redis_client = Redis
    _RedisTimeout = RedisTimeout
    _CREDENTIALS_REFUSED = (AuthenticationError, AuthorizationError)
    if not issubclass(_Demoted, RedisConnectionError):
        _Demoted = type("ServerDemoted", (RedisConnectionError,), {})
    if not issubclass(_Unsaved, ResponseError):
        _Unsaved = type("WritesStopped", (ResponseError,), {})
    QUEUE_UNAVAILABLE = (
        sqlite3.OperationalError,
        RedisConnectionError,
        RedisTimeout,
        OutOfMemoryError,
        _Unsaved,
        ConnectionError,
    )


# None there is redis blocked as not installed (a test's, an embedder's): Huey took it so.
if sys.modules.get("redis") is not None:  # imported before Huey (a test, a caller's own use)
    _with_redis()


def queue_clock(huey: Huey) -> float:
    """Seconds since the epoch by the queue's clock: the Redis server's, which the control
    process and every worker read alike whatever their own clocks say; for SQLite (one
    machine) this machine's."""
    storage = huey.storage
    if isinstance(storage, RedisStorage):
        seconds, micros = storage.conn.time()
        return seconds + micros / 1e6
    return time.time()


def waiting(huey: Huey, limit: int, max_bytes: int | None = None) -> list[tuple[object, Any]]:
    """Up to ``limit`` messages waiting on ``huey``, oldest first, each with the token
    :func:`acknowledge` takes it off the queue by: they stay on it until then, so a
    process killed before it has kept what they say loses none of them. Only for a queue
    with one consumer (the control queue), which nothing else reads meanwhile. Never the
    blocking read the consumer uses; a queue that does not answer counts as empty. With
    ``max_bytes``, no more than that many bytes of messages (but always one): outcomes
    carry outputs of up to 5 MiB, and a hundred of them cost the control 1.3 GB."""
    storage = huey.storage
    budget = max_bytes if max_bytes is not None else float("inf")
    try:
        if isinstance(storage, RedisStorage):
            found = _redis_waiting(storage, limit, budget)
        else:
            sizes = storage.sql(
                "select id, length(data) from task where queue = ? and id is not ? "
                "order by priority desc, id limit ?",
                (storage.name, getattr(storage, "held", None), limit),
                results=True,
            )
            ids = _within(sizes, budget)
            rows = storage.sql(
                "select id, data from task where id in (select value from json_each(?)) "
                "order by priority desc, id",
                (json.dumps(ids),),
                results=True,
            )
            # A row id with the file it names a row of (QueueStorage._same_file).
            found = [((storage.file_generation, i), data) for i, data in rows]
    except QUEUE_UNAVAILABLE:
        return []
    read = []
    for token, data in found:
        # One Huey cannot read is passed over, left where it is: the consumer drops it,
        # saying so, when it comes to it. Raised here, it failed every batch behind which
        # it waited, and every tick.
        with contextlib.suppress(Exception):
            read.append((token, huey.deserialize_task(data)))
    return read


def attempts_on(huey: Huey, wanted: set[tuple[int, int]]) -> set[tuple[int, int]] | None:
    """Which of the ``wanted`` (job_id, attempt) have a review message waiting on
    ``huey``, which the control process asks of attempts it has not heard of; None when
    the queue cannot be read (then nothing is known: an empty answer would call every one
    of them taken). Read a few messages at a time until all are found: messages
    carry prompts of up to MiBs, and the messages of attempts given up stay on the queue
    until a worker drops them."""
    found: set[tuple[int, int]] = set()
    try:
        with _each_message(huey.storage) as messages:
            for data in messages:
                try:
                    msg = huey.deserialize_task(data).args[0]
                except Exception:  # noqa: BLE001, S112 - not a message a worker would run either
                    continue
                key = (msg.get("job_id"), msg.get("attempt")) if isinstance(msg, dict) else None
                if key in wanted:
                    found.add(key)
                    if found == wanted:
                        break
    except Exception as exc:  # noqa: BLE001 - the reaper goes on with what it knows
        logs.get().warning(
            "queue.unreadable", queue=huey.name, error=f"{type(exc).__name__}: {exc}"
        )
        return None
    return found


@contextlib.contextmanager
def _each_message(storage: Any) -> Iterator[Iterator[bytes]]:  # noqa: ANN401 - a Huey storage
    """The messages on a queue, one at a time."""
    if isinstance(storage, RedisStorage):
        yield _redis_each(storage)
        return
    with storage.db() as cursor:
        cursor.execute(
            "select data from task where queue = ? order by priority desc, id", (storage.name,)
        )
        yield (row[0] for row in cursor)


def _redis_each(storage: RedisStorage, step: int = 16) -> Iterator[bytes]:
    """From the head (the newest): a push there moves the rest further on, so a message
    may be read twice but none is skipped, which reading from the tail while workers pop
    it would do."""
    start = 0
    while True:
        chunk = storage.conn.lrange(storage.queue_key, start, start + step - 1)
        yield from chunk
        start += len(chunk)
        if len(chunk) < step:
            return


def _within(sized: Iterable[tuple[Any, int]], budget: float) -> list[Any]:
    """The first of (token, size) that fit in ``budget`` bytes, and at least one."""
    chosen, total = [], 0
    for token, size in sized:
        if chosen and total + size > budget:
            break
        chosen.append(token)
        total += size
    return chosen


def _redis_waiting(storage: RedisStorage, limit: int, budget: float) -> list[tuple[bytes, bytes]]:
    """The oldest messages (LPUSH puts the newest at the head: these are at the tail), read
    a few at a time so that the budget bounds what is read, not only what is kept."""
    found: list[tuple[bytes, bytes]] = []
    total, step = 0, 4
    while len(found) < limit:
        hi = -1 - len(found)
        chunk = storage.conn.lrange(storage.queue_key, hi - step + 1, hi)
        for data in reversed(chunk):
            if len(found) == limit or (found and total + len(data) > budget):
                return found
            found.append((data, data))
            total += len(data)
        if len(chunk) < step:
            break
    return found


# A queue that is unavailable (Redis restarting, a file locked past its busy timeout) is
# waited for, up to two minutes, before the write gives up.
SEND_PATIENCE_S = 120.0
_WHILE_UNAVAILABLE = {
    "retry": retry_if_exception(lambda exc: isinstance(exc, QUEUE_UNAVAILABLE)),
    "wait": wait_exponential(multiplier=0.2, max=10),
    "stop": stop_after_delay(SEND_PATIENCE_S),
    "reraise": True,
}


@retry(**_WHILE_UNAVAILABLE)
def acknowledge(huey: Huey, tokens: list[object]) -> None:
    """Take messages :func:`waiting` returned off the queue, once what they say is kept."""
    if not tokens:
        return
    storage = huey.storage
    if isinstance(storage, RedisStorage):
        pipe = storage.conn.pipeline()
        for data in tokens:
            pipe.lrem(storage.queue_key, -1, data)  # from the tail: the oldest copy
        pipe.execute()
    else:
        storage.take_rows(tokens)


@retry(**_WHILE_UNAVAILABLE)
def requeue(huey: Huey, task: Any) -> None:
    """Put a task :func:`waiting` returned back on ``huey`` as a new message."""
    huey.enqueue(task)


@retry(**_WHILE_UNAVAILABLE)
def release(huey: Huey) -> None:
    """Take the message the consumer is running off ``huey`` if it holds it (the control
    queue: :class:`_Holding`), once its task has run."""
    if getattr(huey.storage, "holds", False):
        huey.storage.release()  # type: ignore[attr-defined]


def install_app(app: App) -> None:
    global _app
    if _app is not None and _app is not app:
        # Weakly: an app nothing holds any more is closed by the collector (its SQLite
        # connections), not kept for a later close that never comes.
        app.replaced = weakref.ref(_app)
    _app = app


def the_app() -> App:
    if _app is None:
        raise RuntimeError("workers.app.make_app() was not called in this process")
    return _app


# An outcome is an agent's run, paid for: worth waiting out a longer outage (Redis
# restarted, a network down) than a heartbeat or a nudge is. Given up after two minutes,
# the outcome was dropped and the agent ran again once the reaper took its attempt back.
OUTCOME_PATIENCE_S = 3600.0


def said_retrying(rs: Any) -> None:
    logs.get().warning(
        # `try`, not `attempt`: the log binds a job's attempt number under that name.
        "queue.retrying",
        **{"try": rs.attempt_number},
        error=logs.error_said(rs.outcome.exception()),
    )


def stop_requests() -> StopRequests:
    """The control's requests to stop an agent, on this process's review queue."""
    return StopRequests(the_app().review)


def send(task: str, *args: Any, patience_s: float | None = None) -> None:
    """Enqueue ``task`` on its queue, retrying while the queue backend is unavailable, for
    up to ``patience_s`` (:data:`SEND_PATIENCE_S` unless given); then the error is raised.
    Every failure is said, the first too: an outage shorter than two busy timeouts is
    otherwise silent."""
    begun = time.monotonic()
    try:
        send_once(task, *args)
        return
    except QUEUE_UNAVAILABLE as exc:
        failed = [exc]  # the first try's, raised again as tenacity's own first try
    # The retries alone go through tenacity: its machinery cost every message ~20 µs.

    def again() -> None:
        if failed:
            raise failed.pop()
        send_once(task, *args)

    # Tenacity times its patience from its own start: the first try's wait (a busy
    # timeout) counts too, as when tenacity made that try.
    waited = time.monotonic() - begun
    patience = stop_after_delay(
        max(0.0, (SEND_PATIENCE_S if patience_s is None else patience_s) - waited)
    )
    Retrying(**{**_WHILE_UNAVAILABLE, "stop": patience}, before_sleep=said_retrying)(again)


def impatient(app: App) -> None:
    """``app``'s sends give up after the probe's timeout of silence, for a person's
    one-off command (its dispatch nudge, which the control's next tick makes good): the
    queue's connections have no read timeout, so that a stall is waited out, and
    `enqueue` beside a Redis that answered nothing (stopped, paused) never ended. Before
    any connection is made. A URL's own shorter ``socket_timeout`` is kept."""
    for huey in (app.review, app.control):
        kwargs = getattr(getattr(huey.storage, "pool", None), "connection_kwargs", None)
        if isinstance(kwargs, dict):
            own = kwargs.get("socket_timeout")
            kwargs["socket_timeout"] = min(own, _PROBE_S) if own else _PROBE_S


def send_once(task: str, *args: Any) -> None:
    """Enqueue ``task`` once, without retrying: for a nudge whose loss the control's
    next tick makes good, where a person should not wait for a queue that is down."""
    wrapper = the_app().wrappers.get(task)
    if wrapper is None:
        raise RuntimeError(f"task {task} is not registered")
    wrapper(*args)  # type: ignore[operator]


_NOT_MOVED: set[str] = set()  # the SQLite queue files move_left_behind could not read


# A message the move sends is marked in the script that sends it, and the mark is
# deleted once its row's delete from the SQLite file committed: a move killed between the
# send and that commit left the message in both, and the next move sent it again (a review
# run, its agent paid, twice). A mark found says it was sent: the row is only taken off.
# Never expiring: a Redis under a `volatile-*` policy evicts keys that expire first when
# full, and an expiring mark evicted before the next move had that message sent again. A
# mark whose delete failed (Redis away just after the commit) is left: a few bytes no
# later move meets (each message its own uuid).
_MOVE_IN_LUA = """
if redis.call('set', KEYS[1], '1', 'NX') then
    if ARGV[2] == '' then
        redis.call('lpush', KEYS[2], ARGV[1])
    else
        redis.call('zadd', KEYS[2], ARGV[2], ARGV[1])
    end
end
"""


def _move_in(storage: Any, data: bytes, at: float | None) -> str:
    """Send one message of a SQLite file onto ``storage`` (a Redis queue's), unless its
    mark says it was sent already: queued (``at`` None) or scheduled. Scheduled through
    the storage beneath the control queue's own add_to_schedule, which is its consumer's
    (a retry replacing the message it holds) and releases that message: called from the
    ticker, it took the message the consumer was running off the queue before its
    task's commit. The mark's key, deleted once the row's delete commits."""
    mark = f"{storage.queue_key}.moved.{_digest(data)}"
    if at is None:  # in the file's order; Redis takes no priority
        args = [data, ""]
        target = storage.queue_key
    else:  # Huey's SQLite wrote a naive UTC time as the local one
        args = [data, storage.convert_ts(datetime.fromtimestamp(at))]
        target = storage.schedule_key
    storage.conn.eval(_MOVE_IN_LUA, 2, mark, target, *args)
    return mark


def move_left_behind(settings: Settings, hueys: dict[str, Huey]) -> None:
    """Messages the state folder's SQLite queues still hold while ``[queue] url`` names a
    Redis, moved onto it (``hueys``: the Redis queues, by the SQLite file's name). Left
    there, an agent's outcome sent before the switch (a worker ending its attempt after
    the control stopped, or one not restarted since) was never read: the control gave
    the finished attempt up as lost and its agent was paid again; a review message
    waited out its lease and timeout before it was sent anew. Each message is sent
    inside the transaction that deletes it from the file, marked on the Redis until that
    commits (:func:`_move_in`): a failure before the commit leaves it in the file, to be
    taken off unsent if it was sent, so none is lost or sent twice."""
    if not settings.queue.url:
        return
    for name, huey in hueys.items():
        path = settings.state_dir / "queue" / f"{name}.db"
        if not path.is_file():  # the usual case: a state folder that never had SQLite queues
            continue
        moved = 0
        conn = sqlite3.connect(path, timeout=30, isolation_level=None)
        try:
            rows = conn.execute(
                "SELECT id, data, NULL FROM task WHERE queue = ? ORDER BY priority DESC, id",
                (name,),
            ).fetchall()
            rows += conn.execute(
                "SELECT id, data, timestamp FROM schedule WHERE queue = ? ORDER BY id",
                (name,),
            ).fetchall()
            for row_id, data, at in rows:
                table = "task" if at is None else "schedule"
                conn.execute("BEGIN IMMEDIATE")
                mark = None
                try:
                    # A SQLite worker not yet restarted may take it first: then it is its.
                    if conn.execute(f"DELETE FROM {table} WHERE id = ?", (row_id,)).rowcount:
                        mark = _move_in(huey.storage, bytes(data), at)
                        moved += 1
                    faults.point("queue.move_sent")
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                if mark is not None:
                    with contextlib.suppress(Exception):  # left: the row is gone for good
                        huey.storage.conn.delete(mark)
        except sqlite3.DatabaseError as exc:
            if str(path) not in _NOT_MOVED:  # once, not at every tick
                _NOT_MOVED.add(str(path))
                logs.get().error("queue.not_moved", file=str(path), error=str(exc))
            continue
        finally:
            conn.close()
        if moved:
            logs.get().warning(
                "queue.moved",
                file=str(path),
                messages=moved,
                queue=shown_url(settings.queue.url),
                reason="[queue] url names a Redis now; these messages were left in the "
                "SQLite queue it replaced",
            )
