"""DRF serializer fields -> JSON Schema (2020-12, the dialect of OpenAPI 3.1).

Request schemas are derived from the serializers in inference/schemas.py, so the document
describes exactly what the validators accept: types, bounds, choices, nullability, defaults,
required fields. Custom fields declare their schema in CUSTOM (by class); a field this module
does not know raises, so a new field cannot silently be documented as "anything".
"""
from __future__ import annotations

from rest_framework import fields as drf
from rest_framework import serializers

from inference import schemas

_TEXT_PART = {"type": "object", "required": ["type", "text"],
              "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}

CUSTOM: dict[type, dict] = {
    schemas.StopField: {"oneOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "items": {"type": "string", "minLength": 1},
         "maxItems": schemas.MAX_STOP_SEQUENCES}]},
    schemas.ContentField: {"oneOf": [{"type": "string"},
                                     {"type": "array", "items": _TEXT_PART}]},
}
# (serializer class, field name) -> schema, where a field's own validate_<name> narrows it.
OVERRIDES: dict[tuple[type, str], dict] = {
    (schemas.CompletionsSerializer, "prompt"): {"oneOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "items": {"type": "string", "minLength": 1},
         "minItems": 1, "maxItems": 1}]},
    (schemas.CompletionsSerializer, "echo"): {"type": "boolean", "const": False, "default": False},
}


def _bounds(schema: dict, field, low: str, high: str) -> dict:
    if getattr(field, "min_value", None) is not None:
        schema[low] = field.min_value
    if getattr(field, "max_value", None) is not None:
        schema[high] = field.max_value
    return schema


def _base(field) -> dict:
    for cls, schema in CUSTOM.items():
        if isinstance(field, cls):
            return dict(schema)
    if isinstance(field, serializers.BaseSerializer):
        return serializer_schema(type(field) if not isinstance(field, serializers.ListSerializer)
                                 else type(field.child))
    if isinstance(field, drf.BooleanField):
        return {"type": "boolean"}
    if isinstance(field, drf.IntegerField):
        return _bounds({"type": "integer"}, field, "minimum", "maximum")
    if isinstance(field, drf.FloatField):
        return _bounds({"type": "number"}, field, "minimum", "maximum")
    if isinstance(field, drf.ChoiceField):
        return {"type": "string", "enum": list(field.choices)}
    if isinstance(field, drf.CharField):
        schema = {"type": "string"}
        if field.max_length is not None:
            schema["maxLength"] = field.max_length
        if not field.allow_blank:
            # DRF trims whitespace first: a non-blank value is one with a non-space character.
            schema["minLength"] = max(1, field.min_length or 0)
            schema["pattern"] = r"\S"
        return schema
    if isinstance(field, drf.ListField):
        schema = {"type": "array", "items": field_schema(field.child)}
        if field.min_length is not None:
            schema["minItems"] = field.min_length
        if field.max_length is not None:
            schema["maxItems"] = field.max_length
        return schema
    if isinstance(field, drf.JSONField):
        return {}
    raise TypeError(f"no JSON Schema for {type(field).__name__}: add it to CUSTOM")


def field_schema(field, override: dict | None = None) -> dict:
    schema = dict(override) if override is not None else _base(field)
    if getattr(field, "allow_null", False):
        if isinstance(schema.get("type"), str) and "oneOf" not in schema and "$ref" not in schema:
            schema["type"] = [schema["type"], "null"]
        else:
            schema = {"anyOf": [schema, {"type": "null"}]}
    default = getattr(field, "default", drf.empty)
    if default is not drf.empty and not callable(default):
        schema["default"] = default
    return schema


def serializer_schema(serializer_class: type) -> dict:
    properties, required = {}, []
    for name, field in serializer_class().fields.items():
        properties[name] = field_schema(field, OVERRIDES.get((serializer_class, name)))
        if field.required:
            required.append(name)
    schema = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema
