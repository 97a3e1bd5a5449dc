"""The web chat (GET /, docs/server.md "Web chat") in headless Chromium, driven by selenium.

The server is `smelt serve --fake-forward --fake-reply TEXT` over test_server_tools' byte-level
vocabulary with test_server_anthropic's Qwen3-shaped template (it uses <think>, so a reply's
reasoning comes as reasoning_content): every answer is TEXT, token by token, so what the page
makes of a known reply can be checked exactly. Checked:
- a message sent, its answer seen streaming (partial, with the cursor) then complete: the
  reasoning folded, the markdown rendered (heading, bold, a highlighted code block), tokens
  and tok/s shown; the conversation titled in the list;
- the model picker lists /v1/models (two names here) and the request carries the chosen one
  and the settings (system prompt, temperature, top_p, top_k, min_p, max_tokens), all kept
  across a reload; every control shown has an accessible name; the conversation is there
  after a reload; rename and delete;
- Stop aborts a long answer: the page marks it stopped and the server cancels the request
  (its KV freed, the request logged 499);
- model output, reasoning, user text and titles never run script or inject markup past the
  sanitizer, whether they come from the stream or from the browser's storage (where
  malformed entries are skipped);
- a server with an API key: the page itself loads without it, asks for it on the 401 of
  /v1/models, and chats once it is given.

Chromium and chromedriver are Debian's (`chromium`, `chromium-driver`); without them the
tests skip, and under SMELT_REQUIRE_MODELS=1 (make test) that skip is a failure."""
import os
import shutil
import tempfile

import pytest

from smelt_server import SMELT, Server

gguf = pytest.importorskip("gguf")
selenium = pytest.importorskip("selenium")

from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import JavascriptException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

from test_server_anthropic import files  # noqa: E402,F401  (the vocabulary and template)

pytestmark = pytest.mark.skipif(not os.path.exists(SMELT), reason=f"no smelt binary at {SMELT}")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
WAIT = 20  # seconds: every wait is explicit, bounded, and returns as soon as it holds

REPLY = ("<think>\nI should greet back.\n</think>\n\n# Greeting\n\nHello, **world**.\n\n"
         "```python\ndef add(a, b):\n    return a + b\n```\n")
HOSTILE = ('Look: <img src=x onerror="window.__xss=1"> <script>window.__xss=2</script>\n\n'
           '[click](javascript:window.__xss=3) <a href="#" onclick="window.__xss=4">a</a>\n\n'
           '<form action="/x"><input name="key" placeholder="API key"></form>\n\n'
           '<div id="messages" style="color:red">clobber</div>\n\n'
           '<svg><script>window.__xss=5</script></svg><iframe src="javascript:window.__xss=6">'
           '</iframe>\n\n```html\n<img src=x onerror=alert(1)>\n```\n')


@pytest.fixture
def serve(files):
    """serve(reply, *args) -> a started server (stopped after the test), with its request log
    (test_server_anthropic's vocabulary and template: `files`)."""
    started = []

    def start(reply, *args):
        s = Server(files["vocab"], "--fake-forward", "--fake-reply", reply, "--served-model-name",
                   "m", "--served-model-name", "alt", "--chat-template", files["tmpl"], *args,
                   start_timeout=30)
        started.append(s)
        return s
    yield start
    for s in started:
        assert s.stop() == 0, s.log()


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM or not DRIVER:
        pytest.skip("SKIP chromium or chromedriver absent (Debian: apt-get install chromium "
                    "chromium-driver; scripts/install-deps.sh installs them)")
    profile = tempfile.mkdtemp(prefix="smelt-webui-")
    o = webdriver.ChromeOptions()
    o.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1200,900", "--no-first-run", "--disable-extensions",
              f"--user-data-dir={profile}"):
        o.add_argument(a)
    o.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(DRIVER), options=o)
    d.set_page_load_timeout(WAIT)
    d.set_script_timeout(WAIT)
    yield d
    d.quit()
    shutil.rmtree(profile, ignore_errors=True)


def wait(d, cond, what):
    return WebDriverWait(d, WAIT, poll_frequency=0.05).until(cond, message=what)


def open_page(d, s):
    """Loads the chat from server s and waits until its script ran and the models are listed."""
    d.get(s.url + "/")
    wait(d, lambda d: d.execute_script("return document.documentElement.dataset.ready"),
         "app.js did not run")
    return d


def models_listed(d):
    return wait(d, lambda d: [o.get_attribute("value") for o in
                              d.find_elements(By.CSS_SELECTOR, "#model option")] or None,
                "the model picker stayed empty")


def text_of(el):
    return el.get_attribute("textContent")


