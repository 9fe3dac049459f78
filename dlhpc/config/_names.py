"""Experiment names: free-form text for people, and the slug derived from it.

``name`` is any printable text of 1 to :data:`MAX_NAME_LENGTH` characters
(spaces and any script allowed; no control, format or separator characters
other than the space, i.e. :meth:`str.isprintable`). It is shown on pages and in
tables (escaped there) and never written into a shell command.

:func:`name_slug` derives from it a name made of ``[a-z0-9-]`` only, at most
:data:`MAX_SLUG_LENGTH` characters, starting with a letter or digit: safe in a
file name, a job name and a shell word. It is deterministic, and a name that is
already a valid slug is its own slug, so names of the earlier schema
(``[A-Za-z0-9_.-]``, 64 characters) written in lower case without ``_`` and ``.``
map to themselves. Any other name gets a readable part (accents dropped, runs
of other characters as one ``-``) and ``-`` plus 8 hex digits of the name's
SHA-256, so that names differing only in case or punctuation get different slugs.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from typing import Any

from dlhpc.config._validate import Invalid, describe

__all__ = ["MAX_NAME_LENGTH", "MAX_SLUG_LENGTH", "experiment_name", "name_slug"]

MAX_NAME_LENGTH = 128
MAX_SLUG_LENGTH = 64
_SLUG = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
_OTHER = re.compile(r"[^a-z0-9]+")
_HASH_DIGITS = 8


def experiment_name(value: Any) -> str:
    """The ``name`` field's check (see the module doc); Invalid says what is wrong."""
    if not isinstance(value, str):
        raise Invalid(f"must be text (put it in quotes), got {describe(value)}")
    if not value.strip():
        raise Invalid("must not be empty")
    if len(value) > MAX_NAME_LENGTH:
        raise Invalid(f"must be at most {MAX_NAME_LENGTH} characters, got {len(value)}")
    bad = next((c for c in value if not c.isprintable()), None)
    if bad is not None:
        raise Invalid(
            f"must be printable text (no control characters), got {bad!r} "
            f"(U+{ord(bad):04X}) in {describe(value)}"
        )
    return value


def name_slug(name: str) -> str:
    """``name`` as ``[a-z0-9-]`` text of at most 64 characters (see the module doc)."""
    if _SLUG.fullmatch(name):
        return name
    folded = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode("ascii")
    readable = _OTHER.sub("-", folded.lower()).strip("-")
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:_HASH_DIGITS]
    readable = readable[: MAX_SLUG_LENGTH - _HASH_DIGITS - 1].rstrip("-")
    return f"{readable}-{digest}" if readable else digest
