"""Pure comparison of two trials' reproducibility records.

A *trial record* (:func:`trial_record`) puts together what is known of one
trial: its experiment's launch record (``experiments.repro_json``), its resolved
config, its hyperparameters, seed and length, and an attempt's record
(``attempts.env_json``). :func:`diff_records` compares two of them section by
section (:data:`SECTIONS`) and returns one :class:`Difference` per item that
differs, in section order; it reads nothing and never raises on a partial or
older record (a side without an experiment or attempt record gives one
``record`` difference and those sections are skipped).

Not compared: the search settings (``searcher``, the hyperparameter space,
``reproducibility.trial_seed``; the trial's own values are), the config's
``name``/``description``/``raw``, and environment variables that differ between
any two attempts by construction (job ids, ``MASTER_PORT``, ...).
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dlhpc.repro._attempt import VOLATILE_ENV

__all__ = ["SECTIONS", "Difference", "diff_records", "render_differences", "trial_record"]

SECTIONS = (
    "record", "code", "config", "hparams", "seed", "max_length", "python", "packages", "conda",
    "modules", "slurm", "site", "nodes", "cpu", "gpu", "env", "data",
)  # fmt: skip
_EXPERIMENT_SECTIONS = {"code", "python", "packages", "conda", "slurm", "site"}  # and modules
_ATTEMPT_SECTIONS = {"nodes", "cpu", "gpu", "env", "data"}
_CONFIG_SKIP = {"name", "description", "raw", "hyperparameters", "searcher"}
_CODE_KEYS = ("kind", "commit", "branch", "remote", "dirty", "diff_sha256", "digest", "error")
_LIST_AT_MOST = 10
_Sides = tuple[Mapping[str, Any], Mapping[str, Any]]  # one item of two records
_SHA = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Difference:
    """``item`` of ``section`` is ``a`` in the first record and ``b`` in the second
    (None: absent there)."""

    section: str
    item: str
    a: Any
    b: Any

    def as_dict(self) -> dict[str, Any]:
        return {"section": self.section, "item": self.item, "a": self.a, "b": self.b}

    def render(self) -> str:
        return f"{self.section:<10} {self.item}: {_show(self.a)} -> {_show(self.b)}"


def _show(value: Any) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, str) and _SHA.fullmatch(value):
        return value[:12]  # a sha256: its prefix tells them apart
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def trial_record(
    experiment: Mapping[str, Any],
    config: Mapping[str, Any],
    hparams: Mapping[str, Any],
    seed: int,
    max_length: int,
    attempt: Mapping[str, Any],
) -> dict[str, Any]:
    """One trial's record, the unit :func:`diff_records` compares."""
    return {
        "experiment": dict(experiment),
        "config": dict(config),
        "trial": {"hparams": dict(hparams), "seed": seed, "max_length": max_length},
        "attempt": dict(attempt),
    }


