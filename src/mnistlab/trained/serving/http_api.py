"""The HTTP API of one server process (Starlette): ``POST /predict``, ``GET /health``, ``GET /info``.

``POST /predict`` takes one input as the body (a PNG or JPEG image; ``decode=npy``: a ``.npy`` array) or
a JSON batch ``{"images": [<base64>, ...]}`` (``{"image": <base64>}`` for one), and answers
``{"class", "name", "probabilities"}`` (a batch: ``{"predictions": [...]}``). Each input becomes the
network's input as ``predict.py`` prepares a file (``conf/decode/``), on the model's thread, batched
with the inputs of other requests (``batching``).

A request is data from anyone: a bad one (empty, over ``max_body_bytes``, not JSON where it says JSON,
not an image, too many pixels or images, an input the network cannot take) gets HTTP 400 (413 for
size) with a one-line reason, alone: the inputs batched with it are answered as if it had not come.
"""

import asyncio
import base64
import binascii
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from mnistlab.runtime.run.failures import InputError
from mnistlab.trained.classifier import TrainedClassifier
from mnistlab.trained.serving.batching import Batcher

USAGE = 'send an image (PNG, JPEG) as the body, or JSON {"images": [<base64>, ...]}'


class Refused(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


def app(net: TrainedClassifier, decode: Callable[[bytes], np.ndarray], cfg: Any, info: dict[str, Any]) -> Starlette:
    """The API around ``net``; ``cfg``: conf/serve.yaml's limits and batching; ``info``: what /info says."""
    batcher = Batcher(lambda bodies: classify(net, decode, bodies), cfg.max_batch_size, cfg.batch_timeout)

    async def predict(request: Request) -> Response:
        try:
            bodies, batch = _bodies(await _read(request, cfg.max_body_bytes), request, cfg.max_images)
            results = await asyncio.wait_for(batcher.submit(bodies), cfg.timeout)
        except Refused as err:
            return _refusal(err.status, str(err))
        except TimeoutError:
            return _refusal(504, f"no answer within timeout={cfg.timeout} s (a config value): the server is busy")
        if reasons := [r for r in results if isinstance(r, str)]:
            return _refusal(400, reasons[0])
        answers = [_answer(net, p) for p in results]
        return JSONResponse({"predictions": answers} if batch else answers[0])

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        task = asyncio.get_running_loop().create_task(batcher.run())
        yield
        task.cancel()

    routes = [
        Route("/predict", predict, methods=["POST"]),
        Route("/health", lambda _: PlainTextResponse("ok")),  # answered once a process has its model
        Route("/info", lambda _: JSONResponse(info)),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


def classify(
    net: TrainedClassifier, decode: Callable[[bytes], np.ndarray], bodies: list[bytes]
) -> list[np.ndarray | str]:
    """Each body's class probabilities, or why it is refused: decoded, then one forward pass per input shape."""
    inputs: list[np.ndarray | str] = []
    for body in bodies:
        try:
            inputs.append(decode(body))
        except InputError as err:
            inputs.append(str(err))
    results = list(inputs)
    for shape in {x.shape for x in inputs if isinstance(x, np.ndarray)}:
        chosen = [i for i, x in enumerate(inputs) if isinstance(x, np.ndarray) and x.shape == shape]
        answers: list[np.ndarray | str]
        try:
            answers = list(net.probabilities(np.stack([inputs[i] for i in chosen])))
        except InputError as err:  # a shape the model says it does not take
            answers = [str(err)] * len(chosen)
        except Exception as err:  # noqa: BLE001 -- torch and onnxruntime raise their own types for a bad shape
            answers = [f"the network cannot take an input of shape {shape}: {err}"] * len(chosen)
        for i, answer in zip(chosen, answers, strict=True):
            results[i] = answer
    return results


async def _read(request: Request, max_bytes: int) -> bytes:
    """The whole body; refused once it passes ``max_bytes``, read no further."""
    declared = request.headers.get("content-length", "0")
    refusal = Refused(413, f"the body is over max_body_bytes={max_bytes:,} bytes (a config value)")
    if declared.isdigit() and int(declared) > max_bytes:
        raise refusal
    chunks, size = [], 0
    async for chunk in request.stream():
        chunks.append(chunk)
        size += len(chunk)
        if size > max_bytes:
            raise refusal
    return b"".join(chunks)


def _bodies(body: bytes, request: Request, max_images: int) -> tuple[list[bytes], bool]:
    """The request's inputs, and whether it was a JSON batch."""
    if not body:
        raise Refused(400, f"the body is empty: {USAGE}")
    if not request.headers.get("content-type", "").lower().startswith("application/json"):
        return [body], False
    try:
        sent = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise Refused(400, f"the body is not valid JSON ({err}): {USAGE}") from None
    except RecursionError:  # [[[[...]]]] nested deeper than the parser's stack: no request of this API nests
        raise Refused(400, f"the JSON is nested too deep: {USAGE}") from None
    if not isinstance(sent, dict) or not ({"image", "images"} & sent.keys()):
        raise Refused(400, 'the JSON must be {"image": <base64>} or {"images": [<base64>, ...]}')
    encoded = sent["images"] if "images" in sent else [sent["image"]]
    if not isinstance(encoded, list) or not encoded or not all(isinstance(e, str) for e in encoded):
        raise Refused(400, '"images" must be a list of base64 strings, one per image')
    if len(encoded) > max_images:
        raise Refused(400, f"{len(encoded)} images in one request, over max_images={max_images} (a config value)")
    try:
        return [base64.b64decode(e, validate=True) for e in encoded], "images" in sent
    except binascii.Error as err:
        raise Refused(400, f"an image is not valid base64: {err}") from None


def _refusal(status: int, reason: str) -> JSONResponse:
    return JSONResponse({"detail": " ".join(reason.split())}, status_code=status)


def _answer(net: TrainedClassifier, probabilities: np.ndarray) -> dict[str, Any]:
    label = int(probabilities.argmax())
    return {"class": label, "name": net.name(label), "probabilities": probabilities.tolist()}
