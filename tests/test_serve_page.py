"""The chat page at GET / in a real browser: headless Chromium of the system's packages (Debian's
`chromium` and `chromium-driver`), driven by selenium through the system's chromedriver (nothing
is downloaded). A question typed, its answer streamed into the page from the demo model on the
NumPy backend, stop pressed mid-answer (the server cuts the sequence); and against a stand-in
model under Qwen3's template, on a server with an API key: the key asked for and sent, the
reasoning shown apart from the answer, the system prompt and the sampling settings sent.
Skipped, saying why, without the browser, its driver, selenium or the demo model."""

from __future__ import annotations

import json
import re
import shutil
import time

import httpx
import pytest
from serve_helpers import Server

from arcpy.demo import FETCH_HINT, demo_model_path

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[test]')")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(CHROMIUM is None or DRIVER is None, reason=(
    "no chromium or chromedriver on PATH (apt-get install -y chromium chromium-driver)"))


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1200,900"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=DRIVER))
    yield driver
    driver.quit()


def wait(browser, until, timeout: float = 60.0, what: str = ""):
    return WebDriverWait(browser, timeout, poll_frequency=0.05).until(lambda b: until(), message=what)


def ask(browser, question: str) -> None:
    box = browser.find_element(By.ID, "prompt")
    box.clear()
    box.send_keys(question)
    browser.find_element(By.ID, "send").click()


def text_of(browser, selector: str) -> str:
    """The text of the last element the CSS selector finds ("" where none)."""
    found = browser.find_elements(By.CSS_SELECTOR, selector)
    return found[-1].get_attribute("textContent") if found else ""


def status(browser) -> str:
    return browser.find_element(By.ID, "status").text


def cancelled(url: str) -> float:
    metrics = httpx.get(url + "/metrics").text
    found = re.search(r'^arcpy_sequences_total\{finish_reason="cancelled"\} (\S+)$', metrics, re.M)
    return float(found.group(1)) if found else 0.0


@pytest.mark.skipif(demo_model_path() is None, reason=f"the demo model is not fetched: {FETCH_HINT}")
def test_an_answer_streams_into_the_page_and_stop_cuts_it(browser):
    with Server("--model", str(demo_model_path()), "--backend", "numpy", "--max-seq", "512") as server:
        browser.get(server.url + "/")
        wait(browser, lambda: browser.find_element(By.ID, "model").text == "SmolLM2-135M-Instruct.Q4_1",
             what="the page names the model")
        browser.find_element(By.ID, "max_tokens").send_keys("300")
        browser.find_element(By.ID, "temperature").send_keys("0")
        ask(browser, "Tell me a long story about a lighthouse keeper.")
        assert text_of(browser, ".user .body") == "Tell me a long story about a lighthouse keeper."
        first = wait(browser, lambda: text_of(browser, ".assistant .answer"), 120, "the answer's first text")
        # It streams: the text grows while the answer is being written, piece by piece.
        wait(browser, lambda: len(text_of(browser, ".assistant .answer")) > len(first), 60, "a second piece")
        assert status(browser) == "answering"
        assert not browser.find_element(By.ID, "stop").get_attribute("disabled")
        browser.find_element(By.ID, "stop").click()
        wait(browser, lambda: status(browser) == "stopped", 10, "the page says it stopped")
        cut = text_of(browser, ".assistant .answer")
        time.sleep(1.5)
        assert text_of(browser, ".assistant .answer") == cut, "text came in after stop"
        assert "(stopped)" in text_of(browser, ".assistant")
        assert browser.find_element(By.ID, "stop").get_attribute("disabled")
        assert not browser.find_element(By.ID, "send").get_attribute("disabled")
        # The server cut the sequence: the client's leaving reached it.
        wait(browser, lambda: cancelled(server.url) == 1.0, 10, "the server counts one cancelled sequence")
        # A 300-token answer at this speed takes far longer than the wait above: stop cut it short.
        assert 0 < len(cut.split()) < 150


def qwen3_typist(api_key: str):
    """A server with an API key over the Typist, under Qwen3's template: it reasons, then answers."""
    from agent_helpers import family_text, typist_server
    from llamacpp_sdist import llamacpp_models

    text = family_text((llamacpp_models() / "templates" / "Qwen-Qwen3-0.6B.jinja").read_text())
    return typist_server(text, lambda prompt: "<think>\nThe user greets me.\n</think>\n\nHello there, traveller of "
                                              "the long road.", settings={"api_key": api_key})


def test_the_key_the_reasoning_the_system_prompt_and_the_settings(browser):
    server = qwen3_typist("sekrit")
    try:
        browser.get(server.url + "/")
        wait(browser, lambda: browser.find_element(By.ID, "key-box").is_displayed(), 10, "the page asks for the key")
        assert browser.find_element(By.ID, "model").text == ""
        key = browser.find_element(By.ID, "api_key")
        key.send_keys("sekrit")
        browser.find_element(By.ID, "system").click()  # the key field's change event
        wait(browser, lambda: browser.find_element(By.ID, "model").text == "typist", 10, "the model, with the key")
        browser.find_element(By.ID, "system").send_keys("You are a lighthouse.")
        for name, value in (("temperature", "0.7"), ("top_p", "0.9"), ("max_tokens", "200"), ("seed", "11")):
            browser.find_element(By.ID, name).send_keys(value)
        # What the page sends, as the server reads it: record each request's headers and body.
        browser.execute_script("""
            window.sent = [];
            const fetch0 = window.fetch;
            window.fetch = (url, init) => { window.sent.push({url, init}); return fetch0(url, init); };""")
        ask(browser, "Hi")
        wait(browser, lambda: status(browser).startswith("done"), 30, "the answer is done")
        assert text_of(browser, ".assistant .reasoning") == "\nThe user greets me.\n"
        assert text_of(browser, ".assistant .answer") == "Hello there, traveller of the long road."
        (request,) = browser.execute_script("return window.sent")
        assert request["url"] == "/v1/chat/completions"
        assert request["init"]["headers"]["authorization"] == "Bearer sekrit"
        body = json.loads(request["init"]["body"])
        assert body["messages"] == [{"role": "system", "content": "You are a lighthouse."},
                                    {"role": "user", "content": "Hi"}]
        assert (body["temperature"], body["top_p"], body["max_tokens"], body["seed"], body["stream"]) == (
            0.7, 0.9, 200, 11, True)
        assert "You are a lighthouse." in server.engine.device.prompts[-1]
        # The next turn carries the conversation: the answer (not its reasoning) goes back.
        ask(browser, "And?")
        wait(browser, lambda: len(browser.execute_script("return window.sent")) == 2 and status(browser) == "done",
             30, "the second answer")
        body = json.loads(browser.execute_script("return window.sent")[1]["init"]["body"])
        assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "user"]
        assert body["messages"][2]["content"] == "Hello there, traveller of the long road."
        # A wrong key: the server's 401 is shown, and the page asks again.
        key.clear()
        key.send_keys("wrong")
        browser.find_element(By.ID, "system").click()
        wait(browser, lambda: status(browser) == "enter the API key", 10, "the page asks again")
    finally:
        server.stop()
