"""Running out of memory anywhere in a job (the check's first probe, its fp32 reference, a fix
candidate, a generation's repair, loading) is one sentence that says which memory ran out,
how much more was asked for and what to try: exit 2 in the command, the same sentence in the
window, and nothing saved or remembered from the half-run job.

The allocator's failure is planted where it would happen on a small card: a placed component
raises torch's own OutOfMemoryError when it runs under the plan the test names (a CUDA
allocator cannot be made to fail on a machine without a GPU).
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import torch

from app.cli import main
from app.core import memory, paths
from app.core.errors import HalfSafeError, OutOfMemoryError
from app.core.precision import PrecisionPlan, placement
from app.engine.failures import describe_exception

CUDA_TEXT = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 5.79 GiB "
    "of which 1.05 GiB is free."
)
CPU_TEXT = (
    "[enforce fail at alloc_cpu.cpp:118] data. DefaultCPUAllocator: not enough memory: you "
    "tried to allocate 17179869184 bytes."
)

Predicate = Callable[[PrecisionPlan, str], bool]


@pytest.fixture
def run_out(monkeypatch):
    """`run_out(predicate)`: from then on a placed component raises CUDA's OutOfMemoryError
    when it runs under a plan for which `predicate(plan, component)` holds."""
    when: list[Predicate] = []
    apply = placement.PlacedPipeline.apply

    def placing(self, plan, components=None):
        apply(self, plan, components)
        for name, (_, module) in self._placed.items():
            if getattr(module, "_test_out_of_memory", False):
                continue
            module._test_out_of_memory = True

            def hook(_module, _args, name=name, placed=self):
                if when and when[0](placed.plan, name):
                    raise torch.OutOfMemoryError(CUDA_TEXT)

            entries = [module] + [
                getattr(module, part)
                for part in ("encoder", "decoder")
                if isinstance(getattr(module, part, None), torch.nn.Module)
            ]
            for entry in entries:
                entry.register_forward_pre_hook(hook)

    monkeypatch.setattr(placement.PlacedPipeline, "apply", placing)
    return when.append


def _first_probe(plan: PrecisionPlan, name: str) -> bool:
    return name == "unet"


def _fp32_reference(plan: PrecisionPlan, name: str) -> bool:
    return name == "vae" and plan.dtypes[name] == "fp32" and not plan.island_count()


def _candidate(plan: PrecisionPlan, name: str) -> bool:
    return name == "vae" and (plan.island_count() > 0 or plan.dtypes[name] != "fp16")


def _nothing_remembered() -> bool:
    saved = paths.data_dir() / "profiles.json"
    if not saved.exists():
        return True
    return not json.loads(saved.read_text())


@pytest.mark.parametrize(
    "where", [_first_probe, _fp32_reference, _candidate], ids=lambda f: f.__name__.strip("_")
)
def test_a_check_that_runs_out_of_memory_is_one_sentence_exit_2_and_remembers_nothing(
    capsys, run_out, where
):
    run_out(where)
    status = main(["check", "demo-overflow", "--precision", "fp16"])
    captured = capsys.readouterr()
    assert status == 2
    # Its last line (before it, the check may have said what it found first).
    assert captured.err.strip().splitlines()[-1:] == [
        "halfsafe: The GPU's memory ran out while checking the model (it asked for 2.00 GiB "
        "more): try a smaller size or fewer images at once, a lower Memory budget "
        "(Settings, or --max-vram) so that large parts stream, or close other programs that "
        "use the GPU; nothing from this job was saved or remembered."
    ]
    assert "Traceback" not in captured.out + captured.err
    assert _nothing_remembered()


def test_the_same_check_without_running_out_remembers_its_fix(capsys):
    # The check above would have remembered a fix: the demo's VAE overflows in fp16.
    assert main(["check", "demo-overflow", "--precision", "fp16"]) == 1
    assert not _nothing_remembered()


def test_a_generation_whose_repair_runs_out_of_memory_saves_and_remembers_nothing(
    capsys, run_out, tmp_path
):
    run_out(_candidate)
    out = tmp_path / "out"
    status = main(
        ["generate", "demo-overflow", "--precision", "fp16", "--steps", "2", "--out", str(out)]
    )
    captured = capsys.readouterr()
    assert status == 2
    assert captured.err.strip().splitlines() == [
        "halfsafe: The GPU's memory ran out while generating (it asked for 2.00 GiB more): "
        "try a smaller size or fewer images at once, a lower Memory budget (Settings, or "
        "--max-vram) so that large parts stream, or close other programs that use the GPU; nothing from this "
        "job was saved or remembered."
    ]
    assert not out.exists() or not any(out.iterdir())
    assert _nothing_remembered()


def test_the_window_shows_the_same_sentence():
    error = OutOfMemoryError(memory.sentence(torch.OutOfMemoryError(CUDA_TEXT), "generating"))
    failure = describe_exception(error, "generate")
    assert failure.message == str(error)
    assert failure.details == ""  # a sentence, not a crash


@pytest.mark.parametrize(
    ("raised", "words"),
    [
        (
            torch.OutOfMemoryError(CUDA_TEXT),
            "The GPU's memory ran out while loading the model (it asked for 2.00 GiB more)",
        ),
        (
            RuntimeError(CPU_TEXT),
            "The computer's memory ran out while loading the model (it asked for 16.00 GiB more)",
        ),
        (
            RuntimeError("MPS backend out of memory (MPS allocated: 7.2 GB)"),
            "The GPU's share of this Mac's memory ran out while loading the model:",
        ),
        (MemoryError(), "The computer's memory ran out while loading the model:"),
    ],
)
def test_each_allocator_is_named_as_the_memory_it_ran_out_of(raised, words):
    with pytest.raises(OutOfMemoryError) as caught, memory.said_as_sentence("loading the model"):
        raise raised
    assert str(caught.value).startswith(words)
    assert isinstance(caught.value, HalfSafeError) and "\n" not in str(caught.value)


def test_other_errors_pass_through_unchanged():
    with (
        pytest.raises(RuntimeError, match="shapes cannot be multiplied"),
        memory.said_as_sentence("generating"),
    ):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")
    inner = OutOfMemoryError("already said")
    with pytest.raises(OutOfMemoryError) as caught, memory.said_as_sentence("generating"):
        raise inner
    assert caught.value is inner
