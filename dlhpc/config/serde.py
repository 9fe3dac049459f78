"""JSON round trip of resolved configs (stored with the experiment).

``from_jsonable(ExperimentConfig, to_jsonable(cfg)) == cfg`` for every config
the loaders produce. Used so that a tick days later acts on the config as it
was resolved at launch, not on whatever the YAML file says by then.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

__all__ = ["from_jsonable", "to_jsonable"]

T = TypeVar("T")


def to_jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_jsonable(v) for v in obj]
    return obj


def _decode(tp: Any, value: Any) -> Any:
    origin = get_origin(tp)
    if tp is Any or value is None:
        return value
    if origin in (Union, types.UnionType):
        options = [a for a in get_args(tp) if a is not type(None)]
        return _decode(options[0], value) if len(options) == 1 else value
    if origin is typing.Literal:
        return value
    if tp is Path:
        return Path(value)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return from_jsonable(tp, value)
    if origin is tuple:
        args = get_args(tp)
        item = args[0] if args else Any
        return tuple(_decode(item, v) for v in value)
    if origin is dict:
        _, vt = get_args(tp) or (str, Any)
        return {k: _decode(vt, v) for k, v in value.items()}
    if origin is list:
        (item,) = get_args(tp) or (Any,)
        return [_decode(item, v) for v in value]
    return value


def from_jsonable(cls: type[T], data: dict[str, Any]) -> T:
    hints = get_type_hints(cls)
    kwargs = {
        f.name: _decode(hints[f.name], data[f.name])
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if f.name in data
    }
    return cls(**kwargs)
