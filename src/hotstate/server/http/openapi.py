"""OpenAPI for routes that read their own body (for speed, or for ksqlDB-shaped errors) instead of
letting FastAPI validate it: the model is declared for the schema only."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


def documented_body(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` declaring `model` as the route's required JSON body."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": model.model_json_schema()}},
        }
    }
