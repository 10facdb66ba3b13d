"""Unit tests: each builds no model. A diffusers or transformers model made here fails the test
at once; a test that needs one belongs in tests/core (the integration tests)."""

from __future__ import annotations

import pytest

# The base classes of diffusers' and transformers' models (their layers and activations, made
# when the libraries are imported, are not models).
MODEL_BASES = ("ModelMixin", "PreTrainedModel")


@pytest.fixture(autouse=True)
def no_model_built(monkeypatch):
    import torch

    made_by_torch = torch.nn.Module.__init__

    def init(self, *args, **kwargs):
        library = type(self).__module__.split(".")[0]
        if any(base.__name__ in MODEL_BASES for base in type(self).__mro__):
            raise AssertionError(
                f"a unit test built {library}'s {type(self).__name__}: move it to tests/core"
            )
        made_by_torch(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "__init__", init)
