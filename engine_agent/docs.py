"""`/docs`: Swagger UI for the OpenAPI document, served entirely from this process (the coordinator's
and the agent's alike).

FastAPI's default page loads its script and styles from a public CDN: any change there would run beside
the token or agent key a reader pastes into "Authorize". Here the assets come from the installed
`fastapi-offline` package (Swagger UI 5, which reads OpenAPI 3.1), the page's only script is our own
file, and a Content-Security-Policy allows nothing from elsewhere. ReDoc is not served (it would need
another bundle).
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse, HTMLResponse

ASSETS = Path(fastapi_offline.__file__).parent / "static"
OWN_STATIC = Path(__file__).parent / "docs_static"
_ALLOWED = {
    "swagger-ui-bundle.js": ASSETS / "swagger-ui-bundle.js",
    "swagger-ui.css": ASSETS / "swagger-ui.css",
    "favicon.png": ASSETS / "favicon.png",
    "init.js": OWN_STATIC / "init.js",
}
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
    "form-action 'self'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

_PAGE = """<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>{title}</title>
  <link rel="icon" href="/docs/static/favicon.png">
  <link rel="stylesheet" href="/docs/static/swagger-ui.css">
</head>
<body>
  <div id="swagger-ui" data-openapi-url="/openapi.json"></div>
  <script src="/docs/static/swagger-ui-bundle.js"></script>
  <script src="/docs/static/init.js"></script>
</body>
</html>
"""


def docs_router(title: str) -> APIRouter:
    """`/docs` and its assets under `/docs/static/` (not in the OpenAPI document)."""
    router = APIRouter(include_in_schema=False)
    page = _PAGE.format(title=title)

    @router.get("/docs")
    async def swagger_page() -> HTMLResponse:
        return HTMLResponse(page, headers=SECURITY_HEADERS)

    @router.get("/docs/static/{name}")
    async def swagger_asset(name: str) -> FileResponse:
        path = _ALLOWED.get(name)
        if path is None:
            raise HTTPException(status_code=404, detail=f"no docs asset {name!r}")
        return FileResponse(
            path, headers={"Cache-Control": "max-age=3600", "X-Content-Type-Options": "nosniff"}
        )

    return router
