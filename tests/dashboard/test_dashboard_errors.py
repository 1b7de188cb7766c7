"""The dashboard's list of failed jobs: a real worker parks them in ``<queue>.err``; the
overview lists each with why, its exit status and log file, and its Redrive and Delete
routes run it again or remove it (HTTP, on a real node)."""

from __future__ import annotations

import html
from pathlib import Path

import httpx

from tests.support.cluster import wait_until
from tests.support.dashboard import button_headers
from tests.support.server import ServerProcess
from tests.support.worker import WorkerProcess, add_job, run_record, script

Node = tuple[ServerProcess, str]


def _parked_id(srv: ServerProcess, job: str) -> str:
    run, _ = wait_until(
        lambda: (r := run_record(srv.port, job)) is not None and "; parked in " in r["reason"]
        and r, 20, f"{job} parked")
    return run["reason"].rsplit(" ", 1)[1]  # type: ignore[index]


def test_failed_jobs_are_listed_with_why_and_can_be_redriven_or_deleted(
        node: Node, tmp_path: Path) -> None:
    srv, base = node
    q = "thumbs"
    cmd = script(tmp_path / "broken.sh", """\
        #!/bin/bash
        echo "converting $TRISQUE_BODY"
        echo "err <b>disk</b> full" >&3
        exit 3
    """)
    jobs = [add_job(srv.port, q, f"image {i}.png") for i in (1, 2)]
    with WorkerProcess([srv.port], [q], [cmd], log_dir=tmp_path / "logs"):
        parked = [_parked_id(srv, job) for job in jobs]
    assert srv.call("QLEN", f"{q}.err") == 2 and srv.call("QLEN", q) == 0

    with httpx.Client(base_url=base, timeout=10) as http:
        page = http.get("/", params={"part": "main"}).text
        section = page[page.index('id="dead-letters"'):page.index('id="timers"')]
        assert f'data-dlq="{q}.err"' in section and f"from {q}" in section
        for job_id in parked:
            row = section[section.index(f'data-letter="{job_id}"'):]
            row = row[:row.index("</tr>")]
            assert html.escape("err: <b>disk</b> full (exit status 3)") in row  # escaped
            assert '<td class="num">3</td>' in row
            assert str(tmp_path / "logs") in row  # the log file
            assert html.escape(f"/queues/{q}.err/redrive?job=") in row
        # Redrive one: it runs again as a new job of its queue, the other stays.
        redrive = f"/queues/{q}.err/redrive"
        r = http.post(redrive, params={"job": parked[0]}, headers=button_headers(http, base))
        assert r.status_code == 200 and r.json() == {"moved": 1}
        assert srv.call("QLEN", q) == 1 and srv.call("QLEN", f"{q}.err") == 1
        assert srv.call("QPEEK", q, 1)[0][2] == b"image 1.png"
        assert http.post(redrive, params={"job": parked[0]}).json() == {"moved": 0}
        assert http.post(redrive, params={"job": "nope"}).status_code == 400
        # Delete the other.
        assert http.delete("/messages/" + parked[1].replace("/", "%2F")).status_code == 204
        assert srv.call("QLEN", f"{q}.err") == 0
        page = http.get("/", params={"part": "main"}).text
        section = page[page.index('id="dead-letters"'):page.index('id="timers"')]
        assert not any(job_id in section for job_id in parked)
