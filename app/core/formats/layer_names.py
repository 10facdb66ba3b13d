"""A transformer's layers named in its original layout (the names a transformer file holds, and
the modules of a host that builds the model from them, as ComfyUI does) and in diffusers' (the
names HalfSafe's own model has), both ways, from the layout's key table (`layouts.Row`): so
that a layer a fix keeps wider in one is kept wider in the other.

A layer is a module holding weights itself (a linear layer, a norm): it is the layers the table
maps its weights to. A fused layer (a query, key and value projection in one) is all of its
parts; one part is the whole fused layer, which computes the other parts too. Any other module
(an attention, a feed-forward, a block) computes more than its layers: the code between them,
which the table does not map. It is its counterpart where the other layout has a module of
exactly its weights, made of several layers and not a plain list of them (a feed-forward);
else the block of the model's main stack holding its weights (a block computes the same
thing in both layouts: hidden states in, hidden states out), else the whole model (`WHOLE`).
What is kept wider in the other layout is then never less than what was named, and may be
more (`Mapped.widened`): a verified island set with more beside it, all in fp32, computes no
value further from fp32; in bf16 it may (bf16 keeps fewer digits than the fp16 it replaces).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from app.core.formats.layouts import Row

WHOLE = ""  # the whole model: what a module maps to when no block holds it


@dataclass(frozen=True)
class Mapped:
    """The modules of the other layout that compute what one module did, and whether they
    compute more than it (they then hold other layers or code beside it)."""

    paths: tuple[str, ...]
    widened: bool


class _Side:
    """One layout's weights: where each is held, and what the other layout calls it."""

    def __init__(self, into: dict[str, tuple[str, ...]]):
        self.into = into  # weight -> the other layout's weights it maps to

    def weights_under(self, path: str) -> frozenset[str]:
        if path == WHOLE:
            return frozenset(self.into)
        return frozenset(w for w in self.into if w.startswith(path + "."))

    def is_list(self, path: str) -> bool:
        """Whether the module at `path` is a plain list of modules (each child numbered): its
        host calls the children, never the list."""
        depth = path.count(".") + 1 if path else 0
        children = {w.split(".")[depth] for w in self.weights_under(path)}
        return all(c.isdigit() for c in children)


def _owner(weight: str) -> str:
    return weight.rpartition(".")[0]


def _common(paths: Iterable[str]) -> str:
    """The innermost module holding every one of `paths`."""
    split = [p.split(".") if p else [] for p in paths]
    common: list[str] = []
    for parts in zip(*split, strict=False):
        if any(p != parts[0] for p in parts):
            break
        common.append(parts[0])
    return ".".join(common)


def _block(path: str) -> str:
    """The block of the model's main stack that holds `path` (a numbered child of a top-level
    list: `blocks.3`), or WHOLE when none does."""
    parts = path.split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 and parts[1].isdigit() else WHOLE


class LayerNames:
    """One transformer's module names in its original layout and in diffusers', from its
    layout's key table."""

    def __init__(self, rows: Iterable[Row]):
        forward: dict[str, tuple[str, ...]] = {}
        back: dict[str, tuple[str, ...]] = {}
        for original, names, _how in rows:
            forward[original] = tuple(names)
            for name in names:
                back[name] = (*back.get(name, ()), original)
        self._original = _Side(forward)
        self._diffusers = _Side(back)

    @property
    def original_layers(self) -> frozenset[str]:
        """Every layer the table names in the original layout (a host's modules are these
        where it builds the model in that layout, whatever it names their weights)."""
        return frozenset(_owner(w) for w in self._original.weights_under(WHOLE))

    def to_diffusers(self, path: str) -> Mapped | None:
        """The diffusers modules computing what the original layout's `path` does (None where
        the table maps no weight under it)."""
        return _mapped(path, self._original, self._diffusers)

    def to_original(self, path: str) -> Mapped | None:
        """The original layout's modules computing what the diffusers module `path` does (None
        where the table maps no weight under it)."""
        return _mapped(path, self._diffusers, self._original)


def _mapped(path: str, here: _Side, there: _Side) -> Mapped | None:
    own = here.weights_under(path)
    if not own:
        return None
    image = frozenset(w for weight in own for w in here.into[weight])
    layers = {_owner(w) for w in image}
    layer = {_owner(w) for w in own} == {path}  # a layer is the layers its weights are
    paths = tuple(sorted(layers)) if layer else (_counterpart(own, image, layers, there),)
    held = frozenset(w for p in paths for w in there.weights_under(p))
    covered = frozenset(w for weight in held for w in there.into[weight])
    return Mapped(paths, widened=covered != own)


def _counterpart(own, image, layers, there: _Side) -> str:
    """The module of the other layout that computes what a module of more than a layer does
    (`own`: its weights, `image`: theirs in the other layout, `layers`: the layers holding
    them there)."""
    common = _common(layers)
    if len(layers) >= 2 and len({_owner(w) for w in own}) >= 2:
        parts = common.split(".") if common else []
        for end in range(len(parts), -1, -1):  # from the innermost holding all of them out
            candidate = ".".join(parts[:end])
            held = there.weights_under(candidate)
            if held != image:
                break  # an outer module holds more: none further out is exact
            back = frozenset(w for weight in held for w in there.into[weight])
            if back == own and not there.is_list(candidate):
                return candidate
    return _block(common)
