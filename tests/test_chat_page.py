"""ember-server's chat page in a real headless Chromium (the OS package), on the real SmolLM2
model: typed input streams a reply that grows on screen, tokens/s shows, Stop cuts a long reply
short (and the engine lets go of it), the console stays free of errors, and a screenshot is saved
to $EMBER_SCREENSHOT_DIR (else the test's tmp_path)."""
import os
import pathlib
import re
import shutil

import pytest

from cdp_client import Browser
from ember.server.app import create_app
from test_server import engine, idle, live_server, llm   # noqa: F401  (engine and llm: fixtures)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium)")
STORY = "Write a long story about a dragon."   # SmolLM2 at temperature 0 goes on past 300 tokens

# Notes the reply's text after each change the page makes to it, so every step of the streaming
# is seen, whatever the timing of the test's own polling.
RECORD_REPLIES = """
window.replySteps = [];
new MutationObserver(() => {
  const replies = document.querySelectorAll(".msg.assistant");
  if (replies.length) window.replySteps.push(replies[replies.length - 1].textContent);
}).observe(document.getElementById("log"), {childList: true, subtree: true, characterData: true});
"""
LAST_REPLY = "document.getElementById('log').lastElementChild"
IDLE_PAGE = "!document.getElementById('send').disabled && !document.querySelector('[aria-busy]')"


@pytest.fixture
def page(tmp_path):
    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    with Browser.launch(CHROMIUM, str(profile)) as browser:
        yield browser.new_page()


def send_message(page, text, max_tokens):
    page.click("#max-tokens")
    page.select_all()
    page.type(str(max_tokens))
    page.click("#input")
    page.type(text)
    page.press_enter()


def test_chat_page_streams_and_stops(engine, page, tmp_path):   # noqa: F811
    with live_server(create_app(engine)) as url:
        page.navigate(url + "/")
        page.evaluate(RECORD_REPLIES)
        page.click("#temperature")
        page.type("0")

        # A short reply, streamed: the bubble's text grows step by step to the whole reply.
        send_message(page, STORY, 16)
        page.wait_for(IDLE_PAGE)
        steps = [s for s in page.evaluate("window.replySteps") if s]
        reply = page.evaluate(f"{LAST_REPLY}.textContent")
        assert reply and steps[-1] == reply
        assert len(set(steps)) >= 2, f"the reply did not appear progressively: {steps}"
        assert all(reply.startswith(s) for s in steps), steps
        stats = page.evaluate("document.getElementById('stats').textContent")
        assert re.fullmatch(r"16 tokens, \d+\.\d tokens/s, first token \d+ ms", stats), stats

        # A long reply, stopped after its first words: it ends early, and the server cancels it.
        send_message(page, STORY, 300)
        page.wait_for(f"{LAST_REPLY}.getAttribute('aria-busy') && {LAST_REPLY}.textContent.length >= 20")
        page.click("#stop")
        page.wait_for(IDLE_PAGE, timeout=10)
        stopped = page.evaluate(f"{LAST_REPLY}.textContent")
        assert page.evaluate(f"{LAST_REPLY}.classList.contains('stopped')")
        stats = page.evaluate("document.getElementById('stats').textContent")
        n_tokens = int(re.match(r"(\d+) tokens, [-\d.]+ tokens/s, first token \d+ ms, stopped$", stats)[1])
        assert 0 < n_tokens < 300, stats
        assert idle(engine), "the engine still runs the stopped request"
        assert page.evaluate(f"{LAST_REPLY}.textContent") == stopped

        shots = pathlib.Path(os.environ.get("EMBER_SCREENSHOT_DIR") or tmp_path)
        shots.mkdir(parents=True, exist_ok=True)
        shot = shots / "chat_page.png"
        page.screenshot(str(shot))
        print(f"chat page screenshot: {shot}")
        assert shot.stat().st_size > 0

    assert page.errors() == []
