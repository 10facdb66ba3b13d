"""A fix remembered for a model loaded from several files is also kept, part by part, under the
key of the file each part came from (the key a host that loads that file alone computes:
`identity.file_key`), and a model with no fix of its own takes the parts its files have. On a
tiny Flux.1 transformer file with its text encoders and VAE as ComfyUI keeps them."""

from __future__ import annotations

from app.core import models
from app.core.fixing import profiles
from app.core.models.identity import file_key
from tests.support.model_files import save_split_files
from tests.support.tiny_models import build_tiny_flux_pipeline

DEVICE = "Some GPU"
TRANSFORMER_FIX = {
    "fp32_modules": ["transformer:transformer_blocks.0.attn.to_q", "vae:decoder.conv_out"],
    "text_encoder_2_precision": "fp32",
    "attention_backend": "math",
}


def test_a_transformer_files_share_is_kept_under_its_own_key_both_ways(tmp_path):
    written = save_split_files(build_tiny_flux_pipeline(), tmp_path / "models")
    model = models.load_model(str(written["transformer"]))
    alone, vae_alone = file_key(written["transformer"]), file_key(written["vae"])
    assert alone not in (model.profile_key, vae_alone)

    profiles.remember_fix(
        model.profile_key, DEVICE, TRANSFORMER_FIX, "A fix.", "health check", parts=("transformer",)
    )

    # What a host that loaded the transformer file alone finds: the transformer's share only.
    share = profiles.remembered_fix(alone, DEVICE)
    assert share is not None
    assert share.settings == {
        "fp32_modules": ["transformer:transformer_blocks.0.attn.to_q"],
        "attention_backend": "math",
    }
    vae_share = profiles.remembered_fix(vae_alone, DEVICE)
    assert vae_share is not None
    assert vae_share.settings == {"fp32_modules": ["vae:decoder.conv_out"]}
    assert profiles.remembered_fix(model.profile_key, DEVICE).settings == TRANSFORMER_FIX


def test_a_fix_kept_for_the_transformer_file_alone_is_the_models_where_it_has_none(tmp_path):
    written = save_split_files(build_tiny_flux_pipeline(), tmp_path / "models")
    host_fix = {"unet_precision": "fp32"}  # as HalfSafe Check stores it for the file alone
    profiles.remember_fix(
        file_key(written["transformer"]), DEVICE, host_fix, "Fp32.", "health check"
    )

    model = models.load_model(str(written["transformer"]))

    found = profiles.lookup(model.profile_key, DEVICE).fix
    assert found is not None and found.settings == host_fix and found.summary == "Fp32."
    # The model's own fix, once it has one, comes first.
    profiles.remember_fix(model.profile_key, DEVICE, {"no_half_vae": True}, "Own.", "health check")
    assert profiles.lookup(model.profile_key, DEVICE).fix.settings == {"no_half_vae": True}


def test_forgetting_or_editing_a_models_fix_reaches_its_files_shares(tmp_path):
    """Forget on the Fixes page drops the model's fix and the shares kept under its files'
    keys (before, the model took the shares back as its fix at the next job, though the page
    showed none); an edit rewrites each share from the edited fix. A fix a host stored for a
    file alone is its own: forgetting the model leaves it."""
    written = save_split_files(build_tiny_flux_pipeline(), tmp_path / "models")
    model = models.load_model(str(written["transformer"]))
    alone, vae_alone = file_key(written["transformer"]), file_key(written["vae"])
    parts = ("transformer", "vae")
    profiles.remember_fix(
        model.profile_key, DEVICE, TRANSFORMER_FIX, "A fix.", "health check", parts=parts
    )
    (stored,) = [s for s in profiles.stored_fixes().fixes if s.profile_key == model.profile_key]

    edited = {"fp32_modules": ["transformer:transformer_blocks.0.attn.to_q"]}
    profiles.change_fix(stored, edited, "Edited.")
    assert profiles.remembered_fix(alone, DEVICE).settings == edited
    assert profiles.remembered_fix(vae_alone, DEVICE) is None  # the VAE's share edited out

    profiles.forget_fix(model.profile_key, DEVICE, stored.torch_version)
    assert profiles.remembered_fix(alone, DEVICE) is None
    assert profiles.lookup(model.profile_key, DEVICE).fix is None

    host_fix = {"unet_precision": "fp32"}  # HalfSafe Check's, for the file alone
    profiles.remember_fix(alone, DEVICE, host_fix, "Fp32.", "health check")
    profiles.remember_fix(model.profile_key, DEVICE, {"no_half_vae": True}, "Own.", "health check")
    profiles.forget_fix(model.profile_key, DEVICE, stored.torch_version)
    assert profiles.remembered_fix(alone, DEVICE).settings == host_fix


def test_a_hosts_fix_for_a_file_fills_the_part_the_models_own_fix_lacks(tmp_path):
    """A model whose own fix was proved on its transformer alone still takes the VAE fix a
    host proved for its VAE's file (ComfyUI's VAE loader names that file alone); a part its
    own fix was proved on stays its own (before, any fix of its own hid every file's)."""
    written = save_split_files(build_tiny_flux_pipeline(), tmp_path / "models")
    model = models.load_model(str(written["transformer"]))
    own = {"unet_precision": "bf16"}
    profiles.remember_fix(
        model.profile_key, DEVICE, own, "Own.", "health check", parts=("transformer",)
    )
    vae_fix = {"no_half_vae": True, "fp32_modules": ["vae:decoder.conv_out"]}
    profiles.remember_fix(file_key(written["vae"]), DEVICE, vae_fix, "The VAE.", "health check")
    host_transformer = {"unet_precision": "fp32"}
    profiles.remember_fix(
        file_key(written["transformer"]), DEVICE, host_transformer, "Fp32.", "health check"
    )

    found = profiles.lookup(model.profile_key, DEVICE).fix
    assert found is not None
    assert found.settings == {**own, **vae_fix}  # the transformer's own share stays its own
    assert found.summary == "Own. The VAE." and set(found.parts) == {"transformer", "vae"}
