"""Secrets out of report pages: what a page shows passes through here first.

A secret is recognised by its name (:func:`dlhpc.repro.is_secret_name`:
TOKEN, SECRET, PASSWORD, KEY, CREDENTIAL, AUTH, any case) or by its place (the
user:password part of a URL). Contract:

* :func:`redact_value` (structured data: the resolved config, hyperparameters):
  the value of every key with a secret name is replaced whole by ``<redacted>``,
  and URL credentials in strings are cut;
* :func:`redact_text` (free text: the YAML as given, the diff and package list at
  launch, error tails, log messages): URL credentials are cut; ``NAME: value``,
  ``NAME=value``, ``"NAME": "value"`` and ``--name value`` / ``--name=value`` with a
  secret NAME lose the value; a YAML key with a secret name and a nested block
  loses every value of that block.

Names stay visible, so a reader sees that something was there.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from dlhpc.repro import REDACTED, is_secret_name

__all__ = ["REDACTED", "redact_text", "redact_value"]

_URL_CREDENTIALS = re.compile(r"(?<=://)[^/@\s'\"]+@")
_ASSIGN = re.compile(
    r"""(?P<key>(?P<q>["']?)(?P<name>[A-Za-z_][\w.-]*)(?P=q))(?P<sep>[ \t]*[:=][ \t]*)"""
    r"""(?P<val>"[^"\n]*"|'[^'\n]*'|[^\s,;}\]#"']+)"""
)
_FLAG = re.compile(r"(?P<flag>--?(?P<name>[A-Za-z][\w-]*))(?P<sep>[ \t]+|=)(?P<val>[^\s-]\S*)")
_BLOCK_KEY = re.compile(r"^(?P<indent>[ \t]*)(?:-[ \t]+)?(?P<name>[\w.-]+)[ \t]*:[ \t]*(?:#.*)?$")


def _quoted(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return f"{value[0]}{REDACTED}{value[0]}"
    return REDACTED


def _assignments(line: str) -> str:
    """Secret-named ``NAME: value`` / ``NAME=value`` lose the value; a harmless one is
    passed after its separator only, so that a value holding one is searched too
    (``description: "uses API_KEY=..."``, ``vars: {API_KEY: ...}``)."""
    out, pos = [], 0
    while (m := _ASSIGN.search(line, pos)) is not None:
        if is_secret_name(m["name"]):
            out.append(line[pos : m.start("val")] + _quoted(m["val"]))
            pos = m.end()
        else:
            out.append(line[pos : m.end("sep")])
            pos = m.end("sep")
    return "".join(out) + line[pos:]


def _line(line: str) -> str:
    line = _URL_CREDENTIALS.sub(f"{REDACTED}@", line)

    def flag(m: re.Match[str]) -> str:
        if not is_secret_name(m["name"]):
            return m.group(0)
        return f"{m['flag']}{m['sep']}{REDACTED}"

    return _FLAG.sub(flag, _assignments(line))


def redact_text(text: str) -> str:
    """``text`` with secrets replaced (see the module docstring)."""
    out: list[str] = []
    block: int | None = None  # indentation of a secret-named YAML key with a nested block
    for line in text.split("\n"):
        indent = len(line) - len(line.lstrip(" \t"))
        if block is not None and line.strip() and indent <= block:
            block = None
        if block is not None and line.strip():
            out.append(line[:indent] + REDACTED)
            continue
        m = _BLOCK_KEY.match(line)
        if m and is_secret_name(m["name"]):
            block = len(m["indent"])
        out.append(_line(line))
    return "\n".join(out)


def redact_value(value: Any) -> Any:
    """A copy of JSON-like ``value`` with secret-named keys' values and URL credentials
    replaced."""
    if isinstance(value, Mapping):
        return {
            k: REDACTED if is_secret_name(str(k)) else redact_value(v) for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact_value(v) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    return value
