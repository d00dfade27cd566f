"""How a browser passes the API key to the dashboard (API process, in the API-key middleware).

A browser cannot put a Bearer header on a page load, on `<script src>` or on an EventSource, so
dashboard paths also accept: `GET /dashboard?api_key=<key>` (once, by hand), which answers with a
redirect to `/dashboard` setting an HttpOnly, SameSite=Strict cookie scoped to `/dashboard`; the
cookie then admits the page's assets, its JSON API and its stream. The cookie holds an HMAC of the
key, never the key, and admits nothing outside `/dashboard`.
"""

from __future__ import annotations

import hashlib
import hmac
from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qs

from starlette.types import Scope

DASHBOARD_PATH = "/dashboard"
DASHBOARD_COOKIE = "radixgen_dashboard"
KEY_QUERY = "api_key"


def is_dashboard_path(path: str) -> bool:
    return path == DASHBOARD_PATH or path.startswith(DASHBOARD_PATH + "/")


def dashboard_token(api_key: str) -> str:
    """The cookie's value: derived from the key, useless anywhere but the dashboard."""
    return hmac.new(api_key.encode(), b"radixgen-dashboard", hashlib.sha256).hexdigest()


def query_key(scope: Scope) -> str | None:
    """The `api_key` query parameter of a request (None when absent)."""
    raw = scope.get("query_string", b"").decode("latin-1")
    values = parse_qs(raw).get(KEY_QUERY)
    return values[0] if values else None


def cookie_token(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"cookie":
            try:
                jar = SimpleCookie(value.decode("latin-1"))
            except CookieError:
                return None
            morsel = jar.get(DASHBOARD_COOKIE)
            return morsel.value if morsel is not None else None
    return None


def dashboard_admits(scope: Scope, api_key: str) -> bool:
    """The dashboard's own credentials: the key in the page's query, or the derived cookie."""
    path = scope["path"]
    if not is_dashboard_path(path):
        return False
    given = query_key(scope) if path == DASHBOARD_PATH else None
    if given is not None and hmac.compare_digest(given.encode(), api_key.encode()):
        return True
    token = cookie_token(scope)
    return token is not None and hmac.compare_digest(
        token.encode(), dashboard_token(api_key).encode()
    )
