"""Bayesian optimisation with scikit-optimize (the optional ``bayes`` extra).

scikit-optimize is archived upstream; its last release (0.10.2) works with
today's numpy and scikit-learn. It is imported lazily, only here, so the rest
of dlhpc never needs it; without it, building this searcher raises a
:class:`~dlhpc.errors.UsageError` (exit code 2) naming the fix.

How the space maps to skopt dimensions (in sorted name order): ``int`` ->
``Integer``, ``double`` -> ``Real``, ``log`` -> ``Real(base**minval,
base**maxval, prior="log-uniform")``, ``categorical`` -> ``Categorical`` of
the *indices* of ``vals`` (so values of any JSON type work, and ``True`` and
``1`` stay distinct); ``const`` and ranges holding one value are not
dimensions but fixed values added to every configuration.

Purity: skopt's ``Optimizer`` cannot be serialised, and replaying a call log
into a fresh one would refit the Gaussian process once per past result on
every load (the orchestrator loads the searcher on every tick). Instead each
:meth:`BayesSearcher.ask` builds a fresh ``Optimizer`` whose random state is a
function of the seed and the number of trials created so far, tells it every
result in one batch (one fit) and asks it for the batch. The state is thus
just the proposed points and their results: a restored searcher (or a second
one fed the same calls) gives the same future asks by construction.
"""

from __future__ import annotations

import hashlib
import math
import warnings
from dataclasses import dataclass
from typing import Any

from dlhpc.config.schema import HParam, SearcherConfig
from dlhpc.errors import DlhpcError, UsageError
from dlhpc.search._space import _bounds, _int_bounds, _log_base, _plain, _pow, _vals
from dlhpc.search.base import BaseSearcher, Create, Operation

__all__ = ["MAX_INITIAL_POINTS", "BayesSearcher", "initial_points"]

#: Random (space-filling) trials before the Gaussian process proposes any, at most.
MAX_INITIAL_POINTS = 10


