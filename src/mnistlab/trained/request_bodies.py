"""The server's front door for request bodies (an ASGI middleware, before LitServe reads them).

LitServe hands an endpoint's body to the worker as parsed JSON: a raw image would fail its parsing
with a 500, and so would broken JSON. Here a raw body (an image, a ``.npy`` array) is wrapped as
``{"image": <base64>}``, JSON is checked, and an empty body, broken JSON or one over ``max_bytes``
gets its 400 or 413 with a one-line reason before any work.
"""

import base64
import json

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

USAGE = 'send an image (PNG, JPEG) as the body, or JSON {"images": [<base64>, ...]}'


class RequestBodies:
    def __init__(self, app: ASGIApp, path: str, max_bytes: int) -> None:
        self.app, self.path, self.max_bytes = app, path, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != self.path or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        body = await self._read(scope, receive)
        refusal = self._refusal(body, _content_type(scope))
        if refusal is not None:
            await JSONResponse({"detail": refusal[1]}, status_code=refusal[0])(scope, receive, send)
            return
        if not _content_type(scope).startswith("application/json"):
            body = json.dumps({"image": base64.b64encode(body or b"").decode()}).encode()
            scope = {**scope, "headers": _with_json_type(scope["headers"], len(body))}
        sent = False

        async def replay() -> Message:  # the (wrapped) body, once; then whatever the client sends next
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _read(self, scope: Scope, receive: Receive) -> bytes | None:
        """The whole body, or None once it passes ``max_bytes`` (read no further)."""
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if declared.isdigit() and int(declared) > self.max_bytes:
            return None
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return None
            more = message.get("more_body", False)
        return b"".join(chunks)

    def _refusal(self, body: bytes | None, content_type: str) -> tuple[int, str] | None:
        if body is None:
            return 413, f"the body is over max_body_bytes={self.max_bytes:,} bytes (a config value)"
        if not body:
            return 400, f"the body is empty: {USAGE}"
        if content_type.startswith("application/json"):
            try:
                json.loads(body)
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                return 400, f"the body is not valid JSON ({err}): {USAGE}"
        return None


def _content_type(scope: Scope) -> str:
    return dict(scope["headers"]).get(b"content-type", b"").decode("latin-1").lower()


def _with_json_type(headers: list[tuple[bytes, bytes]], length: int) -> list[tuple[bytes, bytes]]:
    kept = [(k, v) for k, v in headers if k not in (b"content-type", b"content-length")]
    return [*kept, (b"content-type", b"application/json"), (b"content-length", str(length).encode())]
