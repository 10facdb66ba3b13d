"""The window's words: layers a user can follow, and the precision the next job will use."""

from __future__ import annotations

from app.core.components import Status
from app.core.health import headroom_words
from app.ui import words


def test_layer_paths_become_sentences():
    assert words.describe_module("vae", "decoder.up_blocks.2.resnets.1.conv2") == (
        "the second convolution of the second ResNet layer of the third up-sampling block of "
        "the decoder, in the VAE"
    )
    assert words.describe_module("text_encoder", "text_model.encoder.layers.11.mlp.fc2") == (
        "the second linear layer of the MLP of the twelfth layer of the encoder, in the text "
        "encoder"
    )
    assert words.describe_module("unet", "mid_block.attentions.0.transformer_blocks.0.attn1") == (
        "self-attention of the first transformer block of the first attention layer of the "
        "middle block, in the UNet"
    )
    assert words.describe_module("unet", None) == ""


def test_precision_summary_follows_the_users_base_before_the_recommendation():
    cpu = {
        "precision": "fp32",
        "unet_precision": "fp32",
        "vae_precision": "fp32",
        "text_encoder_precision": "fp32",
    }
    assert words.precision_summary({"precision": "fp16"}, cpu) == "fp16 everywhere"
    assert words.precision_summary({"precision": "auto"}, cpu) == "fp32 everywhere"
    assert words.precision_summary(
        {"precision": "fp16", "no_half_vae": True, "upcast_attention": True}
    ) == ("fp16, VAE in fp32, attention upcast to fp32")
    assert words.precision_summary({"precision": "fp16", "no_half": True}) == "fp32 everywhere"
    assert words.precision_summary({"precision": "auto"}) == "auto (decided when a job runs)"


def test_autocast_is_shown_as_fp16_weights_under_autocast():
    assert words.precision_summary({"precision": "autocast"}) == "fp16 everywhere, under autocast"
    assert words.precision_summary({"precision": "autocast", "no_half_vae": True}) == (
        "fp16 under autocast, VAE in fp32"
    )
    assert words.precision_summary({"precision": "autocast", "no_half": True}) == "fp32 everywhere"
    assert "AUTOMATIC1111" in words.setting_value("precision", "autocast")


def test_numbers_read_naturally():
    assert words.big_number(131000.0) == "131,000"
    assert words.big_number(3.4954) == "3.5"
    assert words.big_number(None) == "unknown"
    assert headroom_words(1.6, Status.AT_RISK).startswith("Headroom: only 1.6x")
    # Measured in fp32 at 5.9x fp16's limit: over it, never "below" it.
    over = headroom_words(65504 / 386_000, Status.OK)
    assert over.startswith("No headroom in fp16: values reached 5.9x the fp16 limit")
    assert "below" not in over
    assert words.file_size(6_938_000_000) == "6.5 GB"
    assert words.duration(75) == "1 min 15 s"


def test_prediction_types_are_named_once():
    assert words.prediction_words("v_prediction") == "v-prediction"
    assert words.prediction_words("epsilon") == "epsilon (noise) prediction"
    assert "prediction prediction" not in words.prediction_words("v_prediction")


def test_the_precision_summary_counts_the_layers_a_fix_keeps_wider():
    settings = {
        "precision": "fp16",
        "fp32_modules": ["vae:decoder.a.conv1", "vae:decoder.a.norm2"],
        "bf16_modules": ["unet:mid_block.attentions.0"],
    }
    assert words.precision_summary(settings) == (
        "fp16, with 2 VAE layers in fp32, with 1 UNet layer in bf16"
    )


def test_a_sentence_starts_upper_case_and_keeps_its_names():
    assert words.first_upper("goes NaN") == "Goes NaN"
    assert words.first_upper("quantized (GGUF), stored as fp16") == (
        "Quantized (GGUF), stored as fp16"
    )
    assert words.first_upper("") == ""


def test_a_long_name_may_break_at_its_separators_but_a_number_never():
    from app.ui.words import breakable

    layer = breakable("decoder.up_blocks.0.resnets.0.conv1")
    assert layer.replace("\u200b", "") == "decoder.up_blocks.0.resnets.0.conv1"
    assert layer.count("\u200b") == 6
    for number in ("4.2 dB", "1187.4 (14.7-1201.0)", "8,192 tensors", "rejected: differs"):
        assert breakable(number) == number


def test_a_fix_is_said_short_enough_for_a_table_cell():
    from app.ui.words import fix_short

    assert fix_short({"fp32_modules": ["vae:a", "vae:b", "unet:c"]}) == (
        "Keep 2 VAE layers in fp32; keep 1 UNet layer in fp32"
    )
    assert fix_short({"vae_precision": "fp32"}) == "Run the VAE in fp32"
    assert fix_short({"clamp_modules": ["transformer:x"]}) == (
        "Clamp 1 transformer layer to fp16's range"
    )
    assert fix_short({"no_half": True}) == "Run everything in fp32"
    assert fix_short({"upcast_attention": True}).startswith("Upcast attention")
    assert fix_short({}) == ""


def test_a_fix_names_each_component_by_its_own_words_and_no_switch_as_a_component():
    """A component's precision reads "run the second text encoder in bf16"; a switch whose
    key merely ends in "_precision" (math attention's reduced precision) is no component."""
    from app.ui.words import fix_short

    text = fix_short(
        {
            "text_encoder_2_precision": "bf16",
            "vae_precision": "fp32",
            "attention_reduced_precision": False,
        }
    )
    assert "run the second text encoder in bf16" in text.lower()
    assert "run the vae in fp32" in text.lower()
    assert "in False" not in text and "turn off reduced-precision accumulation" in text.lower()


def test_a_fix_is_said_one_way_by_the_check_the_pages_and_the_state_it_leaves():
    """The check's candidate, the Fixes and Models pages' cell and the precision words of the
    state the fix leaves name the same layers with the same noun phrase."""
    from app.core.fixing.fix_candidates import FixCandidate
    from app.core.precision import PrecisionPlan
    from app.core.precision.words import plan_words
    from app.ui.words import fix_short

    settings = {"fp32_modules": ["vae:decoder.up_blocks.0", "vae:decoder.conv_out"]}
    plan = PrecisionPlan(device="cpu", dtypes={"unet": "fp16", "vae": "fp16"})
    plan = plan.with_modules(
        "vae", dict.fromkeys(["decoder.up_blocks.0", "decoder.conv_out"], "fp32")
    )
    candidate = FixCandidate(plan, settings)
    assert candidate.words == "keep 2 VAE layers in fp32"
    assert fix_short(settings) == "Keep 2 VAE layers in fp32"
    assert plan_words(plan) == "fp16, with 2 VAE layers in fp32"


def test_a_fix_is_said_with_the_denoiser_the_model_has():
    settings = {"unet_precision": "bf16"}
    assert words.fix_short(settings, ("text_encoder", "transformer", "vae")) == (
        "Run the transformer in bf16"
    )
    assert words.fix_short(settings, ("text_encoder", "unet", "vae")) == "Run the UNet in bf16"
