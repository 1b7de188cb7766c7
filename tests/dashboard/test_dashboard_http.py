"""The dashboard's pages, log streams and redrive route on a real node, over HTTP (httpx):
user data is escaped everywhere, a run's output streams with its colours, the stream ends
with the run, resumes from Last-Event-ID, and stops when its reader goes away."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from urllib.parse import quote

import httpx
import pytest

from tests.dashboard.conftest import scrape, value
from tests.dashboard.sse import events, read_until_end
from tests.http.conftest import start
from tests.support.cluster import wait_until
from tests.support.dashboard import button_headers
from tests.support.server import ServerProcess

Node = tuple[ServerProcess, str]
XSS = "<script>alert('x')</script>"


@pytest.fixture
def http(node: Node) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=node[1], timeout=10) as client:
        yield client


def job_url(job_id: bytes | str) -> str:
    jid = job_id.decode() if isinstance(job_id, bytes) else job_id
    return "/jobs/" + quote(jid, safe="")


def dead_letter(srv: ServerProcess, queue: str, body: str) -> bytes:
    job = srv.call("ADDJOB", queue, body, 0)
    assert srv.call("GETJOB", "FROM", queue)[0][1] == job
    assert srv.call("NACK", job) == 0  # REDRIVE 1: dead-lettered
    return job


def test_overview_shows_queues_nodes_dead_letters_escaped(node: Node, http: httpx.Client) -> None:
    srv, _ = node
    srv.call("QPOLICY", "CREATE", "ov-dlq")
    srv.call("QPOLICY", "CREATE", XSS, "REDRIVE", 1, "ov-dlq")
    for i in range(3):
        srv.call("ADDJOB", "ov-plain", f"job {i}", 0)
    dead_letter(srv, XSS, "<img src=x onerror=alert(1)>")
    srv.call("PAUSE", "ov-plain", "out")
    assert srv.call("TIMER", "ADD", "nightly <report>", 3600, "reports", "<all>") is not None
    r = http.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "script-src" not in r.headers["content-security-policy"]  # default-src 'self'
    assert "default-src 'self'" in r.headers["content-security-policy"]
    page = r.text
    assert XSS not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    node_id = srv.call("CLUSTER", "MYID").decode()
    assert node_id in page and "myself" in page
    assert 'data-queue="ov-plain"' in page
    row = page[page.index('data-queue="ov-plain"'):]
    row = row[:row.index("</tr>")]
    assert 'class="num length">3<' in row and ">out<" in row  # length and pause state
    assert 'data-redrive="/queues/ov-dlq/redrive"' in page
    timer = page[page.index('data-timer="nightly &lt;report&gt;"'):]
    timer = timer[:timer.index("</tr>")]
    assert "1 h 0 min" in timer and "reports" in timer and "&lt;all&gt;" in timer
    assert "active" in timer and "(this node)" in timer  # the owner, in this node's view
    # The fragment the page refreshes itself with: the same sections, no page around them.
    part = http.get("/", params={"part": "main"}).text
    assert "<html" not in part and 'data-queue="ov-plain"' in part


def test_static_files_and_unknown_pages(http: httpx.Client) -> None:
    css = http.get("/static/dashboard.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    js = http.get("/static/dashboard.js")
    assert js.status_code == 200 and "EventSource" in js.text
    assert http.get("/static/../http_api.py").status_code == 404
    assert http.get("/static/nope.js").status_code == 404
    assert http.get("/jobs/not-an-id").status_code == 400
    unknown = "D-00000000-AAAAAAAAAAAAAAAAAAAAAAAA-05a1"
    assert http.get(job_url(unknown)).status_code == 404
    assert http.get(job_url(unknown) + "/log").status_code == 404


def test_a_runs_output_streams_with_colours_and_ends_with_it(node: Node,
                                                             http: httpx.Client) -> None:
    srv, _ = node
    job = srv.call("ADDJOB", "builds", "<b>make all</b>", 0)
    token = srv.call("JOBRUN", "START", job, "builds", 1, "worker <1>", 4242)
    assert srv.call("JOBRUN", "STATUS", token, "compiling <main.c>") == b"OK"
    first = b"\x1b[32mok\x1b[0m <tag> & more\n"
    assert srv.call("JOBRUN", "APPEND", token, 0, first) == len(first)
    page = http.get(job_url(job))
    assert page.status_code == 200
    assert "&lt;b&gt;make all&lt;/b&gt;" in page.text and "compiling &lt;main.c&gt;" in page.text
    assert "worker &lt;1&gt;" in page.text
    got: list = []
    opened = threading.Event()

    def reader() -> None:
        with httpx.Client(base_url=node[1]) as c, c.stream(
                "GET", job_url(job) + "/log", timeout=20) as r:
            opened.set()
            for ev in events(r):
                got.append(ev)
                if ev.name == "end":
                    return

    t = threading.Thread(target=reader)
    t.start()
    try:
        assert opened.wait(10)
        wait_until(lambda: any(e.name == "output" for e in got), 10, "first output")
        second = b"\x1b[1;31mfailed\x1b[0m step 2\r\n"
        srv.call("JOBRUN", "APPEND", token, len(first), second)
        srv.call("JOBRUN", "STATUS", token, "linking")
        wait_until(lambda: sum(e.name == "output" for e in got) >= 2, 10, "live output")
        srv.call("JOBRUN", "END", token, "failed", 2, "exit code 2")
    finally:
        t.join(20)
    assert not t.is_alive()
    output = "".join(e.data for e in got if e.name == "output")
    assert output == ('<span class="f2">ok</span> &lt;tag&gt; &amp; more\n'
                      '<span class="f1 ab">failed</span> step 2\n')
    statuses = [e.data for e in got if e.name == "status"]
    assert "compiling &lt;main.c&gt;" in statuses[0] and "linking" in statuses[-1]
    assert "state-failed" in statuses[-1] and "exit code 2" in statuses[-1]
    assert got[-1].name == "end" and got[-1].data == "failed"
    # A reader that comes back resumes after the last event it saw (EventSource's
    # Last-Event-ID), and a finished run's stream ends by itself.
    last_id = [e.id for e in got if e.id][0]
    assert last_id == f"{token.decode()}:{len(first)}"
    again = read_until_end(http, job_url(job) + "/log", headers={"Last-Event-ID": last_id})
    assert "".join(e.data for e in again if e.name == "output") == (
        '<span class="f1 ab">failed</span> step 2\n')


def test_a_new_run_of_the_job_is_announced_and_followed(node: Node,
                                                        http: httpx.Client) -> None:
    srv, _ = node
    job = srv.call("ADDJOB", "retries", "x", 0)
    t1 = srv.call("JOBRUN", "START", job, "retries", 1, "w", 1)
    srv.call("JOBRUN", "APPEND", t1, 0, b"first try\n")
    srv.call("JOBRUN", "END", t1, "failed", 1, "exit code 1")
    t2 = srv.call("JOBRUN", "START", job, "retries", 2, "w", 2)
    srv.call("JOBRUN", "APPEND", t2, 0, b"second try\n")
    srv.call("JOBRUN", "END", t2, "done", 0, "ok")
    got = read_until_end(http, job_url(job) + "/log")
    output = "".join(e.data for e in got if e.name == "output")
    assert output == "second try\n"  # the newest run of the job
    assert got[-1].data == "done"


def test_a_closed_reader_stops_its_stream(node: Node) -> None:
    srv, base = node
    job = srv.call("ADDJOB", "slow", "x", 0)
    token = srv.call("JOBRUN", "START", job, "slow", 1, "w", 1)
    assert value(scrape(base), "trisque_dashboard_log_streams") == 0
    with httpx.Client(base_url=base) as c, c.stream("GET", job_url(job) + "/log",
                                                    timeout=10) as r:
        stream = events(r)  # kept: dropping the iterator would close the response
        assert next(stream).name == "status"  # the stream is running
        assert value(scrape(base), "trisque_dashboard_log_streams") == 1
    wait_until(lambda: value(scrape(base), "trisque_dashboard_log_streams") == 0, 10,
               "the stream ended after its reader closed")
    srv.call("JOBRUN", "END", token, "stopped", "none", "test over")


def test_redrive_route(node: Node, http: httpx.Client) -> None:
    srv, base = node
    srv.call("QPOLICY", "CREATE", "rd-dlq")
    srv.call("QPOLICY", "CREATE", "rd-src", "REDRIVE", 1, "rd-dlq")
    for i in range(3):
        dead_letter(srv, "rd-src", f"letter {i}")
    assert srv.call("QLEN", "rd-dlq") == 3
    # A page of another site posting with the user's credentials: refused.
    r = http.post("/queues/rd-dlq/redrive", headers={"Origin": "http://evil.example"})
    assert r.status_code == 403 and "error" in r.json()
    assert srv.call("QLEN", "rd-dlq") == 3
    # The dashboard's own origin, but no token: a page that is not ours cannot read it.
    r = http.post("/queues/rd-dlq/redrive", params={"count": 1}, headers={"Origin": base})
    assert r.status_code == 403 and "CSRF" in r.json()["error"]
    r = http.post("/queues/rd-dlq/redrive", params={"count": 1},
                  headers=button_headers(http, base))  # the dashboard itself
    assert r.status_code == 200 and r.json() == {"moved": 1}
    assert http.post("/queues/rd-dlq/redrive").json() == {"moved": 2}  # curl: no Origin
    assert srv.call("QLEN", "rd-dlq") == 0 and srv.call("QLEN", "rd-src") == 3
    bodies = sorted(j[2] for j in srv.call("GETJOB", "COUNT", 3, "FROM", "rd-src"))
    assert bodies == [b"letter 0", b"letter 1", b"letter 2"]
    assert http.post("/queues/rd-nope/redrive").status_code == 404
    assert http.post("/queues/rd-dlq/redrive", params={"count": 0}).status_code == 400
    srv.call("PAUSE", "rd-src", "in")
    dead_letter_when_paused = srv.call("ADDJOB", "rd-dlq", "by hand", 0)
    assert dead_letter_when_paused.startswith(b"D-")
    assert http.post("/queues/rd-dlq/redrive").json() == {"moved": 0}  # no origin: stays
    srv.call("PAUSE", "rd-src", "none")


def test_dashboard_needs_the_password_like_the_api() -> None:
    srv, base = start(requirepass="pw")
    try:
        for path in ("/", "/static/dashboard.js", "/metrics"):
            r = httpx.get(base + path)
            assert r.status_code == 401 and "Basic" in r.headers["www-authenticate"], path
            assert httpx.get(base + path, auth=("admin", "pw")).status_code == 200, path
        assert httpx.get(base + "/", auth=("admin", "wrong")).status_code == 401
    finally:
        srv.stop()


def test_rates_appear_after_two_renders(node: Node, http: httpx.Client) -> None:
    srv, _ = node
    srv.call("ADDJOB", "rated", "a", 0)
    http.get("/")
    time.sleep(1.2)
    for i in range(6):
        srv.call("ADDJOB", "rated", f"b{i}", 0)
    page = http.get("/").text
    row = page[page.index('data-queue="rated"'):]
    row = row[:row.index("</tr>")]
    cells = [c.split("<")[0] for c in row.split('<td class="num">')[1:3]]
    rate_in = float(cells[0].removesuffix("/s"))
    assert 2 <= rate_in <= 6.5, cells  # 6 jobs in 1.2 s or a little more
    assert cells[1] == "0.0/s"


def test_a_job_without_a_run_waits_for_one_and_ends_when_the_job_goes(node: Node,
                                                                     http: httpx.Client) -> None:
    srv, base = node
    job = srv.call("ADDJOB", "waiting", "x", 0)
    page = http.get(job_url(job)).text
    assert "No run of this job was reported to this node yet" in page
    got: list = []

    def reader() -> None:
        with httpx.Client(base_url=base) as c, c.stream("GET", job_url(job) + "/log",
                                                        timeout=15) as r:
            for ev in events(r):
                got.append(ev)
                if ev.name == "end":
                    return

    t = threading.Thread(target=reader)
    t.start()
    try:
        wait_until(lambda: got, 10, "the stream's first event")
        assert got[0].name == "status" and "No run of this job" in got[0].data
        assert srv.call("ACKJOB", job) == 1
    finally:
        t.join(15)
    assert not t.is_alive()
    assert [e.name for e in got][-2:] == ["job", "end"], got
    assert "no longer holds the job" in got[-2].data and got[-1].data == "gone"


def test_results_and_waiting_chains_are_shown(node: Node, http: httpx.Client) -> None:
    srv, _ = node
    parent = srv.call("ADDJOB", "ch-q", "first", 0).decode()
    child = srv.call("ADDJOB", "ch-next", "second", 0, "AFTER", parent).decode()
    page = http.get("/").text
    row = page[page.index(f'data-waiting="{child}"'):]
    row = row[:row.index("</tr>")]
    assert "ch-next" in row and parent in row
    assert http.get(job_url(child)).text.count(parent) >= 1  # its page names the parent
    srv.call("RESOLVE", parent, XSS)
    page = http.get("/").text
    assert f'data-waiting="{child}"' not in page
    row = page[page.index(f'data-result="{parent}"'):]
    row = row[:row.index("</tr>")]
    assert "resolved" in row and XSS not in row and "&lt;script&gt;" in row
    job_page = http.get(job_url(parent)).text  # the job is gone, its result is not
    assert "resolved" in job_page and "&lt;script&gt;" in job_page
