"""The training loops of ``bench_fault.py overhead``: one model and optimizer, stepped bare
or with the harness calls (``ctx.report`` and ``ctx.step`` every step), timed in the ways
the overhead measures need; and the CPU clock of the thread that publishes report()."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any


class _Loop:
    """One training loop; ``block`` runs n steps bare or with the harness calls."""

    def __init__(self, kind: str, ctx: Any) -> None:
        import torch
        from torch import nn

        g = torch.Generator().manual_seed(0)
        self.model: nn.Module
        if kind == "tiny":  # the smallest real step: the harness's cost shows most
            self.model, n, d, classes, self.bs = nn.Linear(4, 2), 256, 4, 2, 4
        else:  # the digits example's model and batch (64 -> 64 -> 10, batch 64, 1437 samples)
            d, classes, self.bs, n = 64, 10, 64, 1437
            self.model = nn.Sequential(
                nn.Linear(d, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, classes)
            )
        self.x = torch.rand(n, d, generator=g)
        self.y = torch.randint(0, classes, (n,), generator=g)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.loss_fn = nn.CrossEntropyLoss()
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(1))
        self.batches = list(torch.split(perm, self.bs))
        self.ctx = ctx
        self.state = ctx.train_state(model=self.model, optimizer=self.opt)
        self.bare = SimpleNamespace(batch=0, step=0)

    def block(self, harness: bool, n: int) -> list[int]:
        """Step times (ns) of n steps; the harness arm adds report() and step() each step."""
        perf, ctx, model, opt, loss_fn = (
            time.perf_counter_ns,
            self.ctx,
            self.model,
            self.opt,
            self.loss_fn,
        )
        x, y, batches = self.x, self.y, self.batches
        st = self.state if harness else self.bare
        times = []
        for _ in range(n):
            t0 = perf()
            i = st.batch % len(batches)
            idx = batches[i]
            opt.zero_grad()
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            value = loss.item()
            st.batch, st.step = i + 1, st.step + 1
            if harness:
                ctx.report(st.step, {"train_loss": value})
                ctx.step(st)
            times.append(perf() - t0)
        return times

    def report_timed(self, n: int) -> dict[str, list[int]]:
        """n harness steps (report() and step() every step) with the report() call
        timed on its own: ns of each step and of each report() call, flush included."""
        perf, ctx, model, opt, loss_fn = (
            time.perf_counter_ns,
            self.ctx,
            self.model,
            self.opt,
            self.loss_fn,
        )
        x, y, batches, st = self.x, self.y, self.batches, self.state
        out: dict[str, list[int]] = {"step": [], "report": []}
        for _ in range(n):
            t0 = perf()
            i = st.batch % len(batches)
            idx = batches[i]
            opt.zero_grad()
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            value = loss.item()
            st.batch, st.step = i + 1, st.step + 1
            r0 = perf()
            ctx.report(st.step, {"train_loss": value})
            r1 = perf()
            ctx.step(st)
            out["step"].append(perf() - t0)
            out["report"].append(r1 - r0)
        return out

    def timed_on_cpu(self, harness: bool, n: int) -> dict[str, list[Any]]:
        """n steps (the harness arm: report() and step() every step): wall ns of each
        (``t``), whether the scheduler preempted this thread during it (``pre``: an
        involuntary context switch, the machine's load, not the code; a wait for the
        disk, a lock or the GIL is voluntary and stays in), and in the harness arm the
        ns of the report() call (``rep``) and whether it handed over or wrote a batch
        (``flush``: the buffer shrank)."""
        import resource

        perf, ctx, model, opt, loss_fn = (
            time.perf_counter_ns,
            self.ctx,
            self.model,
            self.opt,
            self.loss_fn,
        )
        usage, who = resource.getrusage, resource.RUSAGE_THREAD
        x, y, batches = self.x, self.y, self.batches
        st = self.state if harness else self.bare
        buf = ctx._writer  # the context's buffer (old: EventWriter; new: its publisher)
        out: dict[str, list[Any]] = {"t": [], "pre": [], "rep": [], "flush": []}
        for _ in range(n):
            iv0 = usage(who).ru_nivcsw
            t0 = perf()
            i = st.batch % len(batches)
            idx = batches[i]
            opt.zero_grad()
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            value = loss.item()
            st.batch, st.step = i + 1, st.step + 1
            if harness:
                before = buf.pending()
                r0 = perf()
                ctx.report(st.step, {"train_loss": value})
                r1 = perf()
                ctx.step(st)
                out["rep"].append(r1 - r0)
                out["flush"].append(buf.pending() <= before)
            out["t"].append(perf() - t0)
            out["pre"].append(usage(who).ru_nivcsw != iv0)
        return out

    def alternate(self, n: int) -> dict[str, dict[str, list[int]]]:
        """n pairs of steps, bare and harness in turn (finest interleaving): wall and
        thread-CPU ns of each step, per arm."""
        perf, cpu, ctx, model, opt, loss_fn = (
            time.perf_counter_ns,
            time.thread_time_ns,
            self.ctx,
            self.model,
            self.opt,
            self.loss_fn,
        )
        x, y, batches = self.x, self.y, self.batches
        out: dict[str, dict[str, list[int]]] = {
            a: {"wall": [], "cpu": []} for a in ("bare", "harness")
        }
        for k in range(2 * n):
            harness = bool(k % 2)
            st = self.state if harness else self.bare
            t0, c0 = perf(), cpu()
            i = st.batch % len(batches)
            idx = batches[i]
            opt.zero_grad()
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            value = loss.item()
            st.batch, st.step = i + 1, st.step + 1
            if harness:
                ctx.report(st.step, {"train_loss": value})
                ctx.step(st)
            c1, t1 = cpu(), perf()
            arm = out["harness" if harness else "bare"]
            arm["wall"].append(t1 - t0)
            arm["cpu"].append(c1 - c0)
        return out


def _publisher_cpu_ns() -> int:
    """CPU time so far of the thread that publishes report() records off the training
    thread (``dlhpc-events``; 0 with the code before it existed)."""
    import threading

    for t in threading.enumerate():
        if t.name == "dlhpc-events" and t.ident is not None:
            return time.clock_gettime_ns(time.pthread_getcpuclockid(t.ident))
    return 0
