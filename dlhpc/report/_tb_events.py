"""TensorBoard event files as bytes, built from TensorBoard's own protos.

A file is TensorBoard's record framing (:class:`RecordWriter`: length, masked CRC,
serialized ``Event``, masked CRC) of a ``file_version`` event followed by one event
per metric point. A point is a scalar summary whose value is a 0-d ``DT_FLOAT`` tensor
(the scalar plugin's format, as ``tf.summary.scalar`` writes it): the database's double
rounded to the nearest float32, since TensorBoard's data server (its default loader)
shows no other scalar type; step and wall time are exact. A NULL (a NaN the job
reported) is written as NaN. The HParams plugin's
records (the experiment's definition, each trial's session start and end) are
summaries under its ``_hparams_/...`` tags.

Only this module imports ``tensorboard`` (the optional extra ``dlhpc[tensorboard]``);
:func:`require_tensorboard` says clearly when it is missing. TensorFlow and torch are
never imported.
"""

from __future__ import annotations

import importlib.util
import io
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dlhpc.errors import UsageError

__all__ = [
    "FILE_VERSION",
    "HparamValue",
    "column_kinds",
    "in_column",
    "MetricPoint",
    "SessionEnd",
    "event_file_bytes",
    "experiment_event",
    "flat_hparams",
    "point_events",
    "require_tensorboard",
    "session_end_event",
    "session_start_event",
    "tensorboard_installed",
]

FILE_VERSION = "brain.Event:2"  # no restart purge: TensorBoard keeps points out of step order

#: a hyperparameter value as the HParams plugin takes it
HparamValue = bool | int | float | str


@dataclass(frozen=True)
class MetricPoint:
    """One row of the ``metrics`` table: ``value`` None is a NaN the job reported."""

    id: int
    step: int
    name: str
    value: float | None
    time: float


@dataclass(frozen=True)
class SessionEnd:
    """A trial that has ended: its HParams status (``STATUS_SUCCESS``...) and end time."""

    status: str
    time: float


def tensorboard_installed() -> bool:
    """Whether the ``tensorboard`` package (the extra ``dlhpc[tensorboard]``) is here
    (a page build may skip the export without it)."""
    return importlib.util.find_spec("tensorboard") is not None


def require_tensorboard() -> None:
    """Raise :class:`~dlhpc.errors.UsageError` (exit 2) unless
    :func:`tensorboard_installed`."""
    if not tensorboard_installed():
        raise UsageError(
            "TensorBoard is not installed in this environment:"
            " pip install 'dlhpc[tensorboard]' (or pip install tensorboard)"
        )


def flat_hparams(hparams: Mapping[str, Any], prefix: str = "") -> dict[str, HparamValue]:
    """A trial's hyperparameters as HParams values: nested mappings become
    ``outer.inner`` names, bools, numbers and strings stay, None is left out, anything
    else (lists) is its JSON text."""
    out: dict[str, HparamValue] = {}
    for key, value in hparams.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flat_hparams(value, f"{name}."))
        elif value is None:
            continue
        elif isinstance(value, bool | int | float | str):
            out[name] = value
        else:
            out[name] = json.dumps(value, sort_keys=True, default=str)
    return out


def _scalar_summary_value(name: str, value: float | None, first: bool) -> Any:
    from tensorboard.compat.proto import summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
    from tensorboard.plugins.scalar import metadata as scalar_metadata

    tensor = tensor_pb2.TensorProto(
        dtype=types_pb2.DT_FLOAT,
        tensor_shape=tensor_shape_pb2.TensorShapeProto(),
        float_val=[math.nan if value is None else value],  # protobuf rounds to float32
    )
    out = summary_pb2.Summary.Value(tag=name, tensor=tensor)
    if first:  # a tag's metadata is read from its first value
        meta = scalar_metadata.create_summary_metadata(display_name=name, description="")
        meta.data_class = summary_pb2.DATA_CLASS_SCALAR
        out.metadata.CopyFrom(meta)
    return out


def point_events(points: Iterable[MetricPoint]) -> list[Any]:
    """One ``Event`` per point (its step and wall time), in the order given."""
    from tensorboard.compat.proto import event_pb2, summary_pb2

    seen: set[str] = set()
    events = []
    for p in points:
        value = _scalar_summary_value(p.name, p.value, p.name not in seen)
        seen.add(p.name)
        events.append(
            event_pb2.Event(
                wall_time=p.time, step=p.step, summary=summary_pb2.Summary(value=[value])
            )
        )
    return events


def _hparams_event(tag: str, wall_time: float, **plugin_data: Any) -> Any:
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.plugins.hparams import metadata, plugin_data_pb2

    data = plugin_data_pb2.HParamsPluginData(**plugin_data)
    value = summary_pb2.Summary.Value(
        tag=tag, metadata=metadata.create_summary_metadata(data), tensor=metadata.NULL_TENSOR
    )
    return event_pb2.Event(wall_time=wall_time, summary=summary_pb2.Summary(value=[value]))


