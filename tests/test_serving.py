"""serve.py: the trained model behind HTTP (uvicorn, Starlette), asked by a real HTTP client (httpx) on a local port.

Inputs are sent as .npy arrays (``decode=npy``: the server of every project, the example's or not) of
the test set's inputs before normalisation; the example's own input, images, has a test of its own.
"""

import base64
import io
import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import httpx
import jsonschema
import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from mnistlab.runtime.checkpointing.checkpoint_io import load_checkpoint
from mnistlab.runtime.config import hydra_versions
from mnistlab.runtime.run.failures import InputError
from mnistlab.trained import exporting, inference, loading, model_card
from mnistlab.trained.exporting import export, sample_inputs
from mnistlab.trained.serving import arrays, http_api, openapi

import onnx_models
from composing import DATA_DIR, ROOT, TRUST_SUITE, TRUSTED
from running import serving

COUNT = 48  # test inputs classified by each server


def _raw_inputs(checkpoint: Path) -> tuple[list[bytes], list[int]]:
    """``COUNT`` test inputs as .npy bodies, before normalisation (what a client sends), and the labels the
    checkpoint's network gives them."""
    saved = load_checkpoint(checkpoint)
    inputs = sample_inputs(saved, DATA_DIR, COUNT, TRUSTED)
    with torch.inference_mode():
        expected = loading.network(saved, TRUSTED)(inputs).argmax(1).tolist()
    card = model_card.preprocessing(saved)
    raw = (inputs * card["std"] + card["mean"]) * card["scale"] if "mean" in card else inputs
    return [_npy(x) for x in raw.numpy()], expected


def _npy(array: np.ndarray) -> bytes:
    file = io.BytesIO()
    np.save(file, array)
    return file.getvalue()


def _post(url: str, body: bytes, content_type: str = "application/octet-stream") -> httpx.Response:
    return httpx.post(f"{url}/predict", content=body, headers={"Content-Type": content_type}, timeout=60)


def _batch(bodies: list[bytes]) -> bytes:
    return httpx.Request("POST", "/", json={"images": [base64.b64encode(b).decode() for b in bodies]}).content


def _classes(answers: list[httpx.Response]) -> list[int]:
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers if a.status_code != 200][:3]
    return [a.json()["class"] for a in answers]


@pytest.mark.slow
def test_the_server_classifies_as_the_checkpoint_one_by_one_in_a_batch_and_under_load(trained_checkpoint, tmp_path):
    bodies, expected = _raw_inputs(trained_checkpoint)
    with serving(
        tmp_path / "serve", f"ckpt_path={trained_checkpoint}", TRUST_SUITE, "decode=npy", "max_batch_size=8"
    ) as url:
        assert _classes([_post(url, b) for b in bodies]) == expected
        with ThreadPoolExecutor(16) as clients:  # 16 at once: the server batches them (max_batch_size=8)
            assert _classes(list(clients.map(lambda b: _post(url, b), bodies))) == expected
        batch = _post(url, _batch(bodies), "application/json").json()["predictions"]
        assert [p["class"] for p in batch] == expected
        probabilities = np.array([p["probabilities"] for p in batch])
        np.testing.assert_allclose(probabilities.sum(1), 1, atol=1e-5)
        info = httpx.get(f"{url}/info").json()
        assert info["server"]["devices"] == ["cpu"] * len(os.sched_getaffinity(0))  # devices=auto: a process a core
        names = info["model"]["classes"] or [str(c) for c in range(probabilities.shape[1])]  # unnamed: numbered
        assert len(names) == probabilities.shape[1]
        assert [p["name"] for p in batch] == [names[c] for c in expected]