def last_answer(d):
    return d.find_elements(By.CSS_SELECTOR, "#messages .msg.assistant")[-1]


def wait_answer_done(d):
    """Waits until the last answer is complete (its stats shown, no cursor); returns it."""
    def done(d):
        a = d.find_elements(By.CSS_SELECTOR, "#messages .msg.assistant")
        if not a or a[-1].find_elements(By.CSS_SELECTOR, ".content.cursor"):
            return False
        return a[-1] if d.find_element(By.ID, "send").is_enabled() else False
    return wait(d, done, "the answer did not complete")


def record_requests(d):
    """Wraps window.fetch so the test can read the bodies the page sends."""
    d.execute_script("""
        window.__bodies = [];
        const f = window.fetch;
        window.fetch = function (url, opts) {
            if (opts && opts.body) window.__bodies.push(JSON.parse(opts.body));
            return f.apply(this, arguments);
        };""")


def send(d, text, enter=False):
    box = d.find_element(By.ID, "input")
    box.clear()
    box.send_keys(text)
    if enter:
        box.send_keys(Keys.ENTER)
    else:
        d.find_element(By.ID, "send").click()


def test_chat_streams_renders_and_persists(serve, browser):
    d = browser
    s = serve(REPLY, "--fake-step-ms", "8")
    open_page(d, s)
    assert models_listed(d) == ["m", "alt"]  # /v1/models: the name and its alias
    assert "Send a message" in d.find_element(By.ID, "messages").text
    record_requests(d)
    send(d, "hello there", enter=True)
    # streaming: part of the answer (its reasoning first) is on the page before it is complete
    partial = wait(d, lambda d: d.execute_script("""
        const a = document.querySelector('#messages .msg.assistant');
        if (!a || !a.querySelector('.content.cursor')) return null;
        const t = a.querySelector('.reasoning').textContent + a.querySelector('.content').textContent;
        return t.length > 'Reasoning'.length ? t : null;"""), "no partial answer was seen")
    a = wait_answer_done(d)
    content = a.find_element(By.CSS_SELECTOR, ".content")
    whole = text_of(a.find_element(By.CSS_SELECTOR, ".reasoning")) + text_of(content)
    assert len(partial) < len(whole), (partial, whole)
    # reasoning: folded, apart from the answer
    r = a.find_element(By.CSS_SELECTOR, "details.reasoning")
    assert r.get_attribute("open") is None and r.is_displayed()
    assert "I should greet back." in text_of(r)
    assert "greet back" not in text_of(content)
    r.find_element(By.TAG_NAME, "summary").click()
    assert r.get_attribute("open") is not None
    # markdown and highlighting
    assert content.find_element(By.TAG_NAME, "h1").text == "Greeting"
    assert content.find_element(By.TAG_NAME, "strong").text == "world"
    code = content.find_element(By.CSS_SELECTOR, "pre code")
    assert "hljs" in code.get_attribute("class").split()
    assert code.find_elements(By.CSS_SELECTOR, "span.hljs-keyword")
    assert text_of(code) == "def add(a, b):\n    return a + b\n"
    # stats: tokens (the stream's usage) and tok/s
    stats = a.find_element(By.CSS_SELECTOR, ".stats").text
    assert " tokens" in stats and "tok/s" in stats, stats
    body = d.execute_script("return window.__bodies")[-1]
    assert body["stream"] is True and body["model"] == "m"
    assert body["messages"] == [{"role": "user", "content": "hello there"}]
    assert body["stream_options"] == {"include_usage": True}
    # the conversation is listed, titled by its first message
    titles = [e.text for e in d.find_elements(By.CSS_SELECTOR, "#conversations .conv-title")]
    assert titles == ["hello there"]

    # another model from the picker and sampling settings; the second turn carries the first
    Select(d.find_element(By.ID, "model")).select_by_value("alt")
    d.find_element(By.ID, "toggle-settings").click()
    assert d.find_element(By.ID, "toggle-settings").get_attribute("aria-expanded") == "true"
    chosen = {"set-system": "Be brief.", "set-temperature": "0.5", "set-top-p": "0.9",
              "set-top-k": "40", "set-min-p": "0.05", "set-max-tokens": "500"}
    for id_, v in chosen.items():
        box = d.find_element(By.ID, id_)
        box.send_keys(v, Keys.TAB)  # change event
    # every control on the page has a name a screen reader can say (its label, aria-label or text)
    shown = d.execute_script("""return [...document.querySelectorAll(
        'button, input, select, textarea, [role=log]')].filter((e) => e.getClientRects().length);""")
    assert len(shown) > 10
    assert [c.get_attribute("outerHTML")[:80] for c in shown if not c.accessible_name.strip()] == []
    send(d, "and again")
    wait(d, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#messages .msg.assistant")) == 2,
         "no second answer")
    wait_answer_done(d)
    body = d.execute_script("return window.__bodies")[-1]
    assert body["model"] == "alt"
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "user"]
    assert body["messages"][0]["content"] == "Be brief."
    assert body["messages"][2]["content"].startswith("# Greeting")
    assert "<think>" not in body["messages"][2]["content"]  # reasoning is not sent back
    assert {k: body[k] for k in ("temperature", "top_p", "top_k", "min_p", "max_tokens")} == {
        "temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "max_tokens": 500}

    # a reload: the conversation, its answers and the chosen model are still there
    d.refresh()
    open_page(d, s)
    models_listed(d)
    assert Select(d.find_element(By.ID, "model")).first_selected_option.get_attribute("value") == "alt"
    for id_, v in chosen.items():  # the settings too
        assert d.find_element(By.ID, id_).get_attribute("value") == v, id_
    assert [e.text for e in d.find_elements(By.CSS_SELECTOR, "#conversations .conv-title")] == ["hello there"]
    msgs = d.find_elements(By.CSS_SELECTOR, "#messages .msg")
    assert [m.get_attribute("class") for m in msgs] == ["msg user", "msg assistant"] * 2
    assert msgs[0].find_element(By.CSS_SELECTOR, ".text").text == "hello there"
    assert msgs[1].find_element(By.CSS_SELECTOR, ".content h1").text == "Greeting"
    assert "tok/s" in msgs[3].find_element(By.CSS_SELECTOR, ".stats").text

    # rename, a new chat, delete
    d.find_element(By.CSS_SELECTOR, "#conversations .rename").click()
    box = d.find_element(By.CSS_SELECTOR, "#conversations .rename-input")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys("Renamed chat", Keys.ENTER)
    wait(d, lambda d: [e.text for e in d.find_elements(By.CSS_SELECTOR, "#conversations .conv-title")]
         == ["Renamed chat"], "the rename did not show")
    d.find_element(By.ID, "new-chat").click()
    send(d, "second conversation")
    wait_answer_done(d)
    titles = [e.text for e in d.find_elements(By.CSS_SELECTOR, "#conversations .conv-title")]
    assert titles == ["second conversation", "Renamed chat"]
    d.refresh()
    open_page(d, s)
    titles = [e.text for e in d.find_elements(By.CSS_SELECTOR, "#conversations .conv-title")]
    assert titles == ["second conversation", "Renamed chat"]
    item = d.find_elements(By.CSS_SELECTOR, "#conversations li")[1]
    dele = item.find_element(By.CSS_SELECTOR, ".delete")
    ActionChains(d).move_to_element(item).click(dele).perform()  # shown on hover
    assert "armed" in dele.get_attribute("class")  # asks first
    dele.click()
    wait(d, lambda d: [e.text for e in d.find_elements(By.CSS_SELECTOR, "#conversations .conv-title")]
         == ["second conversation"], "the delete did not show")
    d.refresh()
    open_page(d, s)
    assert [e.text for e in d.find_elements(By.CSS_SELECTOR, "#conversations .conv-title")] == [
        "second conversation"]


def test_stop_cancels_on_the_server(serve, browser):
    d = browser
    s = serve("word " * 2000, "--fake-step-ms", "20")  # 40 s unless stopped
    open_page(d, s)
    models_listed(d)
    send(d, "write a lot")
    wait(d, lambda d: len(text_of(last_answer(d).find_element(By.CSS_SELECTOR, ".content"))) > 20,
         "the long answer did not start")
    stop = d.find_element(By.ID, "stop")
    assert stop.is_displayed()
    stop.click()
    a = wait_answer_done(d)
    assert not stop.is_displayed()
    assert "stopped" in a.find_element(By.CSS_SELECTOR, ".stats").text
    shown = text_of(a.find_element(By.CSS_SELECTOR, ".content"))
    assert shown.startswith("word word") and len(shown) < len("word " * 2000)
    # the server noticed the disconnect: the request is gone, its KV freed, logged 499
    s.wait_idle(timeout=10)
    wait(d, lambda d: any(" 499 " in l and "/v1/chat/completions" in l for l in s.lines),
         "the server did not log the cancelled request as 499")
    # the partial answer is kept
    d.refresh()
    open_page(d, s)
    assert text_of(last_answer(d).find_element(By.CSS_SELECTOR, ".content")).startswith("word word")


def assert_inert(d):
    """Nothing hostile ran or got in: no script, handler, form, id or javascript: link in the
    messages or the list, the page's own elements intact."""
    assert d.execute_script("return window.__xss === undefined")
    found = d.execute_script("""
        const out = [];
        for (const root of [document.getElementById('messages'), document.getElementById('conversations')]) {
            for (const e of root.querySelectorAll('*')) {
                for (const a of e.attributes) {
                    if (/^on/i.test(a.name)) out.push(e.tagName + ' ' + a.name);
                    if (a.name === 'id' || a.name === 'style') out.push(e.tagName + ' ' + a.name);
                    if (/^\\s*javascript:/i.test(a.value)) out.push(e.tagName + ' ' + a.name + '=' + a.value);
                }
                if (/^(SCRIPT|FORM|INPUT|IFRAME|STYLE)$/.test(e.tagName) && !e.classList.contains('rename-input'))
                    out.push(e.tagName);
            }
        }
        return out;""")
    assert found == []
    assert d.execute_script("return document.getElementById('messages').tagName") == "DIV"


def test_model_output_is_sanitized(serve, browser):
    d = browser
    s = serve(HOSTILE)
    open_page(d, s)
    models_listed(d)
    send(d, "<b>user</b> <img src=x onerror=\"window.__xss=7\">")
    a = wait_answer_done(d)
    assert_inert(d)
    content = a.find_element(By.CSS_SELECTOR, ".content")
    assert "Look:" in content.text and "clobber" in content.text
    # the code block shows the markup as text
    assert "<img src=x onerror=alert(1)>" in text_of(content.find_element(By.CSS_SELECTOR, "pre code"))
    # the user's text is text
    user = d.find_element(By.CSS_SELECTOR, "#messages .msg.user .text")
    assert user.text == "<b>user</b> <img src=x onerror=\"window.__xss=7\">"
    assert user.find_elements(By.XPATH, "./*") == []
    links = content.find_elements(By.TAG_NAME, "a")
    assert all(l.get_attribute("rel") == "noopener noreferrer" for l in links if l.get_attribute("href"))

    # the same from the browser's storage (another tab, an older page, a crafted entry):
    # title, user text, reasoning and answer; entries the page cannot show are left out
    d.execute_script("""
        const bad = arguments[0];
        localStorage.setItem('smelt.conversations', JSON.stringify([null, 5, 'x', {id: 'y'},
            {id: 'z', messages: {}}, {id: 'w', messages: [null]},
            {id: 'v', messages: [{role: 'user', content: {toString: 1}}]},
            {id: 'x', title: bad, created: 1, updated: 1, messages: [{role: 'user', content: bad},
            {role: 'assistant', content: bad, reasoning: bad, model: bad}]}]));
        localStorage.setItem('smelt.current', JSON.stringify('x'));""", HOSTILE)
    d.refresh()
    open_page(d, s)
    wait(d, lambda d: d.find_elements(By.CSS_SELECTOR, "#messages .msg.assistant .content pre"),
         "the stored conversation did not render")
    assert_inert(d)
    titles = d.find_elements(By.CSS_SELECTOR, "#conversations .conv-title")
    assert len(titles) == 1 and titles[0].text.startswith("Look: <img")
    # the page still works
    send(d, "still alive?")
    wait_answer_done(d)
    assert_inert(d)


def test_api_key_asked_on_401(serve, browser):
    d = browser
    s = serve("fine", "--api-key", "sesame")
    open_page(d, s)  # the page and its files need no key
    note = d.find_element(By.ID, "key-note")
    wait(d, lambda d: note.is_displayed(), "the page did not ask for the key")
    assert d.find_elements(By.CSS_SELECTOR, "#model option") == []
    key = d.find_element(By.ID, "set-api-key")
    assert d.switch_to.active_element == key
    key.send_keys("sesame", Keys.TAB)  # change event
    assert models_listed(d) == ["m", "alt"]
    assert not note.is_displayed()
    send(d, "hi")
    a = wait_answer_done(d)
    assert text_of(a.find_element(By.CSS_SELECTOR, ".content")).strip() == "fine"
    # a wrong key: the answer says so and the page asks again
    d.execute_script("localStorage.setItem('smelt.settings', JSON.stringify("
                     "Object.assign(JSON.parse(localStorage.getItem('smelt.settings')), {apiKey: 'nope'})))")
    d.refresh()
    open_page(d, s)
    wait(d, lambda d: d.find_element(By.ID, "key-note").is_displayed(), "no key note after a 401")
    send(d, "hi again")
    a = wait_answer_done(d)
    err = a.find_element(By.CSS_SELECTOR, ".error").text
    assert "HTTP 401" in err and "API key" in err
    try:
        logs = d.get_log("browser")
    except JavascriptException:
        logs = []
    # no script error on the page (the 401s themselves are network errors, not script ones)
    assert not [l for l in logs if l.get("source") == "javascript"], logs
