"""The chat page at `/` and its static files under `/ui/` (package data, vendored, offline)."""

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse

STATIC = Path(__file__).parent / "static"
# the page runs only its own scripts and talks only to this server: model output that slips
# past the sanitizer still cannot run inline script, load remote images or send data away
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data: blob:; object-src 'none'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
MEDIA = {".js": "text/javascript", ".css": "text/css", ".html": "text/html", ".md": "text/plain",
         ".txt": "text/plain"}  # fmt: skip


def _file_route(path: Path, headers: dict[str, str]):
    media = MEDIA.get(path.suffix, "text/plain")

    async def serve() -> FileResponse:
        return FileResponse(path, media_type=media, headers=headers)

    return serve


def add_routes(app: FastAPI) -> None:
    """`/` is the page; each static file is its own GET route under `/ui/`. One route per file,
    not a mount: a mount at `/ui` would answer 404 for every other page's files under it."""
    page = {"Content-Security-Policy": CSP, "Cache-Control": "no-cache"}
    app.add_api_route("/", _file_route(STATIC / "index.html", page), include_in_schema=False)
    app.add_api_route("/ui/", _file_route(STATIC / "index.html", page), include_in_schema=False)
    for path in sorted(STATIC.rglob("*")):
        if path.is_file() and path.suffix in MEDIA:
            url = "/ui/" + path.relative_to(STATIC).as_posix()
            headers = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}
            app.add_api_route(url, _file_route(path, headers), include_in_schema=False)