def _map(section: str, a: Mapping[str, Any], b: Mapping[str, Any]) -> list[Difference]:
    return [
        Difference(section, str(k), a.get(k), b.get(k))
        for k in sorted(set(a) | set(b), key=str)
        if a.get(k) != b.get(k)
    ]


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def _dict(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


def _code(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[Difference]:
    out = _map("code", {k: a.get(k) for k in _CODE_KEYS}, {k: b.get(k) for k in _CODE_KEYS})
    ma, mb = _dict(a.get("manifest")), _dict(b.get("manifest"))
    files = [d for d in _map("code", ma, mb)]
    out += files[:_LIST_AT_MOST]
    if len(files) > _LIST_AT_MOST:
        out.append(Difference("code", f"... {len(files) - _LIST_AT_MOST} more files", None, None))
    return out


def _config(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[Difference]:
    def flat(c: Mapping[str, Any]) -> dict[str, Any]:
        f = _flatten({k: v for k, v in c.items() if k not in _CONFIG_SKIP})
        f.pop("reproducibility.trial_seed", None)
        return f

    return _map("config", flat(a), flat(b))


def _modules(launch: _Sides | None, job: _Sides | None) -> list[Difference]:
    """The modules loaded at launch (items by module name: ``cuda``), then those in
    effect in the job, after the site's ``module load`` lines (``job: cuda``); None:
    that side's records are missing (an attempt record without ``modules``, e.g. a
    reproduction's plan, has nothing to compare)."""

    def by_name(rec: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
        return {prefix + str(m).split("/", 1)[0]: str(m) for m in rec.get("loaded") or []}

    out = _map("modules", by_name(launch[0]), by_name(launch[1])) if launch else []
    if job:
        out += _map("modules", by_name(job[0], "job: "), by_name(job[1], "job: "))
    return out


def _module_sides(
    ea: Mapping[str, Any],
    eb: Mapping[str, Any],
    aa: Mapping[str, Any],
    ab: Mapping[str, Any],
    skipped: Collection[str],
) -> tuple[_Sides | None, _Sides | None]:
    """:func:`_modules`'s arguments from the experiment and attempt records."""
    launch = (
        None if "experiment" in skipped else (_dict(ea.get("modules")), _dict(eb.get("modules")))
    )
    both = "attempt" not in skipped and "modules" in aa and "modules" in ab
    job = (_dict(aa.get("modules")), _dict(ab.get("modules"))) if both else None
    return launch, job


def _gpu(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[Difference]:
    def facts(g: Mapping[str, Any]) -> dict[str, Any]:
        names = [d.get("name") for d in g.get("devices") or [] if isinstance(d, Mapping)]
        return {
            "driver": g.get("driver"),
            "cuda_driver": g.get("cuda_driver"),
            "devices": ", ".join(str(n) for n in names) or None,
        }

    return _map("gpu", facts(a), facts(b))


def _data(a: Iterable[Any], b: Iterable[Any]) -> list[Difference]:
    da = {str(e.get("path")): e for e in a if isinstance(e, Mapping)}
    db = {str(e.get("path")): e for e in b if isinstance(e, Mapping)}
    out = []
    for path in sorted(set(da) | set(db)):
        ea, eb = da.get(path, {}), db.get(path, {})
        keys = ["exists", "kind", "files", "bytes", "listing_sha256"]
        if "content_sha256" in ea and "content_sha256" in eb:
            keys.append("content_sha256")
        diffs = [
            Difference("data", f"{path}: {k}", ea.get(k), eb.get(k))
            for k in keys
            if ea.get(k) != eb.get(k)
        ]
        if diffs and ea and eb:
            rows_a = {r[0]: r[1:] for r in ea.get("listing") or []}
            rows_b = {r[0]: r[1:] for r in eb.get("listing") or []}
            files = [
                Difference("data", f"{path}: {rel}", rows_a.get(rel), rows_b.get(rel))
                for rel in sorted(set(rows_a) | set(rows_b))
                if rows_a.get(rel) != rows_b.get(rel)
            ]
            diffs += files[:_LIST_AT_MOST]
        out += diffs
    return out


def diff_records(
    a: Mapping[str, Any],
    b: Mapping[str, Any],
    sections: Collection[str] | None = None,
    volatile: Collection[str] = (),
) -> list[Difference]:
    """The differences between trial records ``a`` and ``b`` (only ``sections``
    when given), in :data:`SECTIONS` order. Environment variables in
    ``volatile`` (the schedulers' job ids, node lists, ...) or in
    :data:`~dlhpc.repro._attempt.VOLATILE_ENV` are not compared."""
    skip_env = VOLATILE_ENV | set(volatile)
    want = set(SECTIONS if sections is None else sections)
    ea, eb = _dict(a.get("experiment")), _dict(b.get("experiment"))
    aa, ab = _dict(a.get("attempt")), _dict(b.get("attempt"))
    ta, tb = _dict(a.get("trial")), _dict(b.get("trial"))
    out: list[Difference] = []
    skip: set[str] = set()
    skipped: set[str] = set()  # the record kinds not compared
    for name, ra, rb, group in (
        ("experiment", ea, eb, _EXPERIMENT_SECTIONS),
        ("attempt", aa, ab, _ATTEMPT_SECTIONS),
    ):
        if bool(ra) != bool(rb) or not ra:
            skip |= group
            skipped.add(name)
            if bool(ra) != bool(rb) and want & group:
                out.append(
                    Difference(
                        "record", name, "recorded" if ra else None, "recorded" if rb else None
                    )
                )
    parts = {
        "code": lambda: _code(_dict(ea.get("code")), _dict(eb.get("code"))),
        "config": lambda: _config(_dict(a.get("config")), _dict(b.get("config"))),
        "hparams": lambda: _map("hparams", _dict(ta.get("hparams")), _dict(tb.get("hparams"))),
        "seed": lambda: _map("seed", {"seed": ta.get("seed")}, {"seed": tb.get("seed")}),
        "max_length": lambda: _map(
            "max_length", {"max_length": ta.get("max_length")}, {"max_length": tb.get("max_length")}
        ),
        "python": lambda: _map("python", _dict(ea.get("python")), _dict(eb.get("python"))),
        "packages": lambda: _map(
            "packages",
            _dict(_dict(ea.get("packages")).get("items")),
            _dict(_dict(eb.get("packages")).get("items")),
        ),
        "conda": lambda: _map(
            "conda",
            _dict(_dict(ea.get("conda")).get("items")),
            _dict(_dict(eb.get("conda")).get("items")),
        ),
        "modules": lambda: _modules(*_module_sides(ea, eb, aa, ab, skipped)),
        "slurm": lambda: _map("slurm", _dict(ea.get("slurm")), _dict(eb.get("slurm"))),
        "site": lambda: _map("site", _dict(ea.get("site")), _dict(eb.get("site"))),
        "nodes": lambda: _map("nodes", {"nodes": aa.get("nodes")}, {"nodes": ab.get("nodes")}),
        "cpu": lambda: _map("cpu", _dict(aa.get("cpu")), _dict(ab.get("cpu"))),
        "gpu": lambda: _gpu(_dict(aa.get("gpu")), _dict(ab.get("gpu"))),
        "env": lambda: _map(
            "env",
            {k: v for k, v in _dict(aa.get("env")).items() if k not in skip_env},
            {k: v for k, v in _dict(ab.get("env")).items() if k not in skip_env},
        ),
        "data": lambda: _data(aa.get("data") or [], ab.get("data") or []),
    }
    for section in SECTIONS:
        if section in want and section in parts and section not in skip:
            out += parts[section]()
    return out


def render_differences(diffs: Iterable[Difference]) -> list[str]:
    """One line per difference: ``section   item: A -> B``."""
    return [d.render() for d in diffs]