def session_start_event(hparams: Mapping[str, HparamValue], group: str, start: float) -> Any:
    """The HParams session start of one trial: its hyperparameters, one group per trial."""
    from tensorboard.plugins.hparams import metadata, plugin_data_pb2

    info = plugin_data_pb2.SessionStartInfo(group_name=group, start_time_secs=start)
    for name, value in hparams.items():
        if isinstance(value, bool):
            info.hparams[name].bool_value = value
        elif isinstance(value, int | float):
            info.hparams[name].number_value = value
        else:
            info.hparams[name].string_value = value
    return _hparams_event(metadata.SESSION_START_INFO_TAG, start, session_start_info=info)


def session_end_event(end: SessionEnd) -> Any:
    """The HParams session end of a trial that has ended."""
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

    info = plugin_data_pb2.SessionEndInfo(
        status=api_pb2.Status.Value(end.status), end_time_secs=end.time
    )
    return _hparams_event(metadata.SESSION_END_INFO_TAG, end.time, session_end_info=info)


def _kind(value: HparamValue) -> str:
    if isinstance(value, bool):
        return "bool"
    return "number" if isinstance(value, int | float) else "string"


def column_kinds(values: Mapping[str, list[HparamValue]]) -> dict[str, str]:
    """Each hyperparameter's column type from all trials' values: ``number``, ``bool``,
    or ``string`` (also for mixed types, e.g. a categorical of ``[32, "auto"]``)."""
    out = {}
    for name, vals in values.items():
        kinds = {_kind(v) for v in vals}
        out[name] = kinds.pop() if len(kinds) == 1 else "string"
    return out


def in_column(
    hparams: Mapping[str, HparamValue], kinds: Mapping[str, str]
) -> dict[str, HparamValue]:
    """A trial's values as its columns take them: in a string column, a number or bool
    is its text, so that the HParams tab compares like with like."""
    return {
        name: value if kinds.get(name, _kind(value)) == _kind(value) else str(value)
        for name, value in hparams.items()
    }


def _hparam_info(name: str, kind: str, values: list[HparamValue]) -> Any:
    """The column of one hyperparameter: a discrete domain for strings and bools, the
    trials' range for numbers."""
    from google.protobuf import struct_pb2
    from tensorboard.plugins.hparams import api_pb2

    info = api_pb2.HParamInfo(name=name, display_name=name)
    if kind == "number":
        nums = [float(v) for v in values]
        info.type = api_pb2.DATA_TYPE_FLOAT64
        info.domain_interval.CopyFrom(api_pb2.Interval(min_value=min(nums), max_value=max(nums)))
        return info
    discrete = struct_pb2.ListValue()
    if kind == "bool":
        info.type = api_pb2.DATA_TYPE_BOOL
        for flag in sorted(set(values)):
            discrete.values.add().bool_value = bool(flag)
    else:
        info.type = api_pb2.DATA_TYPE_STRING
        for text in sorted({str(v) for v in values}):
            discrete.values.add().string_value = text
    info.domain_discrete.CopyFrom(discrete)
    return info


def experiment_event(
    description: str,
    user: str,
    created: float,
    hparams: Mapping[str, list[HparamValue]],
    metrics: list[str],
) -> Any:
    """The HParams experiment definition: one column per hyperparameter (sorted by
    name; its type from :func:`column_kinds`) and one per metric, in the order given
    (the searcher's metric first)."""
    from tensorboard.plugins.hparams import api_pb2, metadata

    kinds = column_kinds(hparams)

    experiment = api_pb2.Experiment(
        description=description,
        user=user,
        time_created_secs=created,
        hparam_infos=[_hparam_info(n, kinds[n], hparams[n]) for n in sorted(hparams)],
        metric_infos=[
            api_pb2.MetricInfo(name=api_pb2.MetricName(tag=m), display_name=m) for m in metrics
        ],
    )
    return _hparams_event(metadata.EXPERIMENT_TAG, created, experiment=experiment)


def event_file_bytes(events: list[Any], wall_time: float) -> bytes:
    """A whole event file: the ``file_version`` event (at ``wall_time``), then ``events``."""
    from tensorboard.compat.proto import event_pb2
    from tensorboard.summary.writer.record_writer import RecordWriter

    buf = io.BytesIO()
    writer = RecordWriter(buf)
    writer.write(
        event_pb2.Event(wall_time=wall_time, file_version=FILE_VERSION).SerializeToString()
    )
    for event in events:
        writer.write(event.SerializeToString())
    return buf.getvalue()