def initial_points(max_trials: int) -> int:
    """The random trials before the GP proposes: a third of ``max_trials`` (rounded up),
    at most :data:`MAX_INITIAL_POINTS`: 1 of 3, 2 of 6, 4 of 10, 7 of 20, 10 from 28 on.
    (skopt's fixed 10 made every search of up to 10 trials a random search.)"""
    return min(MAX_INITIAL_POINTS, max(1, -(-max_trials // 3)))


_INSTALL_HINT = "pip install 'dlhpc[bayes]'"


def _load_skopt() -> tuple[Any, Any, Any]:
    """``(skopt.Optimizer, skopt.space, threadpool_limits)``, or a clear error when unusable."""
    try:
        from skopt import Optimizer
        from skopt import space as skspace
        from threadpoolctl import threadpool_limits  # a dependency of scikit-learn
    except ImportError as exc:
        if exc.name == "skopt":
            raise UsageError(
                f"searcher 'bayes' needs scikit-optimize, which is not installed; "
                f"install it with: {_INSTALL_HINT}"
            ) from exc
        raise DlhpcError(
            f"searcher 'bayes': scikit-optimize is installed but fails to import "
            f"({type(exc).__name__}: {exc}); reinstall it with: {_INSTALL_HINT}"
        ) from exc
    except Exception as exc:  # archived upstream: a future numpy may break its import
        raise DlhpcError(
            f"searcher 'bayes': scikit-optimize is installed but fails to import "
            f"({type(exc).__name__}: {exc}); reinstall it with: {_INSTALL_HINT}"
        ) from exc
    return Optimizer, skspace, threadpool_limits


@dataclass(frozen=True)
class _Dim:
    """One free hyperparameter. ``kind``: int, real, log or cat (index into ``vals``)."""

    name: str
    kind: str
    lo: float = 0.0  # int: ints; log: the values base**minval and base**maxval
    hi: float = 0.0
    base: float = 10.0
    vals: tuple[Any, ...] = ()

    def signature(self) -> list[Any]:
        return [self.name, self.kind, self.lo, self.hi, len(self.vals)]


def _plan(space: dict[str, HParam]) -> tuple[dict[str, Any], list[_Dim]]:
    """The fixed values and the dimensions of ``space``, both in sorted name order."""
    fixed: dict[str, Any] = {}
    dims: list[_Dim] = []
    for name in sorted(space):
        hp = space[name]
        if hp.type == "const":
            fixed[name] = hp.value
        elif hp.type == "categorical":
            vals = _vals(hp)
            if len(vals) == 1:
                fixed[name] = vals[0]
            else:
                dims.append(_Dim(name, "cat", 0, len(vals) - 1, vals=vals))
        elif hp.type == "int":
            lo_i, hi_i = _int_bounds(hp)
            if lo_i == hi_i:
                fixed[name] = lo_i
            else:
                dims.append(_Dim(name, "int", lo_i, hi_i))
        elif hp.type == "double":
            lo, hi = _bounds(hp)
            if lo == hi:
                fixed[name] = lo
            else:
                dims.append(_Dim(name, "real", lo, hi))
        elif hp.type == "log":
            lo, hi = _bounds(hp)
            base = _log_base(hp)
            a, b = sorted((_pow(base, lo, lo, hi), _pow(base, hi, lo, hi)))
            if not a > 0:
                raise ValueError(f"hyperparameter {name!r}: base ** minval underflows to 0")
            if a == b:
                fixed[name] = a
            else:
                # A log-uniform prior does not depend on the base; skopt wants base > 1.
                dims.append(_Dim(name, "log", a, b, base=base if base > 1 else 1 / base))
        else:
            raise ValueError(f"hyperparameter {name!r}: unknown type {hp.type!r}")
    return fixed, dims


def _skopt_dimensions(dims: list[_Dim], skspace: Any) -> list[Any]:
    out: list[Any] = []
    for d in dims:
        if d.kind == "int":
            out.append(skspace.Integer(int(d.lo), int(d.hi), name=d.name))
        elif d.kind == "real":
            out.append(skspace.Real(d.lo, d.hi, name=d.name))
        elif d.kind == "log":
            out.append(skspace.Real(d.lo, d.hi, prior="log-uniform", base=d.base, name=d.name))
        else:
            out.append(skspace.Categorical(list(range(len(d.vals))), name=d.name))
    return out


def _finite(metric: float) -> float | None:
    """``metric`` as a float, ``None`` for NaN and infinities (a failed value)."""
    value = float(metric)
    return value if math.isfinite(value) else None


class BayesSearcher(BaseSearcher):
    """Gaussian-process Bayesian optimisation over ``space`` (scikit-optimize).

    Creates ``max_trials`` trials, each training to ``max_length`` (no early
    stopping). The first :func:`initial_points` trials are random (skopt's
    ``n_initial_points``: a third of ``max_trials``, at most 10); once that many
    results and lies are known, a GP (``base_estimator="GP"``,
    skopt's default ``gp_hedge`` acquisition, refit per proposal) proposes.

    ``ask(max_new)`` proposes ``min(max_new, max_trials - created)`` trials at
    once by the constant liar with the minimum as the lie (skopt's
    ``cl_min``); trials still running are told the same lie (the best result
    so far, 0 before any), so later batches avoid them too. Metrics are
    negated when ``smaller_is_better`` is false, so skopt always minimises and
    ``cl_min`` lies with the best value, as intended.

    Results: only a ``tell`` at ``length >= max_length`` is a trial's result;
    earlier points are kept as its latest value. A trial that exits without a
    result (stopped, failed, killed) contributes its latest value if it
    reported one, else nothing. NaN or infinite values count as the worst
    finite result known at the next ask (skipped while there is none).
    Tells after a trial's result or exit are ignored.
    """

    kind = "bayes"
    learns = True

    def __init__(self, space: dict[str, HParam], config: SearcherConfig) -> None:
        super().__init__(space, config)
        self._optimizer_cls, self._skspace, self._threadpool_limits = _load_skopt()
        if config.max_trials < 1:
            raise ValueError(f"bayes search: max_trials must be >= 1, got {config.max_trials}")
        if config.max_length < 1:
            raise ValueError(f"bayes search: max_length must be >= 1, got {config.max_length}")
        self._fixed, self._dims = _plan(space)
        self.n_initial_points = initial_points(config.max_trials)
        self._points: list[list[Any]] = []  # request id -> point (skopt coordinates)
        self._results: dict[int, float | None] = {}  # the value told to skopt (None: failed)
        self._latest: dict[int, float | None] = {}  # running trials without a result yet
        self._exited: set[int] = set()

    @property
    def created(self) -> int:
        """How many trials were created so far (the next request id)."""
        return len(self._points)

    @property
    def results(self) -> dict[int, float | None]:
        """Each trial's result as given (``None``: NaN/inf), by request id (a copy)."""
        return dict(self._results)

    # -- ask ------------------------------------------------------------------

    def ask(self, max_new: int) -> list[Operation]:
        if isinstance(max_new, bool) or not isinstance(max_new, int) or max_new < 0:
            raise ValueError(f"ask(): max_new must be an int >= 0, got {max_new!r}")
        n = min(max_new, self.config.max_trials - self.created)
        if n <= 0:
            return []
        points = self._propose(n) if self._dims else [[] for _ in range(n)]
        ops: list[Operation] = []
        for point in points:
            ops.append(Create(self.created, self._hparams(point), self.config.max_length))
            self._points.append(point)
        return ops

    def _random_state(self) -> int:
        key = f"dlhpc.bayes:{self.config.seed}:{self.created}".encode()
        return int.from_bytes(hashlib.sha256(key).digest()[:4], "big")

    def _observations(self) -> tuple[list[list[Any]], list[float]]:
        """Points and values to tell skopt: results (minimised), then running-trial lies."""
        sign = 1.0 if self.config.smaller_is_better else -1.0
        finite = [sign * v for v in self._results.values() if v is not None]
        worst = max(finite) if finite else None
        xs: list[list[Any]] = []
        ys: list[float] = []
        for rid in sorted(self._results):
            value = self._results[rid]
            y = sign * value if value is not None else worst
            if y is not None:
                xs.append(self._points[rid])
                ys.append(y)
        lie = min(ys) if ys else 0.0
        for rid in range(self.created):
            if rid not in self._results and rid not in self._exited:
                xs.append(self._points[rid])
                ys.append(lie)
        return xs, ys

    def _propose(self, n: int) -> list[list[Any]]:
        """``n`` points by constant liar, as skopt's ``ask(n, strategy="cl_min")`` does.

        The loop is written out rather than calling skopt's batch ask: that one
        refits a copy of the optimizer first and fits once more after its last
        lie, two wasted GP fits per call (a fit costs about 0.5 s).
        """
        opt = self._optimizer_cls(
            _skopt_dimensions(self._dims, self._skspace),
            base_estimator="GP",
            n_initial_points=self.n_initial_points,
            random_state=self._random_state(),
        )
        xs, ys = self._observations()
        points: list[list[Any]] = []
        # One BLAS thread: the matrices are tiny, and several threads on a busy login
        # node make a fit slower, not faster.
        with warnings.catch_warnings(), self._threadpool_limits(limits=1):
            # GP convergence and "point evaluated before" warnings: noise for a searcher.
            warnings.simplefilter("ignore")
            if xs:
                opt.tell(xs, ys)
            for i in range(n):
                point = self._plain_point(opt.ask())
                points.append(point)
                if i < n - 1:
                    opt.tell(point, min(opt.yi) if opt.yi else 0.0)  # the CL-min lie
        return points

    def _plain_point(self, point: Any) -> list[Any]:
        """``point`` with numpy scalars turned into ``int``/``float``."""
        return [
            int(v) if d.kind in ("int", "cat") else float(v)
            for d, v in zip(self._dims, point, strict=True)
        ]

    def _hparams(self, point: list[Any]) -> dict[str, Any]:
        out = {name: _plain(value) for name, value in self._fixed.items()}
        for d, v in zip(self._dims, point, strict=True):
            if d.kind == "int":
                out[d.name] = int(v)
            elif d.kind == "cat":
                out[d.name] = _plain(d.vals[int(v)])
            else:
                out[d.name] = min(max(float(v), d.lo), d.hi)
        return {name: out[name] for name in sorted(out)}

    # -- tell -----------------------------------------------------------------

    def _check_created(self, request_id: int) -> None:
        if not 0 <= request_id < self.created:
            raise ValueError(f"bayes searcher: request {request_id} was never created")

    def tell(self, request_id: int, length: int, metric: float) -> None:
        self._check_created(request_id)
        if request_id in self._results or request_id in self._exited:
            return
        value = _finite(metric)
        if length >= self.config.max_length:
            self._results[request_id] = value
            self._latest.pop(request_id, None)
        else:
            self._latest[request_id] = value

    def tell_exited(self, request_id: int) -> None:
        self._check_created(request_id)
        if request_id in self._exited:
            return
        self._exited.add(request_id)
        if request_id not in self._results and request_id in self._latest:
            self._results[request_id] = self._latest[request_id]
        self._latest.pop(request_id, None)

    @property
    def done(self) -> bool:
        return self.created >= self.config.max_trials and len(self._exited) == self.created

    # -- state ----------------------------------------------------------------

    def _signature(self) -> list[list[Any]]:
        return [d.signature() for d in self._dims]

    def state_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "max_trials": self.config.max_trials,
            "space": self._signature(),
            "points": [list(p) for p in self._points],
            "results": [[rid, v] for rid, v in sorted(self._results.items())],
            "latest": [[rid, v] for rid, v in sorted(self._latest.items())],
            "exited": sorted(self._exited),
            "n_initial_points": self.n_initial_points,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != self.kind:
            raise ValueError(f"bayes searcher: cannot load state of kind {state.get('kind')!r}")
        if state.get("max_trials") != self.config.max_trials:
            raise ValueError(
                f"bayes searcher: state is for {state.get('max_trials')} trials, "
                f"this search has {self.config.max_trials}"
            )
        if state.get("space") != self._signature():
            raise ValueError("bayes searcher: state is for another space (did the space change?)")
        points = [self._plain_point(p) for p in state["points"] if len(p) == len(self._dims)]
        if len(points) != len(state["points"]) or len(points) > self.config.max_trials:
            raise ValueError("bayes searcher: bad points in state")

        def values(key: str) -> dict[int, float | None]:
            return {int(rid): None if v is None else float(v) for rid, v in state[key]}

        results, latest = values("results"), values("latest")
        exited = {int(rid) for rid in state["exited"]}
        if any(not 0 <= rid < len(points) for rid in (*results, *latest, *exited)):
            raise ValueError("bayes searcher: state names a request never created")
        initial = int(state["n_initial_points"])
        if not 1 <= initial <= MAX_INITIAL_POINTS:
            raise ValueError("bayes searcher: bad n_initial_points in state")
        self._points, self._results, self._latest, self._exited = points, results, latest, exited
        self.n_initial_points = initial
