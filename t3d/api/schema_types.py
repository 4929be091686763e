"""Building blocks of the API's JSON Schema (draft-07), used by `t3d.api.schema`. No I/O.

- Small constructors (`string`, `integer`, `enum`, `nullable`, `ref`, `array`, `obj`) and
  `Field` (a property, required or not), so the table in schema.py reads like the README.
- `entity_schema`: an attrs class of the domain as an object schema, field by field from its
  type hints, so a field added to an entity shows up without an edit anywhere else.
- `closure`: the definitions a schema refers to, for one-file-per-type output.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from typing import Any, Literal

import attrs

Schema = dict[str, Any]

DRAFT = "http://json-schema.org/draft-07/schema#"


@attrs.frozen
class Field:
    schema: Schema
    required: bool = True


def req(schema: Schema, description: str | None = None) -> Field:
    return Field(described(schema, description), True)


def opt(schema: Schema, description: str | None = None) -> Field:
    return Field(described(schema, description), False)


def described(schema: Schema, description: str | None) -> Schema:
    return schema if description is None else {**schema, "description": description}


def string(max_len: int | None = None) -> Schema:
    return {"type": "string"} if max_len is None else {"type": "string", "maxLength": max_len}


def integer(low: int | None = None, high: int | None = None) -> Schema:
    schema: Schema = {"type": "integer"}
    if low is not None:
        schema["minimum"] = low
    if high is not None:
        schema["maximum"] = high
    return schema


def boolean() -> Schema:
    return {"type": "boolean"}


def number() -> Schema:
    return {"type": "number"}


def enum(values: typing.Iterable[str]) -> Schema:
    return {"type": "string", "enum": list(values)}


def const(value: Any) -> Schema:
    return {"const": value}


def nullable(schema: Schema) -> Schema:
    """``schema`` or null."""
    kind = schema.get("type")
    if isinstance(kind, str) and set(schema) <= {"type", "maxLength", "minimum", "maximum", "description"}:
        return {**schema, "type": [kind, "null"]}
    return {"anyOf": [schema, {"type": "null"}]}


def ref(name: str) -> Schema:
    return {"$ref": f"#/definitions/{name}"}


def array(items: Schema, max_items: int | None = None, *, min_items: int = 0) -> Schema:
    schema: Schema = {"type": "array", "items": items}
    if min_items:
        schema["minItems"] = min_items
    if max_items is not None:
        schema["maxItems"] = max_items
    return schema


def obj(fields: Mapping[str, Field], *, title: str | None = None, description: str | None = None, closed: bool = True) -> Schema:
    """An object with ``fields`` (in order); ``closed``: no other property is allowed."""
    schema: Schema = {"type": "object", "properties": {name: f.schema for name, f in fields.items()}}
    required = [name for name, f in fields.items() if f.required]
    if required:
        schema["required"] = required
    if closed:
        schema["additionalProperties"] = False
    if title is not None:
        schema["title"] = title
    return described(schema, description)


ANY_OBJECT: Schema = {"type": "object"}


def type_schema(hint: Any) -> Schema:
    """The JSON Schema of a field's type hint (str, int, float, bool, Literal, dict, list, X | None)."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        inner = type_schema(rest[0]) if len(rest) == 1 else {"anyOf": [type_schema(a) for a in rest]}
        return nullable(inner) if len(rest) < len(args) else inner
    if origin is Literal:
        return enum(args)
    if origin is dict or hint is dict:
        return dict(ANY_OBJECT)
    if origin is list:
        return array(type_schema(args[0]) if args else {})
    simple = {str: string(), int: integer(), float: number(), bool: boolean()}
    if hint in simple:
        return simple[hint]
    if hint is Any:
        return {}
    raise TypeError(f"no JSON Schema for the type hint {hint!r}; add it to type_schema")


def entity_schema(cls: type, *, extra: Mapping[str, Field] = {}, description: str | None = None) -> Schema:
    """``cls`` (a frozen attrs entity) as stored and sent: every field, required unless it has
    a default. Objects and lists may be null on the wire (a large entity's largest containers
    are replaced by null and listed in ``truncated``), and ``truncated`` may be added."""
    hints = typing.get_type_hints(cls)
    fields: dict[str, Field] = {}
    for field in attrs.fields(cls):
        schema = type_schema(hints[field.name])
        if schema.get("type") in ("object", "array"):
            schema = nullable(schema)
        fields[field.name] = Field(schema, field.default is attrs.NOTHING)
    fields.update(extra)
    fields["truncated"] = opt(
        array(obj({"path": req(array({"type": ["string", "integer"]})), "bytes": req(integer(0))})),
        "fields cut or replaced on the wire (item.detail returns them whole)",
    )
    return obj(fields, title=cls.__name__, description=description)


def closure(name: str, definitions: Mapping[str, Schema]) -> dict[str, Schema]:
    """``name`` and every definition it refers to, transitively."""
    found: dict[str, Schema] = {}
    todo = [name]
    while todo:
        current = todo.pop()
        if current in found:
            continue
        found[current] = definitions[current]
        todo.extend(_refs(definitions[current]))
    return found


def _refs(value: Any) -> list[str]:
    if isinstance(value, dict):
        out = []
        for key, inner in value.items():
            if key == "$ref" and isinstance(inner, str) and inner.startswith("#/definitions/"):
                out.append(inner.removeprefix("#/definitions/"))
            else:
                out.extend(_refs(inner))
        return out
    if isinstance(value, list):
        return [name for inner in value for name in _refs(inner)]
    return []
