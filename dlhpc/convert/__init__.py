"""Translate other tools' experiment configs into dlhpc experiment files.

Public API: :func:`convert_determined` (a Determined experiment config -> a
:class:`Conversion`: the dlhpc mapping, the notes on what was not translated, and
:meth:`Conversion.render`, the YAML text with those notes as a comment at its top).
Bad input raises :class:`~dlhpc.errors.ConfigError` (exit 2) with ``file:line: field``.
Login-node code: it may use :mod:`dlhpc.config`, never the jobs' side.
"""

from dlhpc.convert.determined import Conversion, convert_determined, map_issues

__all__ = ["Conversion", "convert_determined", "map_issues"]
