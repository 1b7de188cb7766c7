"""The HTTP API and the dashboard read back bodies the append log holds (body-memory-max):
they build their answers from broker values, so they resolve the references themselves."""

from __future__ import annotations

import base64
import time

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


def _wait_http(base: str) -> None:
    deadline = time.monotonic() + 15
    while True:
        try:
            httpx.get(base + "/openapi.json", timeout=2)
            return
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _on_disk(port: int) -> int:
    info = send_command(port, "INFO", "persistence").decode()
    return int(info.split("jobs_bodies_on_disk:")[1].split()[0])


def test_an_http_queue_with_dedup_and_redrive_keeps_its_bodies_in_the_log_across_a_restart() -> None:
    srv, base = start()
    try:
        body = b"<doc>" + b"y" * 3000 + b"</doc>"
        xml = {"content-type": "application/xml"}
        with httpx.Client(base_url=base, timeout=10) as http:
            assert http.put("/queues/hdlq", json={}).status_code in (200, 201)
            assert http.put("/queues/hq", json={
                "message_deduplication": True,
                "redrive_policy": {"max_receives": 1, "dead_letter_queue": "hdlq"},
            }).status_code in (200, 201)
            posted = http.post("/messages/hq", content=body, headers=xml)
            assert posted.status_code == 201
            job_id = posted.json()["id"]
            assert _on_disk(srv.port) == 1
        srv.restart()
        _wait_http(base)
        with httpx.Client(base_url=base, timeout=10) as http:
            assert _on_disk(srv.port) == 1
            again = http.post("/messages/hq", content=body, headers=xml)
            assert again.status_code == 200 and again.json()["id"] == job_id  # deduplicated
            got = http.get("/messages/hq")
            assert got.status_code == 200 and got.content == body
            assert got.headers["content-type"].startswith("application/xml")
            send_command(srv.port, "NACK", job_id)  # a second receive: dead-lettered
            assert send_command(srv.port, "QLEN", "hq") == 0
            dead = http.get("/messages/hdlq?count=1")
            assert dead.status_code == 200
            assert base64.b64decode(dead.json()["messages"][0]["body_base64"]) == body
            dead_id = dead.json()["messages"][0]["id"].encode()
            assert send_command(srv.port, "ENQUEUE", dead_id) == 1
            assert http.post("/queues/hdlq/redrive").json() == {"moved": 1}
            back = http.get("/messages/hq")
            assert back.status_code == 200 and back.content == body
            assert back.headers["x-message-id"] not in (job_id, dead_id.decode())
            assert _on_disk(srv.port) == 1  # the redriven job's body went to the log as well
    finally:
        srv.stop()
