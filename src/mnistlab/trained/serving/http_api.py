"""The HTTP API of one server process (Starlette): ``POST /predict``, ``GET /health``, ``GET /info``, and
``GET /openapi.json``, the OpenAPI document that describes them for this model (``openapi``).

``POST /predict`` takes one input as the body (``conf/decode/``: a ``.npy`` array; the example's: a PNG or
JPEG image), or JSON: ``{"input": <array>}`` (nested lists of numbers of one input's shape, for any model)
or ``{"inputs": [<array>, ...]}`` for a batch, and ``{"image": <base64>}`` / ``{"images": [...]}`` for
bodies the decoder reads. It answers as the model card says: ``{"class", "name", "probabilities"}`` for
class scores, ``{"values": ...}`` (``{"outputs": {<name>: ...}}`` for several outputs) for values; a batch:
``{"predictions": [...]}``. Each input becomes the network's as ``predict.py`` prepares a file, on the
model's thread, batched with the inputs of other requests (``batching``).

A request is data from anyone: a bad one (empty, over ``max_body_bytes``, not JSON where it says JSON,
not an image, too many values or inputs, an input the network cannot take) gets HTTP 400 (413 for size)
with a one-line reason, alone: the inputs batched with it are answered as if it had not come.
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
from mnistlab.trained.inference import TrainedModel
from mnistlab.trained.serving import openapi
from mnistlab.trained.serving.batching import Batcher

USAGE = 'send one input as the body (conf/decode/), or JSON {"inputs": [<array>, ...]} or {"images": [<base64>, ...]}'
Item = bytes | np.ndarray  # a body for the decoder, or an input already an array (JSON)


class Refused(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


def app(net: TrainedModel, decode: Callable[[bytes], np.ndarray], cfg: Any, info: dict[str, Any]) -> Starlette:
    """The API around ``net``; ``cfg``: conf/serve.yaml's limits and batching; ``info``: what /info says."""
    batcher = Batcher(lambda items: predict_each(net, decode, items), cfg.max_batch_size, cfg.batch_timeout)
    document = openapi.document(net, cfg, info)

    async def predict(request: Request) -> Response:
        try:
            items, batch = _items(await _read(request, cfg.max_body_bytes), request, cfg.max_inputs)
            results = await asyncio.wait_for(batcher.submit(items), cfg.timeout)
        except Refused as err:
            return _refusal(err.status, str(err))
        except TimeoutError:
            return _refusal(504, f"no answer within timeout={cfg.timeout} s (a config value): the server is busy")
        if reasons := [r for r in results if isinstance(r, str)]:
            return _refusal(400, reasons[0])
        return JSONResponse({"predictions": results} if batch else results[0])

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        task = asyncio.get_running_loop().create_task(batcher.run())
        yield
        task.cancel()

    routes = [
        Route("/predict", predict, methods=["POST"]),
        Route("/health", lambda _: PlainTextResponse("ok")),  # answered once a process has its model
        Route("/info", lambda _: JSONResponse(info)),
        Route("/openapi.json", lambda _: JSONResponse(document)),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


def predict_each(
    net: TrainedModel, decode: Callable[[bytes], np.ndarray], items: list[Item]
) -> list[dict[str, Any] | str]:
    """Each item's answer, or why it is refused: bodies decoded, then one forward pass per input shape."""
    inputs: list[np.ndarray | str] = []
    for item in items:
        try:
            inputs.append(item if isinstance(item, np.ndarray) else decode(item))
        except InputError as err:
            inputs.append(str(err))
    results: list[dict[str, Any] | str] = [x if isinstance(x, str) else "" for x in inputs]
    for shape in {x.shape for x in inputs if isinstance(x, np.ndarray)}:
        chosen = [i for i, x in enumerate(inputs) if isinstance(x, np.ndarray) and x.shape == shape]
        answers: list[dict[str, Any] | str]
        try:
            answers = list(net.answers(np.stack([inputs[i] for i in chosen])))
        except InputError as err:  # a shape the model says it does not take
            answers = [str(err)] * len(chosen)
        except Exception as err:  # noqa: BLE001 -- torch and onnxruntime raise their own types for a bad shape
            answers = [f"the network cannot take an input of shape {_shape(shape)}: {err}"] * len(chosen)
        for i, answer in zip(chosen, answers, strict=True):
            results[i] = answer
    return results


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ")"


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


def _items(body: bytes, request: Request, max_inputs: int) -> tuple[list[Item], bool]:
    """The request's inputs, and whether it was a batch."""
    if not body:
        raise Refused(400, f"the body is empty: {USAGE}")
    if not request.headers.get("content-type", "").lower().startswith("application/json"):
        return [body], False
    try:
        sent = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise Refused(400, f"the body is not valid JSON ({err}): {USAGE}") from None
    except RecursionError:  # [[[[...]]]] nested deeper than the parser's stack
        raise Refused(400, f"the JSON is nested too deep: {USAGE}") from None
    keys = {"input", "inputs", "image", "images"} & (sent.keys() if isinstance(sent, dict) else set())
    if len(keys) != 1:
        raise Refused(400, 'the JSON must be {"input": <array>}, {"inputs": [<array>, ...]}, {"image": <base64>} or '
                      '{"images": [<base64>, ...]}')  # fmt: skip
    (key,) = keys
    given = sent[key] if key.endswith("s") else [sent[key]]
    if not isinstance(given, list) or not given:
        raise Refused(400, f'"{key}" must be a list, one item per input')
    if len(given) > max_inputs:
        raise Refused(400, f"{len(given)} inputs in one request, over max_inputs={max_inputs} (a config value)")
    items: list[Item] = [_array(g) for g in given] if key.startswith("input") else _decoded(given)
    return items, key.endswith("s")


def _array(given: Any) -> np.ndarray:
    """One input sent as nested lists of numbers, as float32 (numbers only: no strings, no ragged lists)."""
    try:
        array = np.asarray(given, dtype=np.float32)
    except (ValueError, TypeError):
        raise Refused(400, "an input is not an array of numbers (nested lists of one shape)") from None
    if array.ndim == 0:
        raise Refused(400, "an input is a single number: send it as a list, [x], of the model's input shape")
    return array


def _decoded(encoded: list[Any]) -> list[Item]:
    if not all(isinstance(e, str) for e in encoded):
        raise Refused(400, '"images" must be a list of base64 strings, one per image')
    try:
        return [base64.b64decode(e, validate=True) for e in encoded]
    except binascii.Error as err:
        raise Refused(400, f"an image is not valid base64: {err}") from None


def _refusal(status: int, reason: str) -> JSONResponse:
    return JSONResponse({"detail": " ".join(reason.split())}, status_code=status)
