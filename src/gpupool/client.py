"""A small HTTP client for the gpupool server's REST API (version 1).

Every failure comes back as a gpupool error whose message says what to do, so the command
line and scripts never have to read HTTP status codes or httpx exceptions.
"""

from __future__ import annotations

import codecs
import os
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import yaml

from gpupool import __version__
from gpupool.domain.lifecycle import TERMINAL_NAMES
from gpupool.errors import ConflictError, GpupoolError, NotFoundError, SpecError

DEFAULT_URL = "http://127.0.0.1:8642"


class AuthError(GpupoolError):
    """The server refused our credentials (HTTP 401 or 403)."""


class RateLimitedError(GpupoolError):
    """The server refused a submission for its team's submit rate (429)."""


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


def ca_cert_setting(flag: str | None) -> str | None:
    """The CA certificate to trust for https: --ca-cert, then GPUPOOL_CA_CERT, then the
    config file's ca_cert; None: the system's trust store."""
    value = flag or os.environ.get("GPUPOOL_CA_CERT") or None
    return value or _read_config().get("ca_cert") or None


def tls_context(ca_cert: str | None) -> ssl.SSLContext:
    """Verify the server against ca_cert (a PEM file), or the system's trust store."""
    if ca_cert is None:
        return ssl.create_default_context()
    path = Path(ca_cert).expanduser()
    if not path.is_file():
        raise NotFoundError(
            f"CA certificate {path} is not a file; fix --ca-cert, GPUPOOL_CA_CERT or ca_cert "
            "in the config file"
        )
    try:
        return ssl.create_default_context(cafile=str(path))
    except ssl.SSLError as exc:
        raise SpecError(
            f"{path} is not a PEM CA certificate ({exc.reason}); fix the file"
        ) from None


