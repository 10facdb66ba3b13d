"""Integration tests: a stage runs only the components it placed.

`PlacedPipeline` places one stage's components at a time; a stage that ran another component
would run it as loaded (in its stored dtype, on the CPU), which on a CPU gives no error, only a
wrong answer. Every core test therefore runs with a guard: a component the pipeline twin hands
out without placing it raises the moment any of its layers runs."""

from __future__ import annotations

import pytest


class UnplacedComponentRan(AssertionError):
    pass


@pytest.fixture(autouse=True)
def only_placed_components_run(monkeypatch):
    from app.core.precision import placement

    guarded: list = []
    apply, pipeline, release = (
        placement.PlacedPipeline.apply,
        placement.PlacedPipeline.pipeline,
        placement.PlacedPipeline.release,
    )

    def unguard():
        while guarded:
            guarded.pop().remove()

    def guarded_apply(self, plan, components=None):
        unguard()
        apply(self, plan, components)

    def guarded_release(self):
        unguard()
        release(self)

    def guarded_pipeline(self):
        import torch

        unguard()
        twin = pipeline(self)
        placed = {id(module) for _, module in self._placed.values()}
        for name in getattr(self.source, "components", {}):
            module = getattr(self.source, name, None)
            if not isinstance(module, torch.nn.Module) or id(module) in placed:
                continue

            def refuse(_module, _args, name=name):
                raise UnplacedComponentRan(f"the {name} ran in a stage that did not place it")

            guarded.extend(m.register_forward_pre_hook(refuse) for m in module.modules())
        return twin

    monkeypatch.setattr(placement.PlacedPipeline, "apply", guarded_apply)
    monkeypatch.setattr(placement.PlacedPipeline, "pipeline", guarded_pipeline)
    monkeypatch.setattr(placement.PlacedPipeline, "release", guarded_release)
    yield
    unguard()
