"""The HTTP side of `thornctl`: one `httpx.Client` against THORN's REST API.

Every failure becomes a `CliError` with the exit code of its kind (see `thornctl.errors`):
transport errors and 5xx are "unavailable", 401/403 "no permission", other 4xx "refused"
with the API's one-line `detail`.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator, Mapping
from typing import Any

import httpx

from thornctl.errors import CliError, ExitCode

API = "/api/v1"
PAGE_MAX = 1000  # the API's largest page size

QueryValue = str | int | bool | list[str] | None


def normalise_url(url: str) -> str:
    """Strip a trailing '/' and a pasted '/api/v1' so paths can be joined to it."""
    url = url.strip().rstrip("/")
    if url.endswith(API):
        url = url[: -len(API)]
    return url


class Client:
    def __init__(
        self,
        url: str,
        token: str | None,
        timeout: float,
        option: str = "--url",
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        self.url = normalise_url(url)
        self.option = option  # where the URL came from, for the hints below
        self.timeout = timeout
        self.has_token = bool(token)
        headers = {"Accept": "application/json", "User-Agent": "thornctl"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout, verify=verify
        )

    def close(self) -> None:
        self._http.close()

    # --- requests -------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, QueryValue] | None = None,
        json_body: Any = None,
        content: bytes | Iterator[bytes] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """Send a request and return the decoded JSON answer (None for an empty body)."""
        response = self.send(
            method, path, params=params, json_body=json_body, content=content, headers=headers
        )
        return self._decode(response)

    def send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, QueryValue] | None = None,
        json_body: Any = None,
        content: bytes | Iterator[bytes] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """Send a request; raise `CliError` for transport errors and 4xx/5xx answers."""
        query = {k: v for k, v in (params or {}).items() if v is not None and v != []}
        try:
            if json_body is not None:
                response = self._http.request(
                    method, path, params=query, json=json_body, headers=headers
                )
            else:
                response = self._http.request(
                    method, path, params=query, content=content, headers=headers
                )
        except httpx.ConnectTimeout as exc:
            raise CliError(
                f"cannot reach THORN at {self.url}: no connection within {self.timeout:g} s",
                ExitCode.UNAVAILABLE,
            ) from exc
        except httpx.TimeoutException as exc:
            raise CliError(
                f"THORN at {self.url} did not answer within {self.timeout:g} s "
                "(the server may still finish the request); large fabrics may need "
                "a higher --timeout",
                ExitCode.UNAVAILABLE,
            ) from exc
        except httpx.TransportError as exc:
            reason = str(exc) or type(exc).__name__
            if "CERTIFICATE_VERIFY_FAILED" in reason:
                reason += "; give the CA that signed its certificate with --ca FILE (THORN_CA)"
            raise CliError(
                f"cannot reach THORN at {self.url}: {reason}", ExitCode.UNAVAILABLE
            ) from exc
        if response.is_error:
            raise self._failure(response)
        return response

    def get(self, path: str, **params: QueryValue) -> Any:
        return self.request("GET", f"{API}{path}", params=params)

    def post(self, path: str, json_body: Any = None, **params: QueryValue) -> Any:
        return self.request("POST", f"{API}{path}", params=params, json_body=json_body)

    def patch(self, path: str, json_body: Any) -> Any:
        return self.request("PATCH", f"{API}{path}", json_body=json_body)

    def delete(self, path: str, **params: QueryValue) -> Any:
        return self.request("DELETE", f"{API}{path}", params=params)

    def pages(
        self, path: str, *, limit: int | None, offset: int | None, everything: bool, **params: Any
    ) -> dict[str, Any]:
        """GET a paginated list: one page, or with `everything` all pages merged into one."""
        if not everything:
            page: dict[str, Any] = self.get(path, limit=limit, offset=offset, **params)
            return page
        items: list[Any] = []
        while True:
            page = self.get(path, limit=PAGE_MAX, offset=len(items), **params)
            items.extend(page["items"])
            if not page["items"] or len(items) >= page["total"]:
                return {"items": items, "total": page["total"], "limit": len(items), "offset": 0}

    # --- answers --------------------------------------------------------------------------

    def _decode(self, response: httpx.Response) -> Any:
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError as exc:
            kind = response.headers.get("content-type", "no content type")
            raise CliError(
                f"{self.url} answered {response.request.url.path} with {kind}, not JSON "
                f"(is {self.option} a THORN API?)",
                ExitCode.PROTOCOL,
            ) from exc

    def _failure(self, response: httpx.Response) -> CliError:
        status = response.status_code
        detail = error_detail(response)
        if status == 404 and detail == "Not Found":  # no such route, not a missing resource
            path = response.request.url.path
            detail = f"{self.url} has no {path} (HTTP 404): is {self.option} THORN's API?"
        if status >= 500:
            return CliError(
                f"THORN at {self.url} failed with HTTP {status}: {detail}",
                ExitCode.UNAVAILABLE,
                status=status,
            )
        if status == 401:
            hint = "" if self.has_token else " (pass --token or set THORN_TOKEN)"
            return CliError(f"{detail}{hint}", ExitCode.NOPERM, status=status)
        if status == 403:
            return CliError(detail, ExitCode.NOPERM, status=status)
        if status == 429:  # too many failed authentications from here: the detail says when
            return CliError(detail, ExitCode.TEMPFAIL, status=status)
        return CliError(detail, ExitCode.REFUSED, status=status)


def error_detail(response: httpx.Response) -> str:
    """The API's one-line `detail`, or the best single line the answer offers."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        detail = body.get("detail")
        if isinstance(detail, str) and detail:
            return detail
        if isinstance(detail, list):  # FastAPI's default validation format
            parts = [
                f"{'.'.join(str(p) for p in e.get('loc', []))}: {e.get('msg', '')}"
                for e in detail
                if isinstance(e, dict)
            ]
            if parts:
                return "; ".join(parts)
        if detail is not None:
            return json.dumps(detail)
    text = response.text.strip().splitlines()
    first = text[0][:200] if text else ""
    reason = response.reason_phrase or "error"
    return f"HTTP {response.status_code} {reason}" + (f": {first}" if first else "")
