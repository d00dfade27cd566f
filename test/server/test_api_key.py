"""Where the server's API key comes from, and which routes stay open without it (no server:
the resolution function and the ASGI middleware are driven directly)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from radixgen.errors import InvalidRequestError
from radixgen.runtime.entrypoints.http_utils import ApiKeyMiddleware
from radixgen.server_args import API_KEY_ENV, HttpConfig, ServerArgs, resolve_api_key


def test_key_sources_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("from-file\n")
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert resolve_api_key(HttpConfig(api_key="from-flag")) == "from-flag"
    assert resolve_api_key(HttpConfig(api_key_file=str(key_file))) == "from-file"
    assert resolve_api_key(HttpConfig()) == "from-env"
    monkeypatch.delenv(API_KEY_ENV)
    assert resolve_api_key(HttpConfig()) is None


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("missing", "cannot read the API key file"),
        ("empty", "is empty"),
        ("both", "give --api-key or --api-key-file, not both"),
    ],
)
def test_bad_key_settings_fail_before_anything_starts(
    tmp_path: Path, setup: str, message: str
) -> None:
    path = tmp_path / "key"
    flags = {"api_key_file": str(path)}
    if setup == "empty":
        path.write_text("  \n")
    elif setup == "both":
        path.write_text("k")
        flags["api_key"] = "k"
    with pytest.raises(InvalidRequestError, match=message) as err:
        ServerArgs.from_kwargs(**flags)
    assert err.value.param == "api_key_file"


def _status(path: str, authorization: bytes | None) -> int:
    """Status a request to `path` gets through the middleware (the app behind it answers 200)."""
    sent: list[dict] = []

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def send(message):
        sent.append(message)

    headers = [(b"authorization", authorization)] if authorization is not None else []
    scope = {"type": "http", "method": "GET", "path": path, "headers": headers}
    asyncio.run(ApiKeyMiddleware(app, "sekret")(scope, None, send))
    return sent[0]["status"]


@pytest.mark.parametrize("path", ["/health", "/ping"])
def test_only_the_liveness_probes_are_open(path: str) -> None:
    assert _status(path, None) == 200


@pytest.mark.parametrize(
    "path",
    [
        "/health_generate",
        "/metrics",
        "/generate",
        "/v1/models",
        "/flush_cache",
        "/abort_request",
        "/server_info",
        "/health/",
        "/pingx",
    ],
)
def test_every_other_route_needs_the_key(path: str) -> None:
    assert _status(path, None) == 401
    assert _status(path, b"Bearer wrong") == 401
    assert _status(path, b"Bearer sekret") == 200


def _dashboard_status(path: str, query: bytes = b"", cookie: bytes | None = None) -> int:
    """Status of a browser-style request (no Authorization header) through the middleware."""
    sent: list[dict] = []

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def send(message):
        sent.append(message)

    headers = [(b"cookie", cookie)] if cookie is not None else []
    scope = {"type": "http", "method": "GET", "path": path, "headers": headers,
             "query_string": query}  # fmt: skip
    asyncio.run(ApiKeyMiddleware(app, "sekret")(scope, None, send))
    return sent[0]["status"]


def test_dashboard_needs_the_key_too() -> None:
    for path in ("/dashboard", "/dashboard/api/snapshot", "/dashboard/static/dashboard.js"):
        assert _status(path, None) == 401
        assert _status(path, b"Bearer sekret") == 200
        assert _dashboard_status(path) == 401


def test_dashboard_key_in_the_page_query_only() -> None:
    """A browser opens /dashboard?api_key=<key> once; the key in any other query is refused."""
    assert _dashboard_status("/dashboard", b"api_key=sekret") == 200
    assert _dashboard_status("/dashboard", b"api_key=wrong") == 401
    assert _dashboard_status("/dashboard/api/snapshot", b"api_key=sekret") == 401
    assert _dashboard_status("/generate", b"api_key=sekret") == 401


def test_dashboard_cookie_admits_the_dashboard_only() -> None:
    from radixgen.runtime.dashboard.auth import DASHBOARD_COOKIE, dashboard_token

    good = f"{DASHBOARD_COOKIE}={dashboard_token('sekret')}".encode()
    for path in ("/dashboard", "/dashboard/api/stream", "/dashboard/static/dashboard.css"):
        assert _dashboard_status(path, cookie=good) == 200
    assert _dashboard_status("/dashboard/api/snapshot", cookie=b"other=1; " + good) == 200
    assert _dashboard_status("/generate", cookie=good) == 401
    assert _dashboard_status("/dashboardx", cookie=good) == 401
    assert _dashboard_status("/dashboard", cookie=f"{DASHBOARD_COOKIE}=sekret".encode()) == 401
    assert _dashboard_status("/dashboard", cookie=b"\x00bad;;==") == 401
