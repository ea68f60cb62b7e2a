"""The trained model behind HTTP: ``serve(cfg)`` behind ``serve.py``, on LitServe (Lightning's serving
library: FastAPI and uvicorn, a worker process per device, dynamic batching, ``/health``).

``POST /predict`` takes one input as the body (a PNG or JPEG image; ``decode=npy``: a ``.npy`` array) or
a JSON batch ``{"images": [<base64>, ...]}`` (``{"image": <base64>}`` for one), and answers
``{"class", "name", "probabilities"}`` (a batch: ``{"predictions": [...]}``). Each body becomes the
network's input as ``predict.py`` prepares a file (``conf/decode/``). Requests arriving together are
classified in one forward pass (``max_batch_size``, ``batch_timeout``).

A request is data from anyone: a bad one (empty, not JSON where it says JSON, not an image, too many
pixels or images, an input the network cannot take) gets HTTP 400 with a one-line reason, alone: the
requests batched with it are answered as if it had not come, and the server goes on.
"""

import base64
import binascii
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import litserve
import numpy as np
from hydra.utils import instantiate
from omegaconf import DictConfig
from starlette.responses import JSONResponse

from mnistlab.runtime.checks import InputError
from mnistlab.trained import classifier
from mnistlab.trained.request_bodies import RequestBodies

log = logging.getLogger(__name__)


@dataclass
class Item:
    """One request, decoded: its inputs (n, ...) and whether it was a batch; or why it is refused."""

    inputs: np.ndarray | None = None
    batch: bool = False
    refused: str | None = None


class ClassifierAPI(litserve.LitAPI):
    def __init__(self, model: str, data_dir: str, decode: Callable[[bytes], np.ndarray], max_images: int, **kw):
        super().__init__(**kw)  # max_batch_size, batch_timeout
        self.model, self.data_dir, self.decode, self.max_images = model, data_dir, decode, max_images

    def setup(self, device: str) -> None:
        self.classifier = classifier.load(self.model, device.partition(":")[0], self.data_dir)

    def decode_request(self, request):  # the body as JSON: RequestBodies wraps a raw body as {"image": ...}
        try:
            bodies, batch = _bodies(request, self.max_images)
            return Item(np.stack([self.decode(body) for body in bodies]), batch)
        except InputError as err:
            return Item(refused=str(err))
        except ValueError as err:  # np.stack: inputs of different shapes
            return Item(refused=f"the images of a batch must give inputs of one shape ({err})")

    def batch(self, items: list[Item]) -> list[Item]:
        return items  # predict concatenates their inputs: a request may hold several

    def predict(self, items: Item | list[Item]) -> Item | list[Item]:
        """The probabilities of every input of ``items`` (batched or one), by input shape in one pass each."""
        together = items if isinstance(items, list) else [items]
        for shape in {item.inputs.shape[1:] for item in together if item.inputs is not None}:
            self._classify([item for item in together if item.inputs is not None and item.inputs.shape[1:] == shape])
        return items

    def _classify(self, group: list[Item]) -> None:
        """Replace the inputs of ``group`` (all of one shape) by their probabilities, or refuse them all."""
        inputs = [item.inputs for item in group if item.inputs is not None]
        try:
            probabilities = self.classifier.probabilities(np.concatenate(inputs))
        except Exception as err:  # noqa: BLE001 -- torch and onnxruntime raise their own types for a bad shape
            for item in group:
                item.inputs, item.refused = (
                    None,
                    f"the network cannot take an input of shape {inputs[0].shape[1:]}: {err}",
                )
            return
        for item, part in zip(group, np.split(probabilities, np.cumsum([len(x) for x in inputs])[:-1]), strict=True):
            item.inputs = part  # now the answer

    def unbatch(self, items: list[Item]) -> list[Item]:
        return items

    def encode_response(self, item: Item) -> JSONResponse:
        if item.refused is not None:
            return JSONResponse({"detail": " ".join(item.refused.split())}, status_code=400)
        assert item.inputs is not None  # predict answered or refused every item
        answers = [self._answer(p) for p in item.inputs]
        return JSONResponse({"predictions": answers} if item.batch else answers[0])

    def _answer(self, probabilities: np.ndarray) -> dict[str, Any]:
        label = int(probabilities.argmax())
        return {"class": label, "name": self.classifier.name(label), "probabilities": probabilities.tolist()}


def _bodies(request: Any, max_images: int) -> tuple[list[bytes], bool]:
    """The raw inputs of a request: ``{"image": <base64>}`` or ``{"images": [<base64>, ...]}``."""
    if not isinstance(request, dict) or not ({"image", "images"} & request.keys()):
        raise InputError('the JSON must be {"image": <base64>} or {"images": [<base64>, ...]}')
    batch = "images" in request
    encoded = request["images"] if batch else [request["image"]]
    if not isinstance(encoded, list) or not all(isinstance(e, str) for e in encoded) or not encoded:
        raise InputError('"images" must be a list of base64 strings, one per image')
    if len(encoded) > max_images:
        raise InputError(f"{len(encoded)} images in one request, over max_images={max_images} (a config value)")
    try:
        return [base64.b64decode(e, validate=True) for e in encoded], batch
    except binascii.Error as err:
        raise InputError(f"an image is not valid base64: {err}") from None


def serve(cfg: DictConfig) -> None:
    decode = instantiate(cfg.decode)
    probe = classifier.load(cfg.ckpt_path, "cpu", cfg.paths.data_dir)  # a bad file fails here, in one line
    api = ClassifierAPI(
        str(cfg.ckpt_path), cfg.paths.data_dir, decode, cfg.max_images,
        max_batch_size=cfg.max_batch_size, batch_timeout=cfg.batch_timeout,
    )  # fmt: skip
    server = litserve.LitServer(
        api,
        accelerator=cfg.accelerator,
        devices=cfg.devices,
        workers_per_device=cfg.workers_per_device,
        timeout=cfg.timeout,
        model_metadata={"classes": probe.classes, "model": str(cfg.ckpt_path)},
        middlewares=[(RequestBodies, {"path": api.api_path, "max_bytes": cfg.max_body_bytes})],
    )
    log.info("Serving %s on http://%s:%d/predict (health: /health)", cfg.ckpt_path, cfg.host, cfg.port)
    server.run(host=cfg.host, port=cfg.port, num_api_servers=cfg.api_servers, generate_client_file=False)
