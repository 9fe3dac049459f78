"""``dlhpc convert determined``: a Determined experiment config -> a dlhpc experiment.

Translated: ``name``, ``description``, ``entrypoint`` (behind the launcher that makes
the stand-in ``determined`` package importable; a string through ``sh -c``, as in
Determined; Determined's launch layers ``torch_distributed`` and ``deepspeed`` kept),
``hyperparameters`` (const, int, double, log with its base, categorical,
nested ones as ``outer.inner`` names that the stand-in nests again), ``searcher``
(single, random, grid, adaptive_asha and async_halving as dlhpc's ``asha``: metric,
smaller_is_better, max_trials, max_concurrent_trials, max_length with its unit or
Determined 0.38's max_time and time_metric, divisor, max_rungs / num_rungs, stop_once),
``resources.slots_per_trial`` (one task per node, as Determined runs the entrypoint once
per container; the slots per node in ``DLHPC_DETERMINED_SLOTS_PER_NODE``),
``max_restarts``, ``checkpoint_storage`` (keep settings,
a shared_fs folder), ``environment.environment_variables``, ``data`` (as
``info.user_data``) and ``reproducibility.experiment_seed``.

Everything else is listed in :attr:`Conversion.notes` (never silently dropped); the
command prints them and writes them at the top of the output. Type errors, an
unknown searcher or hyperparameter type, a Trial API entrypoint or a script that uses
Determined's Trial APIs (``determined.pytorch``, ``determined.keras``, ...) raise
:class:`~dlhpc.errors.ConfigError` naming ``file:line: field``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dlhpc.config.lines import key_line
from dlhpc.convert._sections import (
    CORE_API_ROUTE,
    ENV_SLOTS,
    UNTRANSLATED,
    checkpoint_section,
    entrypoint,
    environment_vars,
    resources,
)
from dlhpc.convert._source import Source, read_source
from dlhpc.convert._trial_api import scripts_of, trial_api_uses
from dlhpc.errors import ConfigError

__all__ = ["Conversion", "convert_determined", "map_issues"]

ENV_TIME_METRIC = "DLHPC_DETERMINED_TIME_METRIC"
ENV_UNIT = "DLHPC_DETERMINED_UNIT"
ENV_NESTED = "DLHPC_DETERMINED_NESTED"
SEARCHERS = {
    "single": "single",
    "random": "random",
    "grid": "grid",
    "adaptive_asha": "asha",
    "async_halving": "asha",
}
NO_EQUIVALENT = ("custom", "pbt", "adaptive", "adaptive_simple", "sync_halving")
HP_KEYS = {
    "const": {"val"},
    "int": {"minval", "maxval", "count"},
    "double": {"minval", "maxval", "count"},
    "log": {"minval", "maxval", "base", "count"},
    "categorical": {"vals"},
}
UNITS = ("batches", "records", "epochs")
# dlhpc field -> the Determined field it came from, for errors of the output's validation
_ORIGIN = {
    "searcher.max_rungs": ("searcher", "max_rungs", "num_rungs"),
    "searcher.max_length": ("searcher", "max_length", "max_time"),
    "checkpoint.keep_best": ("checkpoint_storage", "save_trial_best"),
    "checkpoint.keep_latest": ("checkpoint_storage", "save_trial_latest"),
    "checkpoint.keep_experiment_best": ("checkpoint_storage", "save_experiment_best"),
    "checkpoint.dir": ("checkpoint_storage", "host_path"),
    "resources.sbatch_args": ("slurm", "sbatch_args"),
    "resources": ("resources", "slots_per_trial"),
    "environment": ("environment", "environment_variables"),
    "reproducibility.seed": ("reproducibility", "experiment_seed"),
}


@dataclass(frozen=True)
class Conversion:
    """The translated experiment: ``config`` (a dlhpc experiment mapping) and ``notes``
    (each Determined field not translated, or only approximated, and why)."""

    source: Path
    config: dict[str, Any]
    notes: tuple[str, ...]

    def render(self) -> str:
        """The experiment file's text: a comment naming the source and every note, then
        the YAML."""
        head = [f"# Converted by `dlhpc convert determined` from {self.source.name}."]
        if self.notes:
            head.append("# Not translated or approximated (check these before launching):")
            head += [f"#   - {n}" for n in self.notes]
        else:
            head.append("# Every field was translated.")
        body = yaml.safe_dump(self.config, sort_keys=False, allow_unicode=True, width=100)
        return "\n".join(head) + "\n" + body


def _hparams(
    src: Source, value: Any, path: tuple[str, ...], out: dict[str, Any], roots: set[str]
) -> None:
    for name, spec in src.mapping(path, value).items():
        keys = (*path, str(name))
        flat = ".".join(keys[1:])
        if isinstance(spec, dict) and "type" not in spec:
            roots.add(keys[1])
            _hparams(src, spec, keys, out, roots)
            continue
        if not isinstance(spec, dict):
            out[flat] = spec  # a constant
            continue
        kind = spec["type"]
        if kind not in HP_KEYS:
            src.error((*keys, "type"), f"must be one of {', '.join(HP_KEYS)}, got {kind!r}")
            continue
        extra = sorted(set(spec) - HP_KEYS[kind] - {"type"})
        if extra:
            src.error((*keys, extra[0]), f"not a field of a {kind} hyperparameter")
            continue
        if kind == "log" and "base" not in spec:
            src.error(keys, "type log needs base (Determined has no default for it)")
            continue
        out[flat] = dict(spec)


def _length(src: Source, s: dict[str, Any], env: dict[str, str]) -> int | None:
    keys = ("searcher",)
    if "max_time" in s or "time_metric" in s:
        for key in ("max_time", "time_metric"):
            if key not in s:
                src.error((*keys, key), "required with max_time / time_metric")
        if isinstance(s.get("time_metric"), str):
            env[ENV_TIME_METRIC] = s["time_metric"]
        return src.int_at((*keys, "max_time"), s.get("max_time"), 1)
    length = s.get("max_length")
    if isinstance(length, dict):
        unit = next(iter(length), None)
        if len(length) != 1 or unit not in UNITS:
            src.error((*keys, "max_length"), f"must be one of {{{', '.join(UNITS)}: N}} or N")
            return None
        env[ENV_UNIT] = str(unit)
        if unit != "batches":
            src.note(
                (*keys, "max_length"),
                f"in {unit}: op.length counts {unit}, and dlhpc counts a trial's length in the"
                " steps_completed it reports, so the script must count them in the same unit",
            )
        return src.int_at((*keys, "max_length", str(unit)), length[unit], 1)
    return src.int_at((*keys, "max_length"), length, 1)


def _searcher(src: Source, env: dict[str, str]) -> dict[str, Any]:
    keys = ("searcher",)
    s = src.mapping(keys, src.data.get("searcher"))
    name = s.get("name")
    if name in NO_EQUIVALENT:
        src.error((*keys, "name"), f"Determined's {name!r} searcher has no dlhpc equivalent")
        return {}
    if name not in SEARCHERS:
        src.error((*keys, "name"), f"must be one of {', '.join(SEARCHERS)}, got {name!r}")
        return {}
    out: dict[str, Any] = {"name": SEARCHERS[name]}
    metric = src.typed((*keys, "metric"), s.get("metric"), lambda v: isinstance(v, str), "text")
    if metric is None:
        src.error((*keys, "metric"), "required: the validation metric to search on")
    out["metric"] = metric
    sib = s.get("smaller_is_better", True)
    out["smaller_is_better"] = src.typed(
        (*keys, "smaller_is_better"), sib, lambda v: isinstance(v, bool), "true or false"
    )
    length = _length(src, s, env)
    if length is not None:
        out["max_length"] = length
    elif out["name"] == "asha" and not src.issues:
        src.error(keys, "needs max_length (or max_time and time_metric)")
    done = {"name", "metric", "smaller_is_better", "max_length", "max_time", "time_metric"}
    counts = {"max_concurrent_trials": 0}
    if out["name"] in ("random", "asha"):
        counts["max_trials"] = 1
    if out["name"] == "asha":
        counts |= {"divisor": 2, "max_rungs": 1, "num_rungs": 1}
        out |= {"divisor": 4, "max_rungs": 5}  # Determined's defaults
    for key, low in counts.items():
        if key in s:
            value = src.int_at((*keys, key), s[key], low)
            if value is not None:
                out["max_rungs" if key == "num_rungs" else key] = value
    done |= set(counts)
    if out["name"] != "single" and "max_concurrent_trials" not in s:
        out["max_concurrent_trials"] = 16  # Determined's default (dlhpc's: none for some)
    if out["name"] == "asha":
        stop_once = "max_time" in s or s.get("stop_once") is True
        out["stop_once"] = stop_once  # 0.38's ASHA stops trials that train to their own length
        done |= {"stop_once"}
        mode = s.get("mode", "standard")
        if name == "adaptive_asha" and mode != "aggressive":
            src.note(
                (*keys, "mode"),
                f"{mode!r} (several brackets) approximated by one ASHA bracket (Determined's"
                " aggressive mode); searcher `hyperband` with this mode runs several",
            )
        done |= {"mode"}
    for key in sorted(set(s) - done):
        src.note((*keys, key), "not translated")
    return out


def _top_level(src: Source, out: dict[str, Any]) -> None:
    known = {
        "name",
        "description",
        "entrypoint",
        "hyperparameters",
        "searcher",
        "resources",
        "max_restarts",
        "checkpoint_storage",
        "environment",
        "data",
        "reproducibility",
        "slurm",
    }
    for key in sorted(set(src.data) - known):
        why = UNTRANSLATED.get(key, "not a field dlhpc knows how to translate")
        src.note((key,), why)
    if "max_restarts" in src.data:
        value = src.int_at(("max_restarts",), src.data["max_restarts"])
        if value is not None:
            out["max_restarts"] = value
    repro = src.mapping(("reproducibility",), src.data.get("reproducibility"))
    for key in sorted(set(repro) - {"experiment_seed"}):
        src.note(("reproducibility", key), "not translated")
    if "experiment_seed" in repro:
        seed = src.int_at(("reproducibility", "experiment_seed"), repro["experiment_seed"])
        if seed is not None:
            out["reproducibility"] = {"seed": seed}


def _check_scripts(src: Source, argv: list[str], context: Path) -> None:
    """Refuse the entrypoint when a script it names uses Determined's Trial APIs."""
    for script in scripts_of(argv, context):
        try:
            uses = trial_api_uses(script)
        except (OSError, UnicodeDecodeError, SyntaxError) as err:
            src.note(("entrypoint",), f"{script.name} not checked for Trial API use: {err}")
            continue
        for line, module in uses:
            src.error(("entrypoint",), f"{script.name} line {line} uses {module}: {CORE_API_ROUTE}")


