"""The unit tests' guard (tests/unit/conftest.py): a model of diffusers or transformers built in
a unit test fails it, naming the class and where the test belongs; a plain torch layer does not."""

from __future__ import annotations

import pytest


def test_a_model_built_in_a_unit_test_fails_it():
    from diffusers import AutoencoderKL

    with pytest.raises(AssertionError, match=r"built diffusers's AutoencoderKL: move it to tests/"):
        AutoencoderKL(block_out_channels=(4,), norm_num_groups=2, latent_channels=2)


def test_a_plain_torch_layer_is_no_model():
    import torch

    assert torch.nn.Linear(2, 2).weight.shape == (2, 2)
