"""Forward hooks, attached in one idiom: a `Hooks` set holds every hook one watcher attaches
(a recorder, a timer, the NaN watch, a guard, a cast, a stream) and removes them together.

Every part of HalfSafe that watches or changes a module's call attaches through here, so that
what runs around a call can be read in one place and nothing is left attached by a watcher
that forgot one handle: `with Hooks() as hooks:` removes them on the way out, an error
included; a watcher that outlives a block (a placed copy's guards) keeps its set and calls
`remove()`."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

Hook = Callable[..., Any]


class Hooks:
    """A set of forward hooks on one or more modules, removed as one.

    `before` runs ahead of a module's forward (torch's pre-hook: `fn(module, args)` or, with
    `kwargs`, `fn(module, args, kwargs)`), `after` once it returned (`fn(module, args, output)`;
    with `always`, also when the forward raised), `around` both, the second always called, for
    a state entered and left with each call (a depth, a dtype, a weight streamed in and out).
    Each returns the handle of what it attached, for a watcher that drops one hook early
    (`drop`) or keeps it on the module for other code to find."""

    def __init__(self) -> None:
        # Keyed by each handle's own id, in the order attached: a hook dropped early leaves
        # the set at once, so a set that lives with a module does not grow with each re-arm.
        self._handles: dict[int, Any] = {}

    def before(self, module, fn: Hook, *, kwargs: bool = False, first: bool = False):
        """`fn` ahead of `module`'s forward; `first`: ahead of the hooks already there."""
        handle = module.register_forward_pre_hook(fn, with_kwargs=kwargs, prepend=first)
        self._handles[handle.id] = handle
        return handle

    def after(self, module, fn: Hook, *, kwargs: bool = False, always: bool = False):
        """`fn` once `module`'s forward returned (with `always`, also when it raised)."""
        handle = module.register_forward_hook(fn, with_kwargs=kwargs, always_call=always)
        self._handles[handle.id] = handle
        return handle

    def around(self, module, enter: Hook, leave: Hook, *, kwargs: bool = False) -> None:
        """`enter` ahead of each call of `module`, `leave` after it, whether or not it raised."""
        self.before(module, enter, kwargs=kwargs)
        self.after(module, leave, kwargs=kwargs, always=True)

    def after_any(self, fn: Hook):
        """`fn(module, args, kwargs, output)` once any module's forward returned, whichever
        module and copy it is (torch's global hook): for a watcher that knows a module's class
        before the copy that will run it exists."""
        import torch

        handle = torch.nn.modules.module.register_module_forward_hook(fn, with_kwargs=True)
        self._handles[handle.id] = handle
        return handle

    def after_each(self, modules: Iterable[Any], fn: Hook) -> None:
        """`fn` after the forward of every module in `modules`."""
        for module in modules:
            self.after(module, fn)

    def drop(self, handle) -> None:
        """Detach the one hook `handle` of the set, the others staying (a second call does
        nothing)."""
        self._handles.pop(handle.id, None)
        handle.remove()

    def remove(self) -> None:
        """Detach every hook of the set (a second call does nothing)."""
        handles, self._handles = self._handles, {}
        for handle in handles.values():
            handle.remove()

    def __len__(self) -> int:
        return len(self._handles)

    def __enter__(self) -> Hooks:
        return self

    def __exit__(self, *_) -> None:
        self.remove()