def convert_determined(
    path: Path,
    *,
    out_dir: Path,
    workdir: Path | None = None,
    slot_type: str = "gpu",
    slots_per_node: int | None = None,
) -> Conversion:
    """Translate the Determined config ``path`` into an experiment file to be written in
    ``out_dir``. ``workdir``: the Determined context folder (default: ``path``'s), written
    relative to ``out_dir``. ``slot_type``: ``gpu`` (a slot is a GPU) or ``cpu`` (a CPU
    for one worker); ``slots_per_node``: how many slots each node has (default:
    ``slurm.slots_per_node``, else all on one node)."""
    src = read_source(path)
    out: dict[str, Any] = {}
    name = src.data.get("name", path.stem)
    out["name"] = src.typed(("name",), name, lambda v: isinstance(v, str) and bool(v), "text")
    if isinstance(src.data.get("description"), str):
        out["description"] = src.data["description"]
    context = (workdir or path.parent).resolve()
    out["entrypoint"], argv = entrypoint(src)
    _check_scripts(src, argv, context)
    if context != out_dir.resolve():
        out["workdir"] = os.path.relpath(context, out_dir.resolve())
    out["resources"], per_node = resources(src, slot_type, slots_per_node)
    env = environment_vars(src)
    if per_node is not None:
        env[ENV_SLOTS] = str(per_node)
    hparams: dict[str, Any] = {}
    roots: set[str] = set()
    _hparams(src, src.data.get("hyperparameters"), ("hyperparameters",), hparams, roots)
    if roots:
        env[ENV_NESTED] = json.dumps(sorted(roots))
    searcher = _searcher(src, env)
    if env:
        out["environment"] = {"vars": env}
    out["hyperparameters"] = hparams
    out["searcher"] = searcher
    checkpoint = checkpoint_section(src)
    if checkpoint:
        out["checkpoint"] = checkpoint
    _top_level(src, out)
    src.raise_issues()
    return Conversion(path, {k: v for k, v in out.items() if v not in (None, {})}, tuple(src.notes))


def map_issues(conversion: Conversion, error: ConfigError) -> ConfigError:
    """The problems dlhpc's loader found in the converted file, placed at the Determined
    field each came from (``file:line: field``)."""
    src = Source(conversion.source, {})
    for issue in error.issues:
        field = issue.field
        origin = next((v for k, v in _ORIGIN.items() if field.startswith(k)), None)
        keys: tuple[str, ...] = tuple(field.split(".")) if field else ()
        if origin is not None:
            given = [k for k in origin[1:] if key_line(src.path, (origin[0], k)) is not None]
            keys = (origin[0], *given[:1])
        src.error(keys, f"{issue.message} (as {field or 'the file'})")
    return ConfigError(src.issues)
