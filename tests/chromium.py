"""Headless Chromium driven over the DevTools protocol through a pipe (stdlib only).

``--remote-debugging-pipe`` makes Chromium read protocol messages from fd 3 and write to
fd 4, each a JSON text ended by a NUL: no port, no websocket library. Every wait has a
deadline, and the whole process group is killed and awaited on close.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

FLAGS = [
    "--headless",
    "--no-sandbox",  # tests run as root, where Chromium's sandbox cannot start
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-pipe",
]
DEADLINE_S = 60.0


def executable() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class Chromium:
    def __init__(self, exe: str, profile_dir: Path) -> None:
        cmd_r, self._cmd_w = os.pipe()
        self._resp_r, resp_w = os.pipe()

        def fds() -> None:  # in the child: the pipe ends where Chromium looks for them
            os.dup2(cmd_r, 3)
            os.dup2(resp_w, 4)

        # Chromium keeps its singleton socket in a folder of TMPDIR that a kill leaves
        # behind: a folder of its own holds it, removed on close. Short and in /tmp, not
        # under the test's folder: a unix socket's path is at most 107 bytes, and under a
        # pytest-xdist process's (/tmp/pytest-of-USER/pytest-N/popen-gwN/...) Chromium's
        # was 102, its start failing ("closed its pipe") past a 46-byte base folder.
        # Named by this process's pid: one killed outright leaves it, and the next test
        # run removes it (tests/leftovers.py).
        self.tmp_dir = Path(tempfile.mkdtemp(prefix=f"rq-chromium-{os.getpid()}-", dir="/tmp"))
        self.proc = subprocess.Popen(
            [exe, *FLAGS, f"--user-data-dir={profile_dir}", "about:blank"],
            env={**os.environ, "TMPDIR": str(self.tmp_dir)},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(3, 4),
            preexec_fn=fds,
            start_new_session=True,  # its renderers and helpers share one group to kill
        )
        os.close(cmd_r)
        os.close(resp_w)
        self._buf = b""
        self._next_id = 0
        self.events: list[dict] = []

    # --- the protocol ------------------------------------------------------------------
    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("Chromium did not answer in time")
            # poll, not select(): select() refuses a descriptor past 1023, which the
            # suite's one process reaches.
            poller = select.poll()
            poller.register(self._resp_r, select.POLLIN)
            if poller.poll(left * 1000):
                chunk = os.read(self._resp_r, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"Chromium closed its pipe (exit {self.proc.poll()})")
                self._buf += chunk
        raw, _, self._buf = self._buf.partition(b"\0")
        return json.loads(raw)

    def call(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + DEADLINE_S
        while True:
            m = self._read_message(deadline)
            if m.get("id") == self._next_id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)

    def wait_event(self, method: str, session: str | None = None) -> dict:
        deadline = time.monotonic() + DEADLINE_S
        for i, e in enumerate(self.events):
            if e.get("method") == method and e.get("sessionId") == session:
                return self.events.pop(i)
        while True:
            m = self._read_message(deadline)
            if m.get("method") == method and m.get("sessionId") == session:
                return m
            self.events.append(m)

    # --- a page ------------------------------------------------------------------------
    def open(
        self,
        url: str,
        width: int = 1200,
        height: int = 900,
        mobile: bool = False,
        color_scheme: str | None = None,
        forced_colors: bool = False,
    ) -> Page:
        """``color_scheme``: the system's as the page's media queries see it (``dark``).
        ``forced_colors``: the system's own few colours forced on the page, as Windows'
        contrast themes do (``@media (forced-colors: active)``)."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        for domain in ("Network", "Page", "Log"):
            self.call(f"{domain}.enable", session=session)
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile},
            session,
        )
        features = [{"name": "prefers-color-scheme", "value": color_scheme}] if color_scheme else []
        if forced_colors:
            features.append({"name": "forced-colors", "value": "active"})
        if features:
            self.call("Emulation.setEmulatedMedia", {"features": features}, session)
        self.call("Page.navigate", {"url": url}, session)
        self.wait_event("Page.loadEventFired", session)
        return Page(self, session)

    def close(self) -> None:
        # A pidfd per process of the group turns readable when that process has exited:
        # the wait is bounded and needs no polling. A second round catches a process
        # forked between listing the group and killing it.
        deadline = time.monotonic() + 30
        for _ in range(3):
            fds = []
            for pid in group_members(self.proc.pid):
                with contextlib.suppress(OSError):
                    fds.append(os.pidfd_open(pid))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            if self.proc.returncode is None:
                self.proc.wait(timeout=30)
            try:
                poller = select.poll()  # not select(): see _read_message
                for fd in fds:
                    poller.register(fd, select.POLLIN)
                while fds and time.monotonic() < deadline:
                    for fd, _ in poller.poll(max(0.0, deadline - time.monotonic()) * 1000):
                        poller.unregister(fd)
                        fds.remove(fd)
                        os.close(fd)
            finally:
                for fd in fds:
                    os.close(fd)
            if not [p for p in group_members(self.proc.pid) if _alive(p)]:
                break
        for fd in (self._cmd_w, self._resp_r):
            with contextlib.suppress(OSError):
                os.close(fd)
        shutil.rmtree(self.tmp_dir, ignore_errors=True)  # its processes are gone

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Page:
    def __init__(self, browser: Chromium, session: str) -> None:
        self.browser = browser
        self.session = session

    def evaluate(self, expression: str):
        """Runs in DevTools' world: the page's Content-Security-Policy forbids its own
        scripts, not the inspector's."""
        res = self.browser.call(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True}, self.session
        )
        if "exceptionDetails" in res:
            raise RuntimeError(f"{expression}: {res['exceptionDetails']}")
        return res["result"].get("value")

    def press(self, key: str, code: int) -> None:
        """A key pressed and released, as a keyboard sends it (``"Tab"``, 9)."""
        for kind in ("keyDown", "keyUp"):
            self.browser.call(
                "Input.dispatchKeyEvent",
                {"type": kind, "key": key, "code": key, "windowsVirtualKeyCode": code},
                self.session,
            )

    def ax_node(self, expression: str) -> dict:
        """The accessibility tree's node of the element ``expression`` evaluates to, as a
        screen reader is given it (``role``, ``name``): Chromium's, through the protocol."""
        obj = self.browser.call("Runtime.evaluate", {"expression": expression}, self.session)
        params = {"objectId": obj["result"]["objectId"], "fetchRelatives": False}
        self.browser.call("Accessibility.enable", session=self.session)
        return self.browser.call("Accessibility.getPartialAXTree", params, self.session)["nodes"][0]

    def requests(self) -> list[str]:
        """Every URL the page asked for (the protocol reports even those it blocked)."""
        self.evaluate("1")  # a round trip: events sent before it have been read
        return [
            e["params"]["request"]["url"]
            for e in self.browser.events
            if e.get("sessionId") == self.session and e.get("method") == "Network.requestWillBeSent"
        ]

    def log_entries(self) -> list[dict]:
        self.evaluate("1")
        return [
            e["params"]["entry"]
            for e in self.browser.events
            if e.get("sessionId") == self.session and e.get("method") == "Log.entryAdded"
        ]

    def screenshot(self, path: Path, top: int = 0, height: int | None = None) -> Path:
        """The page from ``top`` down, ``height`` pixels (default: to its end)."""
        w, h = self.evaluate(
            "[document.documentElement.scrollWidth, document.documentElement.scrollHeight]"
        )
        height = min(height or h, h - top, 16000)
        params = {
            "format": "png",
            "captureBeyondViewport": True,
            "clip": {"x": 0, "y": top, "width": w, "height": height, "scale": 1},
        }
        data = self.browser.call("Page.captureScreenshot", params, self.session)["data"]
        path.write_bytes(base64.b64decode(data))
        return path


def group_members(pgid: int) -> list[int]:
    """The processes of a process group, from /proc."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            out.append(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for its new parent to reap it."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")
