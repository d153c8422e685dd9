"""A small HTTP client for the gpupool server's REST API (version 1).

Every failure comes back as a gpupool error whose message says what to do, so the command
line and scripts never have to read HTTP status codes or httpx exceptions.
"""

from __future__ import annotations

import codecs
import os
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import yaml

from gpupool import __version__
from gpupool.errors import ConflictError, GpupoolError, NotFoundError, SpecError

DEFAULT_URL = "http://127.0.0.1:8642"
TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})


class AuthError(GpupoolError):
    """The server refused our credentials (HTTP 401 or 403)."""


def client_settings(url: str | None, token: str | None) -> tuple[str, str | None]:
    """Resolve the server URL and token: flags, then GPUPOOL_URL / GPUPOOL_TOKEN, then the
    config file (GPUPOOL_CONFIG or ~/.config/gpupool/config.yaml), then the default URL.

    The config file is read only when a flag or variable leaves something open, so a broken
    file never stands in the way of an explicit setting. Empty values count as unset.
    """
    url = url or os.environ.get("GPUPOOL_URL") or None
    token = token or os.environ.get("GPUPOOL_TOKEN") or None
    if url is None or token is None:
        config = _read_config()
        url = url or config.get("url") or None
        token = token or config.get("token") or None
    return url or DEFAULT_URL, token


def _read_config() -> dict[str, str]:
    """The url and token keys of the config file; other keys belong to other tools."""
    named = os.environ.get("GPUPOOL_CONFIG")
    path = Path(named).expanduser() if named else Path.home() / ".config/gpupool/config.yaml"
    if not path.is_file():
        if named:
            raise NotFoundError(
                f"GPUPOOL_CONFIG names {path}, which is not a file; fix the path or unset it"
            )
        return {}
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror}; fix its permissions") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{path} is not valid YAML ({exc}); fix or remove it") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SpecError(f"{path} must be a mapping with the keys url and token")
    out: dict[str, str] = {}
    for key in ("url", "token"):
        value = data.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise SpecError(f"{path}: {key} must be a string, got {value!r}")
        out[key] = value
    return out


class Client:
    """Talks to one gpupool server; use it as a context manager or call close()."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout_s: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise SpecError(
                f"server URL {url!r} must start with http:// or https:// "
                f"(e.g. {DEFAULT_URL}); fix --url, GPUPOOL_URL or the config file"
            )
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        headers = {"User-Agent": f"gpupool/{__version__}"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout_s, transport=transport
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def submit(self, spec: dict[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
        """Create a job; with the same idempotency key a retry returns the first job."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return _object(self._request("POST", "/v1/jobs", json=spec, headers=headers))

    def jobs(
        self,
        state: str | None = None,
        team: str | None = None,
        limit: int | None = None,
        after: int | None = None,
    ) -> list[dict[str, Any]]:
        params = {
            k: v
            for k, v in (("state", state), ("team", team), ("limit", limit), ("after", after))
            if v is not None
        }
        body = _object(self._request("GET", "/v1/jobs", params=params))
        jobs = body.get("jobs")
        if not isinstance(jobs, list):
            raise GpupoolError(f"{self.url}/v1/jobs answered without a jobs list; {_PROTOCOL}")
        return jobs

    def job(self, id: int) -> dict[str, Any]:
        return _object(self._request("GET", f"/v1/jobs/{id}"))

    def cancel(self, id: int) -> dict[str, Any]:
        return _object(self._request("POST", f"/v1/jobs/{id}/cancel"))

    def logs(self, id: int, stream: str = "stdout", offset: int = 0) -> tuple[str, int, str]:
        """The log text from byte `offset`, the offset to ask for next, and the job's state.

        A UTF-8 character cut in two by the end of the chunk is left for the next call (the
        returned offset stops before it) while the job still runs, so following a log never
        prints replacement characters at chunk boundaries.
        """
        resp = self._request(
            "GET", f"/v1/jobs/{id}/logs", params={"stream": stream, "offset": offset}
        )
        state = resp.headers.get("X-Job-State", "")
        try:
            next_offset = int(resp.headers["X-Log-Offset"])
        except (KeyError, ValueError):
            raise GpupoolError(
                f"{self.url} sent job {id}'s log without a valid X-Log-Offset header; {_PROTOCOL}"
            ) from None
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        text = decoder.decode(resp.content, final=state in TERMINAL_STATES)
        held_back = len(decoder.getstate()[0])
        return text, next_offset - held_back, state

    def cluster(self) -> dict[str, Any]:
        return _object(self._request("GET", "/v1/cluster"))

    def events(self, after: int = 0, wait_s: float = 0) -> dict[str, Any]:
        """Events after sequence number `after`; the server may hold the answer up to wait_s."""
        resp = self._request(
            "GET",
            "/v1/events",
            params={"after": after, "wait": wait_s},
            timeout=self.timeout_s + wait_s,
        )
        return _object(resp)

    def _request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json: Any = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> httpx.Response:
        try:
            resp = self._http.request(
                method,
                path,
                params=params,
                json=json,
                headers=headers,
                timeout=self.timeout_s if timeout is None else timeout,
            )
        except (httpx.ConnectError, httpx.ConnectTimeout):
            raise GpupoolError(
                f"cannot reach the gpupool server at {self.url}; is `gpupool serve` running? "
                "set GPUPOOL_URL (or --url) to its address"
            ) from None
        except httpx.TimeoutException:
            raise GpupoolError(
                f"the gpupool server at {self.url} did not answer {method} {path} within "
                f"{timeout or self.timeout_s:g} s; it may be overloaded, try again"
            ) from None
        except httpx.HTTPError as exc:
            raise GpupoolError(
                f"lost the connection to the gpupool server at {self.url} ({exc}); try again"
            ) from None
        if resp.is_success:
            return resp
        raise _error(resp, self.url, method, path)


