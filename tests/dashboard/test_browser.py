"""The dashboard in a real browser: Debian's headless Chromium driven by Selenium through
Debian's chromedriver (never a downloaded one). A page loads and shows a queue the test
filled and keeps itself current, a running job's output streams in with its colours, and the
redrive button moves a dead letter back. Skipped only when chromium is not installed
(.ci/run installs it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.support.server import REPO, repo_env

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)),
                       reason=f"needs {CHROMIUM} and {CHROMEDRIVER} (apt-get install chromium "
                              "chromium-driver)"),
]

WAIT_S = 15
SCRIPT = Path(__file__).with_name("scripts") / "build-site.sh"


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,900", "--force-device-scale-factor=1"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()


def wait(driver: object, condition: object, what: str) -> object:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S, poll_frequency=0.1).until(condition, what)  # type: ignore[arg-type]


def queue_length(driver: object, queue: str) -> str | None:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        row = driver.find_element(By.CSS_SELECTOR, f'tr[data-queue="{queue}"]')  # type: ignore[attr-defined]
        return str(row.find_element(By.CSS_SELECTOR, "td.length").text)
    except (NoSuchElementException, StaleElementReferenceException):
        return None


def test_overview_shows_a_filled_queue_and_keeps_current(browser: object, node: tuple) -> None:
    from selenium.webdriver.common.by import By

    srv, base = node
    for i in range(3):
        srv.call("ADDJOB", "emails", f"welcome mail {i}", 0)
    browser.get(base + "/")  # type: ignore[attr-defined]
    assert browser.title.startswith("trisque")  # type: ignore[attr-defined]
    assert queue_length(browser, "emails") == "3"
    node_id = srv.call("CLUSTER", "MYID").decode()
    cluster = browser.find_element(By.ID, "cluster").text  # type: ignore[attr-defined]
    assert node_id[:8] in cluster and "myself" in cluster
    # The page refreshes itself: two more jobs show up without a reload.
    srv.call("ADDJOB", "emails", "welcome mail 3", 0)
    srv.call("ADDJOB", "emails", "welcome mail 4", 0)
    wait(browser, lambda d: queue_length(d, "emails") == "5", "the queue's new length")


def test_redrive_button_moves_a_dead_letter_back(browser: object, node: tuple) -> None:
    from selenium.webdriver.common.by import By

    srv, base = node
    srv.call("QPOLICY", "CREATE", "failed")
    srv.call("QPOLICY", "CREATE", "orders", "REDRIVE", 1, "failed")
    job = srv.call("ADDJOB", "orders", "order 1042", 0)
    assert srv.call("GETJOB", "FROM", "orders")[0][1] == job
    assert srv.call("NACK", job) == 0  # dead-lettered
    assert srv.call("QLEN", "failed") == 1 and srv.call("QLEN", "orders") == 0
    browser.get(base + "/")  # type: ignore[attr-defined]
    section = browser.find_element(By.ID, "dead-letters")  # type: ignore[attr-defined]
    assert "order 1042" in section.text and "orders" in section.text
    button = browser.find_element(  # type: ignore[attr-defined]
        By.CSS_SELECTOR, 'button[data-redrive="/queues/failed/redrive"]')
    button.click()
    flash = browser.find_element(By.ID, "flash")  # type: ignore[attr-defined]
    wait(browser, lambda d: "Moved 1 dead letter" in flash.text, "the redrive's answer")
    assert srv.call("QLEN", "failed") == 0 and srv.call("QLEN", "orders") == 1
    got = srv.call("GETJOB", "WITHCOUNTERS", "FROM", "orders")
    assert got[0][2] == b"order 1042" and got[0][4] == 0  # a fresh job, counters from zero
    wait(browser, lambda d: queue_length(d, "failed") == "0", "the page shows the move")


def test_a_failed_jobs_row_buttons_redrive_and_delete(browser: object, node: tuple) -> None:
    from selenium.webdriver.common.by import By

    srv, base = node
    parked = []
    for body in ("resize a.png", "resize b.png"):
        job = srv.call("ADDJOB", "resize", body, 0)
        assert srv.call("GETJOB", "FROM", "resize")[0][1] == job
        parked.append(srv.call("QPOLICY", "PARK", job, 1, "/logs/x.log", "exit status 1")[1])
    browser.get(base + "/")  # type: ignore[attr-defined]
    rows = [browser.find_element(  # type: ignore[attr-defined]
        By.CSS_SELECTOR, f'tr[data-letter="{p.decode()}"]') for p in parked]
    assert "exit status 1" in rows[0].text and "/logs/x.log" in rows[0].text
    flash = browser.find_element(By.ID, "flash")  # type: ignore[attr-defined]
    rows[0].find_element(By.CSS_SELECTOR, "button[data-redrive]").click()
    wait(browser, lambda d: "Moved 1 dead letter" in flash.text, "the redrive's answer")
    assert srv.call("QLEN", "resize") == 1 and srv.call("QLEN", "resize.err") == 1
    browser.find_element(  # type: ignore[attr-defined]
        By.CSS_SELECTOR, f'tr[data-letter="{parked[1].decode()}"] button[data-delete]').click()
    wait(browser, lambda d: "Deleted." in flash.text, "the delete's answer")
    assert srv.call("QLEN", "resize.err") == 0 and srv.call("SHOW", parked[1]) is None


def test_a_running_jobs_output_streams_live_with_colours(browser: object, node: tuple) -> None:
    from selenium.webdriver.common.by import By

    srv, base = node
    job = srv.call("ADDJOB", "builds", "make release", 0)
    token = srv.call("JOBRUN", "START", job, "builds", 1, "build-host", 31337)
    srv.call("JOBRUN", "STATUS", token, "configuring")
    first = b"\x1b[1;32m==>\x1b[0m configure <prefix=/usr>\n"
    srv.call("JOBRUN", "APPEND", token, 0, first)
    browser.get(base + "/jobs/" + quote(job.decode(), safe=""))  # type: ignore[attr-defined]
    log = browser.find_element(By.ID, "log")  # type: ignore[attr-defined]
    wait(browser, lambda d: "configure <prefix=/usr>" in log.text, "the first output")
    green = log.find_element(By.CSS_SELECTOR, "span.f2.ab")
    assert green.text == "==>"
    assert green.value_of_css_property("color") == "rgba(13, 188, 121, 1)"  # the CSS's green
    assert green.value_of_css_property("font-weight") == "700"
    # More output while the page is open arrives without a reload, and so does the status.
    second = b"\x1b[31mwarning:\x1b[0m unused variable\n"
    srv.call("JOBRUN", "APPEND", token, len(first), second)
    srv.call("JOBRUN", "STATUS", token, "compiling 3/10")
    wait(browser, lambda d: "unused variable" in log.text, "live output")
    panel = browser.find_element(By.ID, "run-panel")  # type: ignore[attr-defined]
    wait(browser, lambda d: "compiling 3/10" in panel.text, "the new status line")
    assert log.find_element(By.CSS_SELECTOR, "span.f1").text == "warning:"
    srv.call("JOBRUN", "END", token, "done", 0, "exit code 0")
    state = browser.find_element(By.ID, "log-state")  # type: ignore[attr-defined]
    wait(browser, lambda d: state.text == "ended: done", "the end of the run")
    assert "done" in panel.text
    # The overview lists it among the recent runs.
    browser.get(base + "/")  # type: ignore[attr-defined]
    assert job.decode() in browser.find_element(By.ID, "running").text  # type: ignore[attr-defined]


def test_a_worker_running_a_shell_script_streams_live(browser: object, node: tuple,
                                                      tmp_path: Path) -> None:
    """A real ``trisque worker`` runs tests/dashboard/scripts/build-site.sh for a job; its
    page shows the output while the script runs. The screenshot taken meanwhile is the
    docs/dashboard.png (shown by docs/dashboard.md) (written there with TRISQUE_UPDATE_SCREENSHOT=1)."""
    from selenium.webdriver.common.by import By

    srv, base = node
    go = tmp_path / "go"
    env = repo_env() | {"BUILD_WAIT_FOR": str(go)}
    with open(tmp_path / "worker.log", "wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "worker", "--queue", "sites", "--nodes",
             f"127.0.0.1:{srv.port}", "--name", "builder-1", "--log-dir",
             str(tmp_path / "logs"), "--", str(SCRIPT)],
            cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        job = srv.call("ADDJOB", "sites", "www.example.org", 0)
        browser.get(base + "/jobs/" + quote(job.decode(), safe=""))  # type: ignore[attr-defined]
        log = browser.find_element(By.ID, "log")  # type: ignore[attr-defined]
        panel = browser.find_element(By.ID, "run-panel")  # type: ignore[attr-defined]
        wait(browser, lambda d: "Optimising images" in log.text, "the script's output")
        wait(browser, lambda d: "optimising images 12/40" in panel.text, "its status line")
        assert "running" in panel.text and "builder-1" in panel.text
        job_panel = browser.find_element(By.ID, "job-panel")  # type: ignore[attr-defined]
        wait(browser, lambda d: "active" in job_panel.text, "the job's state, taken")
        warning = log.find_element(By.CSS_SELECTOR, "span.f3")
        assert warning.text == "warning:"
        assert warning.value_of_css_property("color") == "rgba(229, 229, 16, 1)"
        shot = tmp_path / "dashboard.png"
        assert browser.save_screenshot(str(shot))  # type: ignore[attr-defined]
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
        if os.environ.get("TRISQUE_UPDATE_SCREENSHOT") == "1":
            shutil.copyfile(shot, REPO / "docs" / "dashboard.png")
        go.touch()  # the script finishes: done + exit 0 -> ACKJOB
        state = browser.find_element(By.ID, "log-state")  # type: ignore[attr-defined]
        wait(browser, lambda d: state.text == "ended: done", "the end of the run")
        assert "built www.example.org" in log.text and "done" in panel.text
        wait(browser, lambda d: srv.call("SHOW", job) is None, "the job acknowledged")
        wait(browser, lambda d: "no longer holds the job" in job_panel.text,
             "the page shows it acknowledged")
    finally:
        worker.terminate()
        try:
            worker.wait(15)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(5)


def test_another_sites_page_cannot_change_the_nodes_state(browser: object, node: tuple,
                                                          tmp_path: Path) -> None:
    # A page served from another origin posts a message and deletes a queue through the
    # HTTP API, as a cross-site attack on a logged-in operator's browser would: the node
    # refuses both (docs/security.md).
    import http.server
    import threading

    srv, base = node
    srv.call("QPOLICY", "CREATE", "target")
    (tmp_path / "evil.html").write_text(
        "<script>Promise.allSettled(["
        "fetch('" + base + "/messages/target', {method: 'POST', mode: 'no-cors', body: 'x'}),"
        "fetch('" + base + "/queues/target', {method: 'DELETE', mode: 'no-cors'})"
        "]).then(() => { document.title = 'sent'; });</script>")
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(  # noqa: E731
        *a, directory=str(tmp_path))
    evil = http.server.ThreadingHTTPServer(("127.0.0.2", 0), handler)
    threading.Thread(target=evil.serve_forever, daemon=True).start()
    try:
        browser.get(f"http://127.0.0.2:{evil.server_address[1]}/evil.html")  # type: ignore[attr-defined]
        wait(browser, lambda d: d.title == "sent", "the cross-site requests")
        assert srv.call("QLEN", "target") == 0
        assert srv.call("QPOLICY", "GET", "target") is not None  # not deleted
    finally:
        evil.shutdown()
        evil.server_close()


def test_the_dashboard_over_https(tmp_path: Path) -> None:
    """``http-tls yes``: the page loads over a real TLS handshake, the browser pinning the
    node's key (Chromium's SPKI list: a test CA is in no system store), and a button's
    request goes through too."""
    import base64
    import hashlib

    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    from tests.http.test_https import start_https
    from tests.support.certs import make_certs

    certs = make_certs(tmp_path / "certs", nodes=1)
    cert, key = certs.nodes[0]
    spki = x509.load_pem_x509_certificate(cert.read_bytes()).public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    pin = base64.b64encode(hashlib.sha256(spki).digest()).decode()
    srv, base = start_https(certs, cert, key)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--ignore-certificate-errors-spki-list={pin}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(WAIT_S)
    try:
        srv.call("QPOLICY", "CREATE", "failed")
        srv.call("QPOLICY", "CREATE", "orders", "REDRIVE", 1, "failed")
        job = srv.call("ADDJOB", "orders", "order over tls", 0)
        assert srv.call("GETJOB", "FROM", "orders")[0][1] == job
        assert srv.call("NACK", job) == 0  # dead-lettered
        assert base.startswith("https://")
        driver.get(base + "/")
        assert driver.title.startswith("trisque"), driver.page_source[:300]
        assert queue_length(driver, "failed") == "1"
        driver.find_element(By.CSS_SELECTOR,
                            'button[data-redrive="/queues/failed/redrive"]').click()
        wait(driver, lambda d: queue_length(d, "orders") == "1", "the redrive over HTTPS")
        assert srv.call("QLEN", "orders") == 1
    finally:
        driver.quit()
        srv.stop()
