"""Path expansion: ``~``, ``~user``, ``${VAR}``, ``${VAR:-default}``, ``$VAR``.

Contract of :func:`expand_path`: a leading ``~`` or ``~user`` is expanded
first (``~`` from ``$HOME`` of the given environment), then variables from
that environment; an undefined variable (without ``:-default``), an unknown
user, an unterminated ``${`` or a NUL raises :class:`ValueError`. A ``$`` not
followed by a name or ``{`` is kept as is. The result is made absolute
against ``base`` and normalised lexically (symlinks are not resolved, the
file system is not touched).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

__all__ = ["absolute", "expand_path", "expand_vars", "home"]

_VAR = re.compile(r"\$(?:\{(?P<braced>[^}]*)\}|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<open>\{))")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def home(environ: Mapping[str, str]) -> str:
    """The home folder: ``$HOME`` of ``environ``, else the user database's."""
    value = environ.get("HOME")
    if value:
        return value
    fallback = os.path.expanduser("~")
    if fallback == "~":
        raise ValueError("cannot expand '~': $HOME is not set")
    return fallback


def expand_vars(text: str, environ: Mapping[str, str]) -> str:
    """``text`` with ``${VAR}``, ``${VAR:-default}`` and ``$VAR`` replaced."""

    def sub(match: re.Match[str]) -> str:
        if match.group("open") is not None:
            raise ValueError(f"unterminated '${{' in {text!r}")
        braced = match.group("braced")
        name, default = (match.group("name"), None) if braced is None else _split(braced, text)
        value = environ.get(name)
        if value is None or (default is not None and value == ""):
            if default is None:
                raise ValueError(f"undefined environment variable ${name}")
            return default
        return value

    return _VAR.sub(sub, text)


def _split(braced: str, text: str) -> tuple[str, str | None]:
    name, sep, default = braced.partition(":-")
    if not _NAME.fullmatch(name):
        raise ValueError(f"bad variable reference '${{{braced}}}' in {text!r}")
    return name, (default if sep else None)


def _expand_user(text: str, environ: Mapping[str, str]) -> str:
    if not text.startswith("~"):
        return text
    head, sep, rest = text.partition("/")
    if head == "~":
        return home(environ) + sep + rest
    expanded = os.path.expanduser(head)
    if expanded == head:
        raise ValueError(f"unknown user in {head!r}")
    return expanded + sep + rest


def absolute(path: Path | str, base: Path) -> Path:
    """``path`` made absolute against ``base`` and normalised (no symlink resolution)."""
    return Path(os.path.normpath(os.path.join(base, path)))


def expand_path(text: str, base: Path, environ: Mapping[str, str]) -> Path:
    """Expand ``~`` and variables in ``text``, then make it absolute against ``base``."""
    if "\0" in text:
        raise ValueError("must not contain a NUL character")
    if not text.strip():
        raise ValueError("must be a non-empty path")
    expanded = expand_vars(_expand_user(text, environ), environ)
    if not expanded:
        raise ValueError(f"is empty after expanding {text!r}")
    return absolute(expanded, base)
