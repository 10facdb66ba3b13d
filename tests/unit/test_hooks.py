"""The one idiom for forward hooks: what a `Hooks` set attaches runs where it says, and leaves
with the set, an error included."""

import pytest
import torch

from app.core.hooks import Hooks


class _Boom(torch.nn.Module):
    def forward(self, x):
        raise RuntimeError("boom")


def test_before_after_and_around_run_in_order_and_leave_together():
    layer = torch.nn.Linear(2, 2)
    seen: list[str] = []
    with Hooks() as hooks:
        hooks.before(layer, lambda m, a: seen.append("before"))
        hooks.before(layer, lambda m, a: seen.append("first"), first=True)
        hooks.after(layer, lambda m, a, o: seen.append(f"after {tuple(o.shape)}"))
        hooks.around(layer, lambda m, a: seen.append("enter"), lambda m, a, o: seen.append("leave"))
        assert len(hooks) == 5
        layer(torch.ones(1, 2))
    assert seen == ["first", "before", "enter", "after (1, 2)", "leave"]
    seen.clear()
    layer(torch.ones(1, 2))
    assert seen == [] and not layer._forward_hooks and not layer._forward_pre_hooks


def test_around_leaves_a_call_that_raised_and_the_set_is_removed_on_error():
    boom = _Boom()
    depth = [0]
    with pytest.raises(RuntimeError, match="boom"), Hooks() as hooks:
        hooks.around(
            boom,
            lambda m, a: depth.__setitem__(0, depth[0] + 1),
            lambda m, a, o: depth.__setitem__(0, depth[0] - 1),
        )
        boom(torch.ones(1))
    assert depth == [0]
    assert not boom._forward_hooks and not boom._forward_pre_hooks


def test_kwargs_hooks_see_keywords_and_a_handle_drops_one_hook():
    layer = torch.nn.Linear(2, 2)
    seen = []
    hooks = Hooks()
    hooks.before(layer, lambda m, a, k: seen.append(sorted(k)), kwargs=True)
    handle = hooks.after(layer, lambda m, a, o: seen.append("after"))
    layer(input=torch.ones(1, 2))
    handle.remove()
    layer(input=torch.ones(1, 2))
    assert seen == [["input"], "after", ["input"]]
    hooks.remove()
    hooks.remove()  # a second removal does nothing
    assert not layer._forward_pre_hooks


def test_a_dropped_hook_leaves_the_set_and_the_others_stay():
    """A watcher that drops one hook at a time (a guard found needless) and arms it again keeps
    a set as large as what is attached, however often it re-arms."""
    layer = torch.nn.Linear(2, 2)
    seen: list[str] = []
    hooks = Hooks()
    hooks.after(layer, lambda m, a, o: seen.append("stays"))
    for _ in range(3):
        handle = hooks.before(layer, lambda m, a: seen.append("dropped"), first=True)
        assert len(hooks) == 2
        hooks.drop(handle)
        hooks.drop(handle)  # a second drop does nothing
        assert len(hooks) == 1
    layer(torch.ones(1, 2))
    assert seen == ["stays"] and not layer._forward_pre_hooks
    hooks.remove()
    assert not layer._forward_hooks


def test_after_any_sees_every_modules_call_with_its_keywords_and_leaves_with_the_set():
    outer = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    seen: list[tuple[str, dict]] = []
    with Hooks() as hooks:
        hooks.after_any(lambda m, a, k, o: seen.append((type(m).__name__, dict(k))))
        outer(torch.ones(1, 2))
        outer[0](input=torch.ones(1, 2))
    assert [name for name, _ in seen] == ["Linear", "ReLU", "Sequential", "Linear"]
    assert list(seen[-1][1]) == ["input"]
    seen.clear()
    outer(torch.ones(1, 2))
    assert seen == []
