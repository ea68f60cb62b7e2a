"""The OpenAPI 3.1 document of one server: its routes, and for ``POST /predict`` the inputs this model
takes and the answers it gives, read from its model card (the input's shape where the model says it;
class probabilities or values). Served at ``GET /openapi.json``: a client generator, Swagger UI or a
gateway reads it (``tests/test_serving.py`` checks it with openapi-spec-validator and a real client).
"""

from typing import Any

from mnistlab.runtime.reporting import provenance
from mnistlab.trained import model_card
from mnistlab.trained.inference import TrainedModel

NUMBERS = {"type": "array", "description": "nested lists of numbers: one input, of the shape the model takes"}
REFUSAL = {
    "type": "object",
    "required": ["detail"],
    "properties": {"detail": {"type": "string", "description": "why, in one line"}},
}


def document(model: TrainedModel, cfg: Any, info: dict[str, Any]) -> dict[str, Any]:
    """The document for ``model`` served with ``cfg`` (conf/serve.yaml: its limits); ``info``: /info's."""
    answer = _answer(model)
    return {
        "openapi": "3.1.0",
        "info": {"title": f"{provenance.PACKAGE} model server", "version": provenance.version()},
        "paths": {
            "/predict": {"post": _predict(model, cfg, answer)},
            "/health": {"get": _plain("ok once the process has its model", "Whether the server is ready")},
            "/info": {"get": _json({"type": "object"}, "The model and the server's settings")},
            "/openapi.json": {"get": _json({"type": "object"}, "This document")},
        },
        "components": {"schemas": {"Answer": answer, "Refusal": REFUSAL}},
    }


def _predict(model: TrainedModel, cfg: Any, answer: dict[str, Any]) -> dict[str, Any]:
    batch = {"type": "array", "minItems": 1, "maxItems": cfg.max_inputs}
    shape = model.input_shape
    shown = f" of shape ({', '.join(str(d) if isinstance(d, int) else 'any' for d in shape)})" if shape else ""
    one = {**NUMBERS, "description": f"one input{shown}, before normalisation: nested lists of numbers"}
    body = {
        "oneOf": [
            _object("input", one),
            _object("inputs", {**batch, "items": one}),
            _object("image", {"type": "string", "contentEncoding": "base64"}),
            _object("images", {**batch, "items": {"type": "string", "contentEncoding": "base64"}}),
        ]
    }
    refused = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Refusal"}}}}
    one_or_batch = {
        "oneOf": [
            {"$ref": "#/components/schemas/Answer"},
            _object("predictions", {"type": "array", "items": {"$ref": "#/components/schemas/Answer"}}),
        ]
    }
    return {
        "summary": "Answer one input or a batch, as the model card says",
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": body},
                "application/octet-stream": {
                    "schema": {
                        "type": "string",
                        "format": "binary",
                        "description": f"one input as the server's decoder reads it ({cfg.decode._target_})",
                    }
                },
            },
        },
        "responses": {
            "200": {"description": "The answer (a batch: one per input)", "content": _schema(one_or_batch)},
            "400": {"description": "A bad input, in one line", **refused},
            "413": {"description": f"A body over max_body_bytes={cfg.max_body_bytes}", **refused},
            "504": {"description": f"No answer within timeout={cfg.timeout} s", **refused},
        },
    }


def _answer(model: TrainedModel) -> dict[str, Any]:
    """One input's answer: class, name and probabilities for class scores; values (by output) otherwise."""
    if model.card.get("task", model_card.CLASSIFICATION) == model_card.CLASSIFICATION:
        return {
            "type": "object",
            "required": ["class", "name", "probabilities"],
            "properties": {
                "class": {"type": "integer", "minimum": 0},
                "name": {"type": "string", "enum": model.classes} if model.classes else {"type": "string"},
                "probabilities": {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 1}},
            },
        }
    values = {"description": "numbers, as the network computes them: a number, or nested lists of them"}
    names = [output["name"] for output in model.card.get("outputs", [])]
    if len(names) > 1:
        outputs = {"type": "object", "required": names, "properties": dict.fromkeys(names, values)}
        return _object("outputs", outputs)
    if names:
        return _object("values", values)
    # A checkpoint's card names no outputs (they are known once the network runs): one, or several by name.
    return {
        "oneOf": [_object("values", values), _object("outputs", {"type": "object", "additionalProperties": values})]
    }


def _object(key: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": [key], "properties": {key: schema}, "additionalProperties": False}


def _schema(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _json(schema: dict[str, Any], summary: str) -> dict[str, Any]:
    return {"summary": summary, "responses": {"200": {"description": summary, "content": _schema(schema)}}}


def _plain(text: str, summary: str) -> dict[str, Any]:
    content = {"text/plain": {"schema": {"type": "string", "description": text}}}
    return {"summary": summary, "responses": {"200": {"description": summary, "content": content}}}
