"""The one rule for URLs the coordinator will call later (engine agents, webhook receivers, vLLM
servers): accepted only if both HTTP clients it uses (httpx and aiohttp) can send to them, so a URL
taken today never turns into an error in a background task tomorrow."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlsplit

import httpx
from pydantic import AfterValidator
from yarl import URL as YarlURL

# Printable ASCII without spaces: what a URL's text may hold (control characters never reach a client).
PRINTABLE_HTTP_URL_PATTERN = r"^https?://[!-~]+$"


def checked_http_url(url: str) -> str:
    """`url` itself if it is an absolute http(s) URL with a host that httpx and aiohttp both accept;
    otherwise ValueError saying why (pydantic turns it into a 422)."""
    if any(ord(char) < 0x21 or ord(char) > 0x7E for char in url):
        raise ValueError("url must be printable ASCII without spaces")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port out of range or not a number
        httpx.URL(url)
        YarlURL(url)
    except (ValueError, httpx.InvalidURL) as error:
        raise ValueError(f"url is not a valid URL: {error}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("url must be an absolute http:// or https:// URL with a host")
    return url


HttpUrlText = Annotated[str, AfterValidator(checked_http_url)]
