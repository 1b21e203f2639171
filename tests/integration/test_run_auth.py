"""What `make run` starts (thorn-run, every service a process of its own, no lab) counts failed
authentication by the address its entry point sees, whatever a client writes in
X-Forwarded-For, and its services log that address: the real processes, with the proxy
settings `serve()` gives them (the entry point reads forwarded addresses itself and trusts
none by default; the services trust the entry point on the loopback)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
from fixed_tokens import fixed_token
from thorn_stack import run_stack

LIMIT = 3
AUDIT_WAIT_S = 15.0


def client_at(address: str, url: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), base_url=url,
                        timeout=30.0)  # fmt: skip


def test_a_client_is_counted_and_logged_by_its_own_address_not_one_it_forwards(
    tmp_path: Path,
) -> None:
    settings = {"THORN_AUTH_FAILURE_LIMIT": str(LIMIT)}
    with run_stack(tmp_path, emulated=False, settings=settings) as stack:
        wrong = {"Authorization": f"Bearer {fixed_token('spoofer')}"}
        # From 127.0.0.1: uvicorn's own default would believe its X-Forwarded-For.
        with client_at("127.0.0.1", stack.url) as poser:
            for n in range(LIMIT):
                posing = {**wrong, "X-Forwarded-For": f"198.51.100.{n}"}
                assert poser.get("/api/v1/whoami", headers=posing).status_code == 401
            right = {"Authorization": f"Bearer {stack.admin}", "X-Forwarded-For": "198.51.100.9"}
            held = poser.get("/api/v1/whoami", headers=right)
            assert held.status_code == 429, held.text
            assert "from 127.0.0.1 " in held.json()["detail"]
        with client_at("127.0.0.42", stack.url) as admin:
            assert admin.get("/api/v1/whoami", headers={"Authorization": f"Bearer {stack.admin}"}
                             ).status_code == 200  # fmt: skip
            deadline = time.monotonic() + AUDIT_WAIT_S
            while len(entries := failures(admin, stack.admin)) < LIMIT:
                assert time.monotonic() < deadline, entries
                time.sleep(0.2)
    assert {e["client"] for e in entries} == {"127.0.0.1"}
    assert {e["detail"]["reason"] for e in entries} == {"unknown"}


def failures(client: httpx.Client, admin: str) -> list[dict[str, Any]]:
    page = client.get("/api/v1/audit", params={"action": "auth.failure", "limit": 100},
                      headers={"Authorization": f"Bearer {admin}"})  # fmt: skip
    assert page.status_code == 200, page.text
    return [e for e in page.json()["items"] if e["target"] == "GET /api/v1/whoami"]
