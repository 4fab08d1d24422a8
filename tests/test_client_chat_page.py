"""The chat page's conversation controls (issue 43) in a real headless Chromium, on the real
SmolLM2 model: the model's name in the header, markdown rendered as DOM nodes and never as HTML,
New chat and the system prompt shaping what the next request sends."""
import json
import shutil

import pytest

from cdp_client import Browser
from ember.server.app import create_app
from ember.server.args import ServerSettings
from test_server import engine, live_server, llm   # noqa: F401  (engine and llm: fixtures)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium)")
IDLE_PAGE = "!document.getElementById('send').disabled && !document.querySelector('[aria-busy]')"
# Keeps the body of every request the page sends, to see which messages went out.
RECORD_REQUESTS = """
window.sent = [];
const realFetch = window.fetch;
window.fetch = (url, init) => {
  if (init && init.body) window.sent.push(JSON.parse(init.body));
  return realFetch(url, init);
};
"""


@pytest.fixture
def page(tmp_path):
    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    with Browser.launch(CHROMIUM, str(profile)) as browser:
        yield browser.new_page()


def say(page, text):
    n = page.evaluate("window.sent.length")
    page.click("#input")
    page.type(text)
    page.press_enter()
    page.wait_for(f"window.sent.length > {n} && " + IDLE_PAGE)


def test_markdown_is_rendered_as_nodes_only(engine, page):   # noqa: F811
    with live_server(create_app(engine)) as url:
        page.navigate(url + "/")
        reply = ("# Title\nSome **bold**, *soft* and `code` with <img src=x onerror=alert(1)>.\n\n"
                 "```python\nprint('<b>hi</b>')\n```\n- one\n- two\n1. first\n"
                 "[ok](https://example.com) and [bad](javascript:alert(1))")
        html = page.evaluate("(() => { const d = document.createElement('div'); renderMarkdown("
                             + json.dumps(reply) + ", d); return d.innerHTML; })()")
        assert "<h1>Title</h1>" in html and "<strong>bold</strong>" in html and "<em>soft</em>" in html
        assert "<code>code</code>" in html and '<pre><code class="language-python">' in html
        assert "&lt;img src=x onerror=alert(1)&gt;" in html and "<img" not in html
        assert "print('&lt;b&gt;hi&lt;/b&gt;')" in html
        assert "<ul><li>one</li><li>two</li></ul>" in html and "<ol><li>first</li></ol>" in html
        assert 'href="https://example.com"' in html and "javascript:" not in html.split("[bad]")[0]
        assert '<a href="javascript' not in html
    assert page.errors() == []


def test_model_name_new_chat_and_system_prompt(engine, page):   # noqa: F811
    with live_server(create_app(engine, ServerSettings(alias="smol-test"))) as url:
        page.navigate(url + "/")
        page.wait_for("document.getElementById('model').textContent === 'smol-test'")
        assert page.evaluate("document.title") == "ember: smol-test"
        page.evaluate(RECORD_REQUESTS)
        page.click("#max-tokens")
        page.type("4")
        say(page, "Hello there")
        say(page, "And again")
        assert [m["role"] for m in page.evaluate("window.sent")[-1]["messages"]] == ["user", "assistant", "user"]
        page.click("#new-chat")
        assert page.evaluate("document.getElementById('log').children.length") == 0
        page.evaluate("document.getElementById('system-box').open = true")
        page.click("#system")
        page.type("You are terse.")
        say(page, "Fresh start")
        sent = page.evaluate("window.sent")[-1]["messages"]
        assert sent == [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Fresh start"}]
        assert page.evaluate("document.querySelectorAll('.msg').length") == 2
    assert page.errors() == []
