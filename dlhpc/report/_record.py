"""The reproducibility section of a report: what was recorded to rerun an experiment.

:func:`repro_record` turns the experiment's facts, its resolved config and its launch
record (``experiments.repro_json``, from :func:`dlhpc.repro.collect_launch_record`;
``{}`` for an experiment launched before it existed) into a definition list (label ->
one line) and long texts (title -> text, shown folded: the package list, the diff at
launch). A field the record lacks is left out, and one whose collection failed shows
its ``error``, so the section takes new fields of the record without a change here
beyond a line. Pure: every value arrives as an argument.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dlhpc._version import __version__
from dlhpc.protocol import code_dir
from dlhpc.store.queries import parse_record

__all__ = ["attempt_environments", "parse_record", "repro_record"]


def _d(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _code(code: Mapping[str, Any]) -> str:
    if code.get("error"):
        return f"{code.get('kind', '?')}: {code['error']}"
    if code.get("kind") == "git":
        state = "uncommitted changes" if code.get("dirty") else "clean"
        where = f" ({code['remote']})" if code.get("remote") else ""
        return (
            f"git {code.get('commit', '?')} on {code.get('branch') or '(detached)'}, {state};"
            f" {code.get('root', '')}{where}"
        )
    if code.get("kind") == "snapshot":
        return f"snapshot manifest: {code.get('files', '?')} files, {code.get('bytes', '?')} bytes"
    return ""


def _environment(env: Mapping[str, Any]) -> str:
    """One line of what an attempt ran on (its ``env`` record, see :mod:`dlhpc.repro`)."""
    cpu = _d(env.get("cpu"))
    gpu = _d(env.get("gpu"))
    raw = gpu.get("devices")
    devices: list[Any] = raw if isinstance(raw, list) else []
    names = Counter(str(_d(d).get("name", "?")) for d in devices)
    gpus = ", ".join(f"{n} x {name}" for name, n in sorted(names.items())) or "no GPU"
    driver = gpu.get("driver")
    cuda = gpu.get("cuda_driver")
    soft = f" (driver {driver}, CUDA {cuda})" if driver or cuda else ""
    return f"{env.get('nodes') or env.get('host', '?')}: {cpu.get('model', '?')}; {gpus}{soft}"


def attempt_environments(env_jsons: Sequence[str]) -> tuple[str, str]:
    """``(summary, one line per distinct environment with its attempt count)`` from the
    attempts' ``env_json`` records; attempts without one are counted apart."""
    seen: Counter[str] = Counter()
    missing = 0
    for text in env_jsons:
        env = parse_record(text)
        if env:
            seen[_environment(env)] += 1
        else:
            missing += 1
    summary = f"{sum(seen.values())} attempt(s) recorded, {len(seen)} distinct"
    if missing:
        summary += f"; {missing} without a record"
    lines = [f"{n} attempt(s): {line}" for line, n in sorted(seen.items(), key=lambda x: -x[1])]
    return summary, "\n".join(lines)


def repro_record(
    facts: Mapping[str, str],
    config: Mapping[str, Any],
    record: Mapping[str, Any],
    env_jsons: Sequence[str] = (),
) -> tuple[dict[str, str], dict[str, str]]:
    """``(label -> text, title -> long text)``. ``facts``: the experiment's
    ``source_path``, ``run_dir``, ``site``, ``backend``, ``user``; ``env_jsons``: its
    attempts' environment records (nodes, CPU, GPU model, driver, CUDA)."""
    seeds = _d(config.get("reproducibility"))
    run_dir = facts.get("run_dir", "")
    items = {
        "experiment file (as given)": facts.get("source_path", ""),
        "code snapshot": str(code_dir(Path(run_dir))) if run_dir else "",
        "entrypoint": str(config.get("entrypoint", "")),
        "site / backend": f"{facts.get('site', '')} / {facts.get('backend', '')}",
        "user": facts.get("user") or "(not recorded)",
        "seed / deterministic": f"{seeds.get('seed', '?')} / {seeds.get('deterministic', '?')}",
    }
    long: dict[str, str] = {}
    if not record:
        items["launch record"] = "(none: launched before dlhpc recorded one)"
    _add_sources(record, items, long)
    _add_software(record, items, long)
    _add_data_and_time(record, items)
    if env_jsons:
        items["attempt environments"], envs = attempt_environments(env_jsons)
        if envs:
            long["attempt environments (nodes: CPU; GPUs)"] = envs
    items["dlhpc writing this report"] = __version__
    return items, long


def _add_sources(record: Mapping[str, Any], items: dict[str, str], long: dict[str, str]) -> None:
    """What ran, into ``items`` and ``long``: the code (its digest, its diff at launch)
    and the config's checksums."""
    code = _d(record.get("code"))
    if code:
        items["code"] = _code(code)
        if code.get("digest"):
            items["code digest"] = str(code["digest"])
        if code.get("diff"):
            long["uncommitted diff at launch"] = str(code["diff"])
    cfg = _d(record.get("config"))
    if cfg:
        items["config sha256 (YAML / resolved)"] = (
            f"{cfg.get('yaml_sha256', '?')} / {cfg.get('resolved_sha256', '?')}"
        )


def _add_software(record: Mapping[str, Any], items: dict[str, str], long: dict[str, str]) -> None:
    """What it ran with, into ``items`` and ``long``: Python, the packages (their list
    in ``long``), conda, the environment modules, Slurm."""
    py = _d(record.get("python"))
    if py:
        items["python at launch"] = " ".join(
            str(py[k]) for k in ("implementation", "version", "executable") if py.get(k)
        )
    packages = _d(_d(record.get("packages")).get("items"))
    if packages:
        dlhpc_at_launch = packages.get("dlhpc")
        if dlhpc_at_launch:
            items["dlhpc at launch"] = str(dlhpc_at_launch)
        source = _d(record.get("packages")).get("source", "")
        items["packages"] = f"{len(packages)} ({source})" if source else str(len(packages))
        long["packages at launch"] = "\n".join(
            f"{k}=={v}" if v else k for k, v in sorted(packages.items())
        )
    conda = _d(record.get("conda"))
    if conda:
        items["conda"] = f"{conda.get('prefix', '?')}: {len(_d(conda.get('items')))} packages"
    modules = _d(record.get("modules"))
    if "loaded" in modules:
        items["environment modules"] = ", ".join(map(str, modules["loaded"] or [])) or "(none)"
    if "slurm" in record:
        items["Slurm"] = str(_d(record.get("slurm")).get("version") or "(none)")


def _add_data_and_time(record: Mapping[str, Any], items: dict[str, str]) -> None:
    """Into ``items``: the data inputs' hashes, and when and where the record was made."""
    data = record.get("data")
    if isinstance(data, list) and data:
        items["data"] = "; ".join(
            f"{_d(d).get('path', '?')}: {_d(d).get('hash') or _d(d).get('error', '?')}"
            for d in data
        )
    at = record.get("collected_at")
    if isinstance(at, int | float):
        when = datetime.fromtimestamp(at, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
        items["recorded"] = f"{when} on {record.get('host', '?')}"