BAD = [  # body, content type, status, the reason's words
    (b"", "application/octet-stream", 400, "the body is empty"),
    (b"not an array", "application/octet-stream", 400, "not a .npy array of numbers"),
    (b'{"images": [', "application/json", 400, "the body is not valid JSON"),
    (b'{"pictures": []}', "application/json", 400, 'the JSON must be {"input": <array>}, {"inputs": [<array>,'),
    (b'{"input": [[1, 2], [3]]}', "application/json", 400, "an input is not an array of numbers"),
    (b'{"input": [1, 2, 3]}', "application/json", 400, "an input of shape (3): the model takes ("),
    (b'{"images": ["%%%"]}', "application/json", 400, "not valid base64"),
    (b'{"images": [1, 2]}', "application/json", 400, '"images" must be a list of base64 strings'),
    (_batch([b"x"] * 9), "application/json", 400, "9 inputs in one request, over max_inputs=8"),
    (
        _npy(np.zeros((3, 5), np.float32)),
        "application/octet-stream",
        400,
        "an input of shape (3, 5): the model takes (",
    ),
    (_npy(np.array(["a"])), "application/octet-stream", 400, "not a .npy array of numbers"),
    (b"[" * 90_000 + b"]" * 90_000, "application/json", 400, "the JSON is nested too deep"),
    (b"x" * 300_000, "application/octet-stream", 413, "over max_body_bytes=200,000 bytes"),
]


@pytest.mark.slow
def test_each_bad_request_gets_its_reason_alone_and_the_server_goes_on(trained_checkpoint, tmp_path) -> None:
    bodies, expected = _raw_inputs(trained_checkpoint)
    overrides = ["decode=npy", "max_inputs=8", "max_body_bytes=200_000", "batch_timeout=0.2", "devices=1"]
    with serving(tmp_path / "serve", f"ckpt_path={trained_checkpoint}", TRUST_SUITE, *overrides) as url:
        for body, content_type, status, reason in BAD:
            answer = _post(url, body, content_type)
            assert (answer.status_code, reason in answer.json()["detail"]) == (status, True), answer.text
            assert "\n" not in answer.json()["detail"] and "Traceback" not in answer.text
        # Sent together to the one process, a bad and a good request are batched (batch_timeout 0.2 s): each
        # gets its own answer.
        with ThreadPoolExecutor(2) as clients:
            bad, good = clients.map(lambda b: _post(url, b), [b"not an array", bodies[0]])
        assert (bad.status_code, good.status_code, good.json()["class"]) == (400, 200, expected[0])
        assert httpx.get(f"{url}/health").text == "ok"
        assert _classes([_post(url, b) for b in bodies[:4]]) == expected[:4]


@pytest.mark.slow
def test_an_exported_onnx_model_is_served_with_its_cards_preprocessing(trained_checkpoint, tmp_path) -> None:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), **hydra_versions.BASE):
        cfg = compose(
            "export", [f"ckpt_path={trained_checkpoint}", "format=onnx", f"paths.output_dir={tmp_path}", TRUST_SUITE]
        )
    onnx = export(cfg)
    bodies, expected = _raw_inputs(trained_checkpoint)
    with serving(tmp_path / "serve", f"ckpt_path={onnx}", "decode=npy") as url:
        assert _classes([_post(url, b) for b in bodies]) == expected
        assert httpx.get(f"{url}/info").json()["model"]["classes"] == model_card.read(onnx)["classes"]


@pytest.mark.parametrize(
    "shape,card,message",
    [
        (["N", 4], None, "carries no model card (export.py writes one into the file)"),
        ([1, 4], onnx_models.CARD, "takes batches of exactly 1: export it with any batch size"),
    ],
    ids=["no card", "batch of 1"],
)
def test_an_onnx_model_that_would_be_run_wrong_is_refused_in_one_line(shape, card, message: str, tmp_path) -> None:
    """Without its card its inputs would go unnormalised (probabilities saturate); with a fixed batch every
    batched request would fail. Both refused as the model loads, before a server says it is healthy."""
    model = onnx_models.flattening(tmp_path / "model.onnx", shape, card)
    with pytest.raises(InputError, match=re.escape(f"{model} {message}")):
        inference.load(model)


def test_an_input_the_onnx_model_does_not_take_is_refused_naming_both_shapes(tmp_path) -> None:
    model = inference.load(onnx_models.flattening(tmp_path / "model.onnx", ["N", 3, "H", "W"]))
    assert model.probabilities(np.zeros((2, 3, 5, 7), np.float32)).shape == (2, 105)  # any H, W
    with pytest.raises(InputError, match=re.escape("an input of shape (1, 28, 28): the model takes (3, any, any)")):
        model.probabilities(np.zeros((2, 1, 28, 28), np.float32))
    answers = http_api.predict_each(model, lambda body: np.zeros((1, 28, 28), np.float32), [b"x"])  # the server's 400
    assert answers == ["an input of shape (1, 28, 28): the model takes (3, any, any)"]


