"""The operator dashboard at `/ui`: static files only, no front-end build step.

The page assets need no token (they hold no data); the page asks the operator for a bearer token once,
keeps it in the browser's localStorage and sends it with every `/v1` call it makes.
Every `/ui/...` path that is not a static file answers the same HTML shell, so job pages have real,
shareable URLs (`/ui/jobs/{id}`) and the script routes on `location.pathname`.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse, RedirectResponse

STATIC_DIR = Path(__file__).parent / "static"
_INDEX = STATIC_DIR / "index.html"
# The shell must never be served stale after an upgrade; the assets are small, so no caching at all.
_NO_CACHE = {"Cache-Control": "no-cache"}
# The token lives in localStorage: only our own scripts may run, and nothing may be sent elsewhere.
# Inline style attributes stay allowed (the views set widths and colours with them); inline scripts,
# other origins, plugins, framing and <base> do not.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
    "form-action 'self'"
)
_PAGE_HEADERS = {
    **_NO_CACHE,
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
_ASSET_HEADERS = {**_NO_CACHE, "X-Content-Type-Options": "nosniff"}

router = APIRouter(include_in_schema=False)


@router.get("/ui")
async def dashboard_root() -> RedirectResponse:
    return RedirectResponse("/ui/", status_code=307)


@router.get("/ui/static/{asset_path:path}")
async def dashboard_asset(asset_path: str) -> FileResponse:
    asset = (STATIC_DIR / asset_path).resolve()
    # Refuse anything that escapes the static folder (`..`, absolute paths, links).
    if not asset.is_relative_to(STATIC_DIR.resolve()) or not asset.is_file():
        raise HTTPException(status_code=404, detail=f"no dashboard asset {asset_path!r}")
    return FileResponse(asset, headers=_ASSET_HEADERS)


@router.get("/ui/{page_path:path}")
async def dashboard_page(page_path: str) -> FileResponse:
    return FileResponse(_INDEX, media_type="text/html", headers=_PAGE_HEADERS)
