"""YAML loading that keeps the line of every key.

:func:`read_yaml_file` turns a file into a :class:`Document`: plain,
JSON-compatible data (``dict`` with ``str`` keys, ``list``, ``str``, ``int``,
``float``, ``bool``, ``None``) plus the 1-based line of every key path, e.g.
``("searcher", "divisor")`` or ``("resources", "sbatch_args", 2)``.

Rules on top of PyYAML's safe loader, so that what a user wrote is kept:

* mapping keys are always the key's text (``on:`` is ``"on"``, ``1:`` is ``"1"``);
  a duplicate key is an error, ``<<`` merges work;
* sexagesimal numbers (``01:00:00``, a YAML 1.1 int) and timestamps stay text;
* any other tag (``!!binary``, ``!!set``, ``!custom``...) is an error.

Every problem (unreadable file, bad UTF-8, syntax error, empty document,
recursive alias, alias bomb, deep nesting, ...) raises
:class:`~dlhpc.errors.ConfigError` naming the file (as given) and the line
where known; nothing else escapes.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from dlhpc.errors import ConfigError, ConfigIssue

__all__ = ["Document", "KeyPath", "parse_yaml_text", "read_text", "read_yaml_file"]

KeyPath = tuple[str | int, ...]

MAX_BYTES = 4 * 1024 * 1024
MAX_NODES = 100_000  # counted with aliases expanded: stops "billion laughs"
MAX_DEPTH = 64

_P = "tag:yaml.org,2002:"
_PLAIN_TAGS = {_P + "str", _P + "int", _P + "float", _P + "bool", _P + "null"}


@dataclass(frozen=True)
class Document:
    """A parsed YAML file: its data and the line of every key path."""

    data: Any
    lines: dict[KeyPath, int]


class _Fail(Exception):
    def __init__(self, line: int | None, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


def _fail(label: str, line: int | None, message: str) -> ConfigError:
    return ConfigError([ConfigIssue(label, line, "", message)])


def read_yaml_file(path: Path, label: str, *, require_mapping: bool = True) -> Document:
    """Read and parse ``path``; ``label`` is the name errors use (the path as given)."""
    return parse_yaml_text(read_text(path, label), label, require_mapping=require_mapping)


def read_text(path: Path, label: str) -> str:
    """The UTF-8 text of a regular file of at most 4 MiB, else ConfigError."""
    try:
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            raise _fail(label, None, "is a directory, not a YAML file")
        if not stat.S_ISREG(st.st_mode):
            raise _fail(label, None, "is not a regular file")
        with open(path, "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise _fail(label, None, "file not found") from None
    except PermissionError:
        raise _fail(label, None, "permission denied") from None
    except (OSError, ValueError) as exc:  # ValueError: NUL in the path
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise _fail(label, None, f"cannot read file: {reason}") from None
    if len(raw) > MAX_BYTES:
        raise _fail(label, None, f"file is larger than {MAX_BYTES // (1024 * 1024)} MiB")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise _fail(
            label, line, f"not UTF-8 text (byte 0x{raw[exc.start]:02x}); is it a binary file?"
        ) from None
    return text


def parse_yaml_text(text: str, label: str, *, require_mapping: bool = True) -> Document:
    """Parse one YAML document; see the module docstring for the rules."""
    loader: _Loader | None = None
    try:
        loader = _Loader(text)  # checks for unprintable characters already
        node = loader.get_single_node()
        if node is None:
            raise _Fail(None, "file is empty (expected a mapping of settings)")
        if require_mapping and not isinstance(node, MappingNode):
            kind = "a list" if isinstance(node, SequenceNode) else "a single value"
            raise _Fail(
                node.start_mark.line + 1,
                f"top level must be a mapping of 'key: value' settings, got {kind}",
            )
        builder = _Builder(loader)
        data = builder.build(node, (), 0)
        return Document(data, builder.lines)
    except _Fail as exc:
        raise _fail(label, exc.line, exc.message) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        parts = [p for p in (exc.context, exc.problem) if p]
        message = "invalid YAML: " + ", ".join(parts) if parts else "invalid YAML"
        raise _fail(label, mark.line + 1 if mark else None, message) from None
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        char = chr(exc.character) if isinstance(exc.character, int) else exc.character
        raise _fail(label, line, f"invalid YAML: unprintable character {char!r}") from None
    except yaml.YAMLError as exc:
        raise _fail(label, None, f"invalid YAML: {exc}") from None
    except RecursionError:
        raise _fail(label, None, "invalid YAML: nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()


class _Loader(yaml.SafeLoader):
    """The safe loader, refusing deep nesting while composing (before recursion hurts)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise _Fail(mark.line + 1, f"nested deeper than {MAX_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


class _Builder:
    """Turns a composed node tree into plain data, recording key lines."""

    def __init__(self, loader: _Loader) -> None:
        self.loader = loader
        self.lines: dict[KeyPath, int] = {}
        self.count = 0
        self.active: set[int] = set()  # nodes being built: a repeat means a recursive alias

    def _visit(self, node: Node, depth: int) -> int:
        line: int = node.start_mark.line + 1
        self.count += 1
        if self.count > MAX_NODES:
            raise _Fail(line, f"document too large (over {MAX_NODES} values with aliases expanded)")
        if depth > MAX_DEPTH:
            raise _Fail(line, f"nested deeper than {MAX_DEPTH} levels")
        return line

    def build(self, node: Node, path: KeyPath, depth: int) -> Any:
        line = self._visit(node, depth)
        if isinstance(node, ScalarNode):
            return self._scalar(node, line)
        if id(node) in self.active:
            raise _Fail(line, "recursive alias (a value that contains itself)")
        self.active.add(id(node))
        try:
            if isinstance(node, SequenceNode):
                self._check_tag(node, "seq", line)
                out: list[Any] = []
                for i, item in enumerate(node.value):
                    here: KeyPath = (*path, i)
                    self.lines[here] = item.start_mark.line + 1
                    out.append(self.build(item, here, depth + 1))
                return out
            if isinstance(node, MappingNode):
                self._check_tag(node, "map", line)
                result: dict[str, Any] = {}
                for key, knode, vnode in self._pairs(node, depth):
                    here = (*path, key)
                    self.lines[here] = knode.start_mark.line + 1
                    result[key] = self.build(vnode, here, depth + 1)
                return result
            raise _Fail(line, f"unsupported YAML node {type(node).__name__}")
        finally:
            self.active.discard(id(node))

    @staticmethod
    def _check_tag(node: Node, kind: str, line: int) -> None:
        if node.tag != _P + kind:
            raise _Fail(line, f"unsupported YAML tag {node.tag}")

    def _pairs(self, node: MappingNode, depth: int) -> list[tuple[str, Node, Node]]:
        """Key text, key node, value node; explicit keys win over ``<<`` merges."""
        explicit: dict[str, tuple[Node, Node]] = {}
        merged: list[tuple[str, Node, Node]] = []
        for knode, vnode in node.value:
            kline = knode.start_mark.line + 1
            if knode.tag == _P + "merge":
                sources = vnode.value if isinstance(vnode, SequenceNode) else [vnode]
                for src in sources:
                    self._visit(src, depth + 1)
                    if not isinstance(src, MappingNode):
                        raise _Fail(kline, "'<<' (merge) needs a mapping or a list of mappings")
                    if id(src) in self.active:
                        raise _Fail(kline, "recursive alias (a value that contains itself)")
                    self.active.add(id(src))
                    try:
                        merged.extend(self._pairs(src, depth + 1))
                    finally:
                        self.active.discard(id(src))
                continue
            if not isinstance(knode, ScalarNode):
                raise _Fail(kline, "mapping keys must be plain text, not a list or mapping")
            key = str(knode.value)
            if key in explicit:
                first = explicit[key][0].start_mark.line + 1
                shown = key if len(key) <= 40 else key[:40] + "..."
                raise _Fail(kline, f"duplicate key {shown!r} (first at line {first})")
            explicit[key] = (knode, vnode)
        pairs = [(k, kn, vn) for k, (kn, vn) in explicit.items()]
        for key, knode, vnode in merged:
            if key not in explicit:
                explicit[key] = (knode, vnode)
                pairs.append((key, knode, vnode))
        return pairs

    def _scalar(self, node: ScalarNode, line: int) -> Any:
        tag, text = node.tag, node.value
        if tag == _P + "str":
            return text
        if tag == _P + "timestamp" or (tag in (_P + "int", _P + "float") and ":" in text):
            return text  # dates and YAML 1.1 sexagesimal numbers (01:00:00) stay as written
        if tag not in _PLAIN_TAGS:
            raise _Fail(line, f"unsupported YAML tag {tag}")
        try:
            return self.loader.construct_object(node)
        except (yaml.YAMLError, ValueError, OverflowError, TypeError):
            kind = tag[len(_P) :]
            shown = text if len(text) <= 40 else text[:40] + "..."
            raise _Fail(line, f"invalid {kind} value {shown!r}") from None
