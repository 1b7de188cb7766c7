"""The HTTP API and the dashboard read back bodies the append log holds (body-memory-max):
they build their answers from broker values, so they resolve the references themselves."""

from __future__ import annotations

import httpx

from tests.http.conftest import start
from tests.support.server import send_command


def test_http_receive_and_the_job_page_read_bodies_from_the_log() -> None:
    srv, base = start()
    try:
        body = b"<doc>" + b"x" * 2000 + b"</doc>"
        job_id = send_command(srv.port, "ADDJOB", "hq", body, 0)
        info = send_command(srv.port, "INFO", "persistence")
        assert b"jobs_bodies_on_disk:1\r" in info
        with httpx.Client(base_url=base, timeout=10) as http:
            page = http.get("/jobs/" + job_id.decode().replace("/", "%2F"))
            assert page.status_code == 200 and "x" * 200 in page.text
            # A queue made an HTTP queue after its jobs went to the log: they stay there.
            assert http.put("/queues/hq", json={"visibility_timeout": 30}).status_code in (200, 201)
            got = http.get("/messages/hq")
            assert got.status_code == 200 and got.content == body
            assert got.headers["x-message-id"] == job_id.decode()
    finally:
        srv.stop()