_PROTOCOL = "is it a gpupool server speaking API version 1?"


def _object(resp: httpx.Response) -> dict[str, Any]:
    """The response's JSON object, or an error that says the server is not what we expect."""
    try:
        body = resp.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise GpupoolError(
            f"{resp.request.url} answered {resp.status_code} without a JSON object; {_PROTOCOL}"
        )
    return body


def _error(resp: httpx.Response, url: str, method: str, path: str) -> GpupoolError:
    """Turn a failed response into the matching gpupool error, keeping the server's words."""
    status = resp.status_code
    detail: Any
    try:
        detail = resp.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    if detail is None:
        detail = resp.text.strip()[:200] or resp.reason_phrase
    if status == 422 and isinstance(detail, list):
        lines = "\n".join(f"  {_field_problem(d)}" for d in detail)
        return SpecError(f"the server rejected the request:\n{lines}")
    message = detail if isinstance(detail, str) else str(detail)
    if status in (401, 403):
        what = "needs a token" if status == 401 else "refused this token"
        return AuthError(
            f"the gpupool server at {url} {what} ({message}); set GPUPOOL_TOKEN or pass "
            "--token with a valid token"
        )
    if status == 404:
        if message == "Not Found":  # FastAPI's answer for a route it does not have
            return NotFoundError(f"{url} has no {method} {path}; {_PROTOCOL}")
        return NotFoundError(message)
    if status == 409:
        return ConflictError(message)
    if status in (400, 422):
        return SpecError(message)
    if status >= 500:
        return GpupoolError(
            f"server error {status} on {method} {path}: {message}; see the server's log"
        )
    return GpupoolError(f"{url} answered {status} to {method} {path}: {message}")


def _field_problem(item: Any) -> str:
    """One FastAPI validation problem as 'field gpus: Input should be ...'."""
    if not isinstance(item, dict):
        return str(item)
    loc = [str(p) for p in item.get("loc", [])]
    if loc and loc[0] in ("body", "query", "path", "header"):
        loc = loc[1:]
    msg = item.get("msg", "invalid")
    return f"field {'.'.join(loc)}: {msg}" if loc else f"request: {msg}"
