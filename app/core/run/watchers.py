"""What watches a stage as it runs, beside the recorders (`run.probe.ActivationRecorder`):
the timer that counts and times a component's calls, the stop that ends a run at the calls asked
for or at its first non-finite call, and the record a stage leaves (`Stage`). Each attaches
through the stage's own hooks (`stage_run.StageRun.hooks`) and leaves with it."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.core.hooks import Hooks
from app.core.run.probe import ProbeResult


@dataclass
class Stage:
    """What one run of one stage gave: per-component probes, seconds, and the stage's output."""

    probes: dict[str, ProbeResult]
    seconds: dict[str, float]
    output: Any
    cut_short: bool = False  # ended at a non-finite call before its last (its output: None)


class ComponentTimer:
    """Counts a component's forward calls (into the job's `work.Work`, by the dtype the plan
    computes it in) and times them: on a CUDA device by events recorded at the call's
    boundaries, read once when the stage is over (one host sync a stage, where synchronising
    around every call cost two); elsewhere by the wall clock, the device being the host.

    A VAE's stage runs its `decode` or `encode`, never its `forward`: the calls counted are its
    decoder's or encoder's (`counted_module`), and the stage's wall time is its time. Its hooks
    are the stage's (`hooks`), and leave with it."""

    def __init__(
        self,
        hooks: Hooks,
        module,
        device,
        dtype: str,
        name: str,
        recorder: str | None,
        timed: bool,
    ) -> None:
        self._device = device
        self._call = (name, dtype, recorder, timed)
        self._wall = 0.0
        self._start = 0.0
        self._made = 0  # calls made
        self._events: list[tuple[Any, Any]] = []
        hooks.before(module, self._before)
        hooks.after(module, self._after)

    def _before(self, *_):
        from app.core import work

        counting = work.counted()
        if counting is not None:
            name, dtype, recorder, timed = self._call
            counting.call(name, dtype, recorder=recorder, timed=timed)
        self._made += 1
        if self._device.type == "cuda":
            import torch

            began = torch.cuda.Event(enable_timing=True)
            began.record()
            self._events.append((began, None))
        else:
            self._start = time.perf_counter()

    def _after(self, *_):
        if self._device.type == "cuda":
            import torch

            ended = torch.cuda.Event(enable_timing=True)
            ended.record()
            self._events[-1] = (self._events[-1][0], ended)
        else:
            self._wall += time.perf_counter() - self._start

    @property
    def seconds(self) -> float:
        """The calls' time so far, read once a stage: where calls were made this is a host
        sync, counted on every device (on CUDA it waits for the last call to finish)."""
        if not self._made:
            return 0.0
        from app.core import work

        work.add("host_syncs")
        if not self._events:
            return self._wall
        self._events[-1][1].synchronize()
        return sum(b.elapsed_time(e) for b, e in self._events if e is not None) / 1000


class Stop:
    """Ends a stage's run once `module` completed `calls` calls, or (`until_bad`: the calls the
    stage makes) once a call before its last gave non-finite output (read at once: a host sync
    a call), unless `on_bad(done)` is given: that is called instead, once, and the run goes on.
    `on_call(done)` follows each call. Attached to the stage's `hooks` after the recorder's and
    the timer's, so that the last call is recorded and timed; none asked: nothing."""

    class Enough(Exception):
        """The calls asked for are made."""

    def __init__(
        self,
        hooks: Hooks,
        module,
        calls: int | None,
        until_bad: int | None = None,
        on_call: Callable[[int], None] | None = None,
        on_bad: Callable[[int], None] | None = None,
    ) -> None:
        self._calls = calls
        self._until_bad = until_bad if until_bad and until_bad > 1 else None
        self._on_call = on_call
        self._on_bad = on_bad
        self.done = 0
        self.cut_short = False  # ended by a non-finite call before the last
        if calls or self._until_bad or on_call:
            hooks.after(module, self._after)

    def _after(self, module, args, output):
        self.done += 1
        if self._on_call is not None:
            self._on_call(self.done)
        if self._calls and self.done >= self._calls:
            raise Stop.Enough
        if self._until_bad and self.done < self._until_bad and not all_finite(output):
            if self._on_bad is not None:
                self._until_bad = None  # told once; the run goes on
                self._on_bad(self.done)
                return
            self.cut_short = True
            raise Stop.Enough


def counted_module(name: str, module):
    """The module whose forward calls are a component's calls: a VAE's decoder (or, for the
    VAE's encoder, its encoder), since a VAE stage calls `decode`/`encode`, not `forward`."""
    if name == "vae":
        return getattr(module, "decoder", module)
    if name == "vae_encoder":
        return getattr(module, "encoder", module)
    return module


def all_finite(value: Any) -> bool:
    from app.core import work
    from app.core.run.probe import max_abs

    peak = max_abs(value)
    if peak is None:
        return True
    work.add("host_syncs")
    return math.isfinite(float(peak))