def test_json_nested_deeper_than_the_parser_goes_is_refused_in_one_line() -> None:
    """[[[[...]]]] 200,000 deep: Python's parser runs out of stack (RecursionError): a 400, not a 500."""
    request = SimpleNamespace(headers={"content-type": "application/json"})
    with pytest.raises(http_api.Refused) as refused:
        http_api._items(b"[" * 200_000 + b"]" * 200_000, request, max_inputs=8)
    assert refused.value.status == 400 and str(refused.value).startswith("the JSON is nested too deep: ")


class Regression(torch.nn.Module):  # 4 numbers in, one value out per sample: no classes anywhere
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


def test_a_regression_answers_values_for_json_arrays_and_its_openapi_document_says_so(tmp_path) -> None:
    """A JSON array of the input's shape, one or a batch, for a model of values (an exported regression):
    its values come back, as the network computes them; the OpenAPI document is valid and describes what
    the server answers; a wrong shape names both shapes."""
    from openapi_spec_validator import validate
    from starlette.testclient import TestClient

    torch.manual_seed(0)
    net, inputs = Regression().eval(), torch.randn(5, 4)
    checkpoint = {"config": {"model": {"net": {"_target_": "tests.Regression"}}, "data": {}}}
    card = model_card.describe(checkpoint, net, None, inputs)
    exporting.WRITERS["onnx"](net, inputs, tmp_path / "model.onnx", card)
    model = inference.load(tmp_path / "model.onnx")
    cfg = OmegaConf.create({"max_batch_size": 8, "batch_timeout": 0.0, "max_inputs": 8, "max_body_bytes": 10_000,
                            "timeout": 30, "decode": {"_target_": "mnistlab.trained.serving.arrays.decode"}})  # fmt: skip
    api = http_api.app(model, lambda body: arrays.decode(body, 100), cfg, {"model": {}})
    with torch.inference_mode():
        expected = net(inputs)[:, 0].tolist()
    with TestClient(api) as client:  # the real ASGI app, over httpx
        one = client.post("/predict", json={"input": inputs[0].tolist()})
        batch = client.post("/predict", json={"inputs": inputs.tolist()})
        npy = client.post("/predict", content=_npy(inputs[1].numpy()))
        wrong = client.post("/predict", json={"input": [1.0, 2.0, 3.0]})
        document = client.get("/openapi.json").json()
    assert one.status_code == 200 and one.json()["values"] == pytest.approx([expected[0]], abs=1e-5)
    assert [p["values"][0] for p in batch.json()["predictions"]] == pytest.approx(expected, abs=1e-5)
    assert npy.json()["values"] == pytest.approx([expected[1]], abs=1e-5)
    assert (wrong.status_code, wrong.json()["detail"]) == (400, "an input of shape (3): the model takes (4)")
    validate(document)  # OpenAPI 3.1, as the specification's schema says
    post = document["paths"]["/predict"]["post"]
    schemas = {"components": document["components"]}
    answer = {**schemas, **post["responses"]["200"]["content"]["application/json"]["schema"]}
    jsonschema.validate(one.json(), answer)
    jsonschema.validate(batch.json(), answer)
    jsonschema.validate(wrong.json(), {**schemas, "$ref": "#/components/schemas/Refusal"})
    request = {**schemas, **post["requestBody"]["content"]["application/json"]["schema"]}
    jsonschema.validate({"inputs": inputs.tolist()}, request)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"pictures": []}, request)
    assert "of shape (4)" in json.dumps(request)


def test_a_classifiers_openapi_document_names_its_classes(tmp_path) -> None:
    model = inference.load(onnx_models.flattening(tmp_path / "model.onnx", ["N", 2]))
    cfg = OmegaConf.create({"max_inputs": 8, "max_body_bytes": 10, "timeout": 1, "decode": {"_target_": "x"}})
    document = openapi.document(model, cfg, {})
    answer = document["components"]["schemas"]["Answer"]
    assert answer["properties"]["name"]["enum"] == ["a", "b"] and answer["required"] == [
        "class",
        "name",
        "probabilities",
    ]