def _read_config() -> dict[str, str]:
    """The url, token and ca_cert keys of the config file; other keys belong to other tools."""
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
    for key in ("url", "token", "ca_cert"):
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
        ca_cert: str | None = None,
        sleep: Callable[[float], None] = time.sleep,
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
        self.sleep = sleep
        # plain http has no TLS to verify (requests go to this URL's paths only, redirects are
        # not followed): False spares building the default context, 40 ms of each command
        verify: ssl.SSLContext | bool = (
            tls_context(ca_cert) if self.url.startswith("https://") else False
        )
        self._http = httpx.Client(
            base_url=self.url,
            headers=headers,
            timeout=timeout_s,
            transport=transport,
            verify=verify,
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

    def submit(
        self, spec: dict[str, Any], idempotency_key: str | None = None, attempts: int = 1
    ) -> dict[str, Any]:
        """Create a job; with the same idempotency key a retry returns the first job.

        With a key, up to `attempts` tries when the answer is lost (connection dropped,
        timeout, 502/503/504), each with the same key: the server creates the job once."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        if idempotency_key:
            hint = (
                "the job may have been created: rerun with --idempotency-key "
                f"{idempotency_key} to retry without making a second one"
            )
        else:
            hint = "the job may have been created: check `gpupool ls` before submitting again"
        resp = self._request(
            "POST",
            "/v1/jobs",
            json=spec,
            headers=headers,
            attempts=attempts if idempotency_key else 1,
            hint=hint,
        )
        return _object(resp)

    def jobs(
        self,
        state: str | None = None,
        team: str | None = None,
        limit: int | None = None,
        after: int | None = None,
        before: int | None = None,
        order: str | None = None,
    ) -> list[dict[str, Any]]:
        """One page of jobs as the server sends it (see all_jobs to page through)."""
        params = {
            k: v
            for k, v in (
                ("state", state),
                ("team", team),
                ("limit", limit),
                ("after", after),
                ("before", before),
                ("order", order),
            )
            if v is not None
        }
        body = _object(self._request("GET", "/v1/jobs", params=params))
        jobs = body.get("jobs")
        if not isinstance(jobs, list):
            raise GpupoolError(f"{self.url}/v1/jobs answered without a jobs list; {_PROTOCOL}")
        return jobs

    def all_jobs(
        self,
        state: str | None = None,
        team: str | None = None,
        limit: int | None = None,
        newest_first: bool = True,
        page: int = 1000,
    ) -> tuple[list[dict[str, Any]], bool]:
        """Up to `limit` jobs (None: every one), paging through the server's list; and
        whether more are left. Newest first unless newest_first is False."""
        out: list[dict[str, Any]] = []
        cursor: int | None = None
        while limit is None or len(out) < limit:
            want = page if limit is None else min(page, limit - len(out) + 1)
            if newest_first:
                got = self.jobs(state, team, limit=want, before=cursor, order="desc")
            else:
                got = self.jobs(state, team, limit=want, after=cursor, order="asc")
            got = [j for j in got if cursor is None or _beyond(j, cursor, newest_first)][:want]
            out += got
            if len(got) < want:
                return out, False
            cursor = int(got[-1]["id"])
        return out[:limit], True

    # -- tokens and the audit trail (admin) --
    def create_token(
        self,
        name: str,
        team: str | None = None,
        role: str | None = None,
        expires_in_s: float | None = None,
    ) -> dict[str, Any]:
        """A new token: its fields, and under "token" the secret, shown this once."""
        body: dict[str, Any] = {"name": name}
        for key, value in (("team", team), ("role", role), ("expires_in_s", expires_in_s)):
            if value is not None:
                body[key] = value
        return _object(self._request("POST", "/v1/tokens", json=body))

    def tokens(self) -> list[dict[str, Any]]:
        return _list(self._request("GET", "/v1/tokens"), "tokens")

    def revoke_token(self, ref: str) -> dict[str, Any]:
        """Revoke the token with this name (or id); refused from its next request on."""
        return _object(self._request("POST", f"/v1/tokens/{ref}/revoke"))

    def audit(
        self,
        limit: int = 100,
        before: int | None = None,
        since: float | None = None,
        token: str | None = None,
    ) -> list[dict[str, Any]]:
        params = {
            k: v
            for k, v in (("limit", limit), ("before", before), ("since", since), ("token", token))
            if v is not None
        }
        return _list(self._request("GET", "/v1/audit", params=params), "audit")

    def job(self, id: int) -> dict[str, Any]:
        return _object(self._request("GET", f"/v1/jobs/{id}"))

    def cancel(self, id: int) -> dict[str, Any]:
        return _object(self._request("POST", f"/v1/jobs/{id}/cancel"))

    # lifecycle: hold, release, requeue, drain
    def hold(self, id: int) -> dict[str, Any]:
        return _object(self._request("POST", f"/v1/jobs/{id}/hold"))

    def release(self, id: int) -> dict[str, Any]:
        return _object(self._request("POST", f"/v1/jobs/{id}/release"))

    def requeue(self, id: int, hold: bool = False) -> dict[str, Any]:
        params = {"hold": "true"} if hold else None
        return _object(self._request("POST", f"/v1/jobs/{id}/requeue", params=params))

    # the learned policy
    def learn(self) -> dict[str, Any]:
        return _object(self._request("GET", "/v1/learn", attempts=3))

    def learn_history(self, days: float) -> dict[str, Any]:
        return _object(self._request("GET", "/v1/learn/history", params={"days": days}, attempts=3))

    def learn_promote(self, evidence: dict[str, Any]) -> dict[str, Any]:
        return _object(self._request("POST", "/v1/learn/promote", json={"evidence": evidence}))

    def learn_demote(self, reason: str = "") -> dict[str, Any]:
        return _object(self._request("POST", "/v1/learn/demote", json={"reason": reason}))

    def learner_promote(self, learner: str) -> dict[str, Any]:
        """A learner judged by its own guard (the demand forecast): the server decides on
        its record."""
        return _object(self._request("POST", f"/v1/learn/{learner}/promote"))

    def learner_demote(self, learner: str, reason: str = "") -> dict[str, Any]:
        return _object(
            self._request("POST", f"/v1/learn/{learner}/demote", json={"reason": reason})
        )

    # services
    def create_service(self, spec: dict[str, Any]) -> dict[str, Any]:
        return _object(self._request("POST", "/v1/services", json=spec))

    def services(self) -> list[dict[str, Any]]:
        return _list(self._request("GET", "/v1/services", attempts=3), "services")

    def service(self, name: str) -> dict[str, Any]:
        return _object(self._request("GET", f"/v1/services/{name}", attempts=3))

    def scale_service(self, name: str, low: int, high: int) -> dict[str, Any]:
        body = {"min_replicas": low, "max_replicas": high}
        return _object(self._request("POST", f"/v1/services/{name}/scale", json=body))

    def delete_service(self, name: str) -> dict[str, Any]:
        return _object(self._request("DELETE", f"/v1/services/{name}"))

    def drain(self, node: str, undo: bool = False, reason: str = "") -> dict[str, Any]:
        body = {"node": node, "undo": undo, "reason": reason}
        return _object(self._request("POST", "/v1/drain", json=body))

    def logs(
        self, id: int, stream: str = "stdout", offset: int = 0, rank: int = 0
    ) -> tuple[str, int, str]:
        """The log text from byte `offset`, the offset to ask for next, and the job's state
        (`rank` > 0: that member's of a job across nodes).

        A UTF-8 character cut in two by the end of the chunk is left for the next call (the
        returned offset stops before it) while the job still runs, so following a log never
        prints replacement characters at chunk boundaries.
        """
        params: dict[str, str | int] = {"stream": stream, "offset": offset}
        if rank:
            params["rank"] = rank
        resp = self._request("GET", f"/v1/jobs/{id}/logs", params=params)
        state = resp.headers.get("X-Job-State", "")
        try:
            next_offset = int(resp.headers["X-Log-Offset"])
        except (KeyError, ValueError):
            raise GpupoolError(
                f"{self.url} sent job {id}'s log without a valid X-Log-Offset header; {_PROTOCOL}"
            ) from None
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        text = decoder.decode(resp.content, final=state in TERMINAL_NAMES)
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

    def get_json(self, path: str) -> Any:
        """GET any path of the API once and return its decoded JSON as it came (no shape
        checked): for callers that read a document this client has no method for."""
        return self._request("GET", path).json()

    def _request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json: Any = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
        attempts: int = 1,
        hint: str = "try again",
    ) -> httpx.Response:
        """One call; `attempts` > 1 only for calls that are safe to repeat, which are
        repeated (after 0.5, 1, 2... s) when the answer is lost or the server is busy."""
        for attempt in range(1, attempts + 1):
            last = attempt == attempts
            try:
                resp = self._http.request(
                    method,
                    path,
                    params=params,
                    json=json,
                    headers=headers,
                    timeout=self.timeout_s if timeout is None else timeout,
                )
            except httpx.HTTPError as exc:
                if last or _cause(exc, ssl.SSLCertVerificationError) is not None:
                    raise self._lost(exc, method, path, timeout, hint) from None
            else:
                if resp.is_success:
                    return resp
                if last or resp.status_code not in RETRYABLE:
                    raise _error(resp, self.url, method, path)
            self.sleep(min(0.5 * 2 ** (attempt - 1), 4.0))
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _lost(
        self,
        exc: httpx.HTTPError,
        method: str,
        path: str,
        timeout: float | None,
        hint: str,
    ) -> GpupoolError:
        """What a transport failure means for the user, and what to do."""
        untrusted = _cause(exc, ssl.SSLCertVerificationError)
        if untrusted is not None:
            return GpupoolError(
                f"the gpupool server at {self.url} has a certificate this client does not "
                f"trust ({untrusted.verify_message or untrusted}); pass --ca-cert FILE or set "
                "GPUPOOL_CA_CERT to the certificate of the CA that signed it"
            )
        if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
            return GpupoolError(
                f"cannot reach the gpupool server at {self.url}; is `gpupool serve` running? "
                "set GPUPOOL_URL (or --url) to its address"
            )
        if isinstance(exc, httpx.TimeoutException):
            return GpupoolError(
                f"the gpupool server at {self.url} did not answer {method} {path} within "
                f"{timeout or self.timeout_s:g} s; it may be overloaded; {hint}"
            )
        return GpupoolError(
            f"lost the connection to the gpupool server at {self.url} ({exc}); {hint}"
        )


RETRYABLE = frozenset({502, 503, 504})
"""Answers that mean the request may not have been handled: a proxy's or an overloaded
server's (uvicorn's --limit-concurrency answers 503)."""


def _cause(exc: BaseException, kind: type[ssl.SSLCertVerificationError]) -> Any:
    """The first exception of `kind` in exc's chain of causes, or None."""
    seen: BaseException | None = exc
    for _ in range(16):
        if seen is None:
            return None
        if isinstance(seen, kind):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _beyond(job: dict[str, Any], cursor: int, newest_first: bool) -> bool:
    """Whether a job lies past the paging cursor (a server that ignores before/after
    must not make the pager loop)."""
    job_id = job.get("id")
    if not isinstance(job_id, int):
        return False
    return job_id < cursor if newest_first else job_id > cursor


def _list(resp: httpx.Response, key: str) -> list[dict[str, Any]]:
    body = _object(resp)
    items = body.get(key)
    if not isinstance(items, list):
        raise GpupoolError(f"{resp.request.url} answered without a {key} list; {_PROTOCOL}")
    return items


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
    if status == 429:
        after = resp.headers.get("Retry-After")
        return RateLimitedError(
            message + (f" (the server says retry after {after} s)" if after else "")
        )
    if status == 507:  # the server's disk is full: its sentence says what to do
        return GpupoolError(f"the gpupool server at {url} refused {method} {path}: {message}")
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
