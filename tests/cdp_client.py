"""A small Chrome DevTools Protocol client on the standard library, for tests that drive a real
headless Chromium. `--remote-debugging-pipe` makes Chromium read commands from its fd 3 and write
responses and events to its fd 4, each message one JSON object ended by a NUL byte, so no
WebSocket library is needed.

    with Browser.launch(executable, profile_dir) as browser:
        page = browser.new_page()
        page.navigate(url)
        page.click("#send")
"""
from __future__ import annotations

import base64
import json
import os
import subprocess
import threading
import time
from typing import Optional


class CDPError(RuntimeError):
    pass


class Browser:
    """One Chromium process and the DevTools pipe to it. Every message read is kept in `events`
    (in arrival order), so a test can look for console errors after the fact."""

    def __init__(self, proc: subprocess.Popen, to_browser: int, from_browser: int, log_path: str):
        self.proc = proc
        self.log_path = log_path
        self._out = to_browser
        self._in = from_browser
        self._next_id = 0
        self._lock = threading.Lock()
        self._arrived = threading.Condition()
        self._responses = {}
        self.events = []
        self._closed = False
        self._reader = threading.Thread(target=self._read, name="cdp-reader", daemon=True)
        self._reader.start()

    @classmethod
    def launch(cls, executable: str, profile_dir: str, width: int = 1000, height: int = 700) -> "Browser":
        cmd_read, cmd_write = os.pipe()
        resp_read, resp_write = os.pipe()
        log_path = os.path.join(profile_dir, "chromium.log")
        flags = [
            "--headless=new", "--disable-gpu", f"--user-data-dir={profile_dir}", "--remote-debugging-pipe",
            # The sandbox cannot run as root, nor in containers without user namespaces; these
            # tests load only their own local page.
            "--no-sandbox",
            "--disable-dev-shm-usage",   # containers often give /dev/shm only 64 MB
            "--no-first-run", "--no-default-browser-check", "--disable-extensions",
            f"--window-size={width},{height}", "about:blank",
        ]
        # The pipes come in as the child's stdin and stdout (which subprocess sets up without a
        # preexec_fn, unsafe in a process with threads); sh moves them to fds 3 and 4.
        script = 'exec "$@" 3<&0 4>&1 </dev/null >&2'
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(["sh", "-c", script, "sh", executable, *flags],
                                    stdin=cmd_read, stdout=resp_write, stderr=log)
        os.close(cmd_read)
        os.close(resp_write)
        return cls(proc, cmd_write, resp_read, log_path)

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def log_tail(self, n: int = 2000) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")[-n:]

    # ---- the pipe ----------------------------------------------------------------------------
    def _read(self) -> None:
        buffer = b""
        while True:
            try:
                data = os.read(self._in, 1 << 16)
            except OSError:
                data = b""
            if not data:
                break
            buffer += data
            *messages, buffer = buffer.split(b"\0")
            with self._arrived:
                for raw in messages:
                    message = json.loads(raw)
                    if "id" in message:
                        self._responses[message["id"]] = message
                    else:
                        self.events.append(message)
                self._arrived.notify_all()
        with self._arrived:
            self._closed = True
            self._arrived.notify_all()

    def send(self, method: str, params: Optional[dict] = None, session: Optional[str] = None,
             timeout: float = 30.0) -> dict:
        """Sends one command and returns its result; CDPError if Chromium answers with an error."""
        with self._lock:
            self._next_id += 1
            message_id = self._next_id
            message = {"id": message_id, "method": method, "params": params or {}}
            if session is not None:
                message["sessionId"] = session
            os.write(self._out, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        with self._arrived:
            while message_id not in self._responses:
                left = deadline - time.monotonic()
                if self._closed or left <= 0:
                    why = "Chromium closed the pipe" if self._closed else f"no answer in {timeout} s"
                    raise CDPError(f"{method}: {why}; its log ends:\n{self.log_tail()}")
                self._arrived.wait(left)
            response = self._responses.pop(message_id)
        if "error" in response:
            raise CDPError(f"{method}: {response['error']}")
        return response["result"]

    def wait_event(self, method: str, session: Optional[str] = None, since: int = 0, timeout: float = 30.0) -> dict:
        """The first event `method` (of `session`, if given) at index `since` or later in `events`."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while True:
                for event in self.events[since:]:
                    if event["method"] == method and (session is None or event.get("sessionId") == session):
                        return event
                left = deadline - time.monotonic()
                if self._closed or left <= 0:
                    raise CDPError(f"no {method} event in {timeout} s")
                self._arrived.wait(left)

    def new_page(self) -> "Page":
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        return Page(self, session)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send("Browser.close", timeout=5)
            except (CDPError, OSError):
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        os.close(self._out)
        self._reader.join(5)
        os.close(self._in)


class Page:
    """One tab, driven through its flattened session: real mouse and keyboard input, page
    evaluation for reading state, screenshots."""

    def __init__(self, browser: Browser, session: str):
        self.browser = browser
        self.session = session
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable")

    def send(self, method: str, params: Optional[dict] = None, timeout: float = 30.0) -> dict:
        return self.browser.send(method, params, self.session, timeout)

    def navigate(self, url: str, timeout: float = 30.0) -> None:
        since = len(self.browser.events)
        result = self.send("Page.navigate", {"url": url})
        if result.get("errorText"):
            raise CDPError(f"navigating to {url}: {result['errorText']}")
        self.browser.wait_event("Page.loadEventFired", self.session, since, timeout)

    def evaluate(self, expression: str):
        """The JSON value of a JavaScript expression (a promise is awaited)."""
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True})
        if "exceptionDetails" in result:
            raise CDPError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0, poll: float = 0.02):
        """Evaluates `expression` until it is truthy, and returns that value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expression!r} stayed {value!r} for {timeout} s")
            time.sleep(poll)

    def click(self, selector: str) -> None:
        """A left click in the middle of the element, as mouse events (so the page sees a real click)."""
        box = self.evaluate(f"(() => {{ const r = document.querySelector({json.dumps(selector)})"
                            f".getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; }})()")
        x, y = box
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            params = {"type": kind, "x": x, "y": y}
            if kind != "mouseMoved":
                params.update(button="left", clickCount=1)
            self.send("Input.dispatchMouseEvent", params)

    def type(self, text: str) -> None:
        """Types into the focused element, replacing its selection."""
        self.send("Input.insertText", {"text": text})

    def select_all(self) -> None:
        self.send("Input.dispatchKeyEvent", {"type": "rawKeyDown", "key": "a", "code": "KeyA",
                                             "windowsVirtualKeyCode": 65, "modifiers": 2, "commands": ["selectAll"]})
        self.send("Input.dispatchKeyEvent", {"type": "keyUp", "key": "a", "code": "KeyA",
                                             "windowsVirtualKeyCode": 65, "modifiers": 2})

    def press_enter(self) -> None:
        key = {"key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13}
        self.send("Input.dispatchKeyEvent", dict(key, type="keyDown", text="\r"))
        self.send("Input.dispatchKeyEvent", dict(key, type="keyUp"))

    def screenshot(self, path: str) -> None:
        data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def errors(self) -> list:
        """The page's error-level console messages, uncaught exceptions and log entries so far."""
        found = []
        for event in list(self.browser.events):
            if event.get("sessionId") != self.session:
                continue
            params = event.get("params", {})
            if event["method"] == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                found.append(details.get("exception", {}).get("description") or details.get("text"))
            elif event["method"] == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
                found.append(" ".join(str(a.get("value", a.get("description"))) for a in params["args"]))
            elif event["method"] == "Log.entryAdded" and params["entry"]["level"] == "error":
                found.append(f"{params['entry']['text']} ({params['entry'].get('url', '')})")
        return found
