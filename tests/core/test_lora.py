"""LoRAs: reading kohya and PEFT files safely, applying them, recording them, the prompt's
`<lora:name:weight>` tags, and a hostile or damaged LoRA file getting one sentence."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from app.cli import main
from app.core.errors import BadFileError, HalfSafeError, PickleRefusedError, WrongPartError
from app.core.health.request import CheckRequest, CheckRun
from app.core.lora import files as lora
from app.core.words.infotext import split_text
from tests.support.lora_files import RANK, TE_LAYERS, UNET_LAYERS, kohya_lora, linears, save_lora
from tests.support.tiny_models import build_tiny_sd_pipeline


def peft_lora(pipeline, *, scale: float = 0.3, seed: int = 1):
    """The same kind of LoRA in the diffusers/PEFT layout: `unet.<path>.lora_A.weight`,
    `unet.<path>.lora_B.weight`, `text_encoder.<path>.lora_A.weight`."""
    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for prefix, module, endings in (
        ("unet", pipeline.unet, UNET_LAYERS),
        ("text_encoder", pipeline.text_encoder, TE_LAYERS),
    ):
        for name, layer in linears(module, endings):
            tensors[f"{prefix}.{name}.lora_A.weight"] = torch.randn(
                RANK, layer.in_features, generator=generator
            )
            tensors[f"{prefix}.{name}.lora_B.weight"] = (
                torch.randn(layer.out_features, RANK, generator=generator) * scale
            )
    return tensors


def unet_and_text_outputs(pipeline):
    """The UNet's noise prediction and the text encoder's hidden states for fixed inputs."""
    generator = torch.Generator().manual_seed(3)
    tokens = pipeline.tokenizer(
        ["a red square"], padding="max_length", max_length=16, truncation=True, return_tensors="pt"
    ).input_ids
    with torch.inference_mode():
        hidden = pipeline.text_encoder(tokens).last_hidden_state
        sample = torch.randn(1, pipeline.unet.config.in_channels, 8, 8, generator=generator)
        noise = pipeline.unet(sample, 500, encoder_hidden_states=hidden).sample
    return noise, hidden


@pytest.mark.parametrize("layout", ["kohya", "peft"])
def test_lora_files_of_both_layouts_load_and_change_the_output(tmp_path, layout):
    pipeline = build_tiny_sd_pipeline()
    before_noise, before_hidden = unet_and_text_outputs(pipeline)
    build = kohya_lora if layout == "kohya" else peft_lora
    path = save_lora(build(pipeline), tmp_path / f"style_{layout}.safetensors")

    file = lora.read_lora(path)
    assert file.layout == ("kohya" if layout == "kohya" else "diffusers")
    assert file.non_finite == [] and file.problems() is None
    applied = lora.apply_loras(pipeline, [(file, 0.8)])
    noise, hidden = unet_and_text_outputs(pipeline)

    assert applied[0].name == f"style_{layout}" and applied[0].weight == 0.8
    assert not torch.allclose(noise, before_noise, atol=1e-4)  # the UNet part took effect
    assert not torch.allclose(hidden, before_hidden, atol=1e-4)  # and the text-encoder part
    # Off again: the model's own output, exactly (the LoRA is an adapter, never merged).
    lora.use_weights(pipeline, [])
    off_noise, off_hidden = unet_and_text_outputs(pipeline)
    assert torch.equal(off_noise, before_noise) and torch.equal(off_hidden, before_hidden)
    # The weight is a real knob: half the weight, a different output.
    lora.use_weights(pipeline, applied, {applied[0].adapter: 0.4})
    half_noise, _ = unet_and_text_outputs(pipeline)
    assert not torch.allclose(half_noise, noise, atol=1e-4)


def test_weight_scan_names_nan_and_absurd_tensors(tmp_path):
    pipeline = build_tiny_sd_pipeline()
    tensors = kohya_lora(pipeline)
    keys = sorted(k for k in tensors if k.endswith("lora_up.weight"))
    tensors[keys[0]][0, 0] = float("nan")
    tensors[keys[1]][1, 1] = 5e6
    file = lora.read_lora(save_lora(tensors, tmp_path / "damaged.safetensors"))

    assert file.non_finite == [keys[0]]
    assert [name for name, _ in file.absurd] == [keys[1]]
    assert file.problems() is not None and keys[0] in file.problems()
    file.non_finite = []
    assert keys[1] in (file.problems() or "") and "5e+06" in (file.problems() or "")


def test_lora_argument_and_prompt_tags():
    assert lora.parse_lora_argument("a/b.safetensors:0.6") == lora.LoraRequest(
        "a/b.safetensors", 0.6
    )
    assert lora.parse_lora_argument("a/b.safetensors") == lora.LoraRequest("a/b.safetensors", 1.0)
    assert lora.parse_lora_argument(r"C:\loras\x.safetensors").path == r"C:\loras\x.safetensors"
    with pytest.raises(ValueError, match="between"):
        lora.parse_lora_argument("x.safetensors:1e9")

    text, found = lora.prompt_loras("a cat <lora:ink:0.7>, <lora:grain> sunset")
    assert text == "a cat ,  sunset"
    assert found == [lora.LoraRequest("ink", 0.7), lora.LoraRequest("grain", 1.0)]
    with pytest.raises(HalfSafeError, match="ink"):
        lora.prompt_loras("<lora:ink:heavy>")


def test_prompt_tag_is_found_in_the_lora_folder_beside_the_model(tmp_path):
    pipeline = build_tiny_sd_pipeline()
    (tmp_path / "Lora").mkdir()
    save_lora(kohya_lora(pipeline), tmp_path / "Lora" / "ink.safetensors")
    model_file = tmp_path / "model.safetensors"
    model_file.write_bytes(b"")
    assert lora.find_lora("ink", str(model_file)) == tmp_path / "Lora" / "ink.safetensors"
    with pytest.raises(HalfSafeError, match="not found"):
        lora.find_lora("nowhere", str(model_file))


def hostile_files(tmp_path: Path) -> dict[str, Path]:
    files = {}
    truncated = tmp_path / "truncated.safetensors"
    good = save_lora({"lora_unet_x.lora_down.weight": torch.ones(4, 4)}, tmp_path / "g.safetensors")
    truncated.write_bytes(good.read_bytes()[:-8])
    files["truncated"] = truncated
    huge = tmp_path / "huge_header.safetensors"
    huge.write_bytes((10**15).to_bytes(8, "little") + b"{}")
    files["huge_header"] = huge
    pickle = tmp_path / "evil.ckpt"
    pickle.write_bytes(b"\x80\x04\x95" + b"cos\nsystem\n(S'echo pwned'\ntR." + b"\x00" * 8)
    files["pickle"] = pickle
    files["not_a_lora"] = save_lora(
        {"model.weight": torch.ones(2, 2)}, tmp_path / "plain.safetensors"
    )
    files["folder"] = tmp_path
    return files


@pytest.mark.parametrize("kind", ["truncated", "huge_header", "pickle", "not_a_lora", "folder"])
def test_a_hostile_lora_file_gets_one_sentence(tmp_path, kind):
    path = hostile_files(tmp_path)[kind]
    with pytest.raises(BadFileError) as raised:
        lora.read_lora(path)
    message = str(raised.value)
    assert str(path) in message or path.name in message
    assert "\n" not in message and len(message) < 300
    if kind == "pickle":
        assert isinstance(raised.value, PickleRefusedError)


def test_cli_refuses_a_hostile_lora_with_one_line_and_exit_2(tmp_path, capsys):
    path = hostile_files(tmp_path)["truncated"]
    status = main(["check", "demo", "--device", "cpu", "--lora", f"{path}:0.5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert len(err) == 1 and path.name in err[0]


def test_a_lora_that_fits_no_layer_of_the_model_gets_one_sentence(tmp_path):
    tensors = {
        "lora_unet_no_such_block_proj.lora_down.weight": torch.ones(4, 8),
        "lora_unet_no_such_block_proj.lora_up.weight": torch.ones(8, 4),
    }
    file = lora.read_lora(save_lora(tensors, tmp_path / "other_model.safetensors"))
    pipeline = build_tiny_sd_pipeline()
    with pytest.raises(BadFileError, match="other_model"):
        lora.apply_loras(pipeline, [(file, 1.0)])
    assert lora._adapters(pipeline) == []  # nothing half-loaded


def test_generate_records_loras_as_a1111_does(tmp_path, capsys):
    from app.core.images.finished import read_parameters
    from app.core.models import load_model

    demo = load_model("demo")
    path = save_lora(kohya_lora(demo.pipeline, scale=0.05), tmp_path / "ink.safetensors")
    status = main(
        [
            "generate",
            "demo",
            "--device",
            "cpu",
            "--steps",
            "2",
            "--prompt",
            "a red circle",
            "--lora",
            f"{path}:0.5",
            "--out",
            str(tmp_path / "out"),
            "--json",
        ]
    )
    result = json.loads(capsys.readouterr().out)
    assert status == 0
    prompt, _, params = split_text(read_parameters(result["images"][0]["path"]) or "")
    assert prompt == "a red circle <lora:ink:0.5>"
    file = lora.read_lora(path)
    assert params["Lora hashes"] == f"ink: {file.short_hash}"


def test_an_sdxl_kohya_lora_with_both_text_encoders_loads_and_changes_the_output():
    from tests.support.tiny_models import build_tiny_sdxl_pipeline

    pipeline = build_tiny_sdxl_pipeline()
    generator = torch.Generator().manual_seed(5)
    tensors: dict[str, torch.Tensor] = {}
    parts = (
        ("lora_unet_", pipeline.unet, UNET_LAYERS),
        ("lora_te1_text_model_", pipeline.text_encoder, TE_LAYERS),
        ("lora_te2_text_model_", pipeline.text_encoder_2, TE_LAYERS),
    )
    for prefix, module, endings in parts:
        for name, layer in linears(module, endings):
            key = prefix + name.removeprefix("text_model.").replace(".", "_")
            tensors[f"{key}.lora_down.weight"] = torch.randn(
                RANK, layer.in_features, generator=generator
            )
            tensors[f"{key}.lora_up.weight"] = (
                torch.randn(layer.out_features, RANK, generator=generator) * 0.3
            )
            tensors[f"{key}.alpha"] = torch.tensor(float(RANK))
    tokens = pipeline.tokenizer_2(
        ["a cat"], padding="max_length", max_length=16, return_tensors="pt"
    ).input_ids

    def second_encoder():
        with torch.inference_mode():
            return pipeline.text_encoder_2(tokens).last_hidden_state

    before = second_encoder()
    file = lora.LoraFile(Path("xl.safetensors"), "xl", "kohya", tensors, [], [], None)
    applied = lora.apply_loras(pipeline, [(file, 1.0)])
    assert applied and not torch.allclose(second_encoder(), before, atol=1e-4)
    assert set(pipeline.get_list_adapters()) == {"unet", "text_encoder", "text_encoder_2"}


def test_a_flux_lora_in_peft_layout_loads_into_the_transformer():
    from tests.support.tiny_models import build_tiny_flux_pipeline

    pipeline = build_tiny_flux_pipeline()
    generator = torch.Generator().manual_seed(6)
    layers = linears(pipeline.transformer, ("attn.to_q", "attn.to_k", "attn.to_v", "ff.net.2"))
    tensors = {}
    for name, layer in layers:
        tensors[f"transformer.{name}.lora_A.weight"] = torch.randn(
            RANK, layer.in_features, generator=generator
        )
        tensors[f"transformer.{name}.lora_B.weight"] = (
            torch.randn(layer.out_features, RANK, generator=generator) * 0.3
        )
    name, layer = layers[0]
    x = torch.randn(2, layer.in_features, generator=generator)
    with torch.inference_mode():
        before = layer(x)
    file = lora.LoraFile(
        Path("flux_style.safetensors"), "flux_style", "diffusers", tensors, [], [], None
    )
    lora.apply_loras(pipeline, [(file, 1.0)])
    with torch.inference_mode():
        after = pipeline.transformer.get_submodule(name)(x)
    assert pipeline.get_list_adapters() == {"transformer": ["lora0_flux_style"]}
    assert not torch.allclose(after, before, atol=1e-4)


def test_the_model_runs_exactly_the_loras_asked_for_flags_and_prompt_tags(tmp_path):
    from tests.support.planted_sd import loaded

    pipeline = build_tiny_sd_pipeline()
    model = loaded(pipeline)
    model.source = str(tmp_path / "model.safetensors")
    (tmp_path / "model.safetensors").write_bytes(b"")
    (tmp_path / "Lora").mkdir()
    save_lora(kohya_lora(pipeline, seed=1), tmp_path / "Lora" / "ink.safetensors")
    grain = save_lora(peft_lora(pipeline, seed=2), tmp_path / "grain.safetensors")
    plain, _ = unet_and_text_outputs(pipeline)

    first = lora.load_requested(model, [lora.LoraRequest(str(grain), 0.5)], prompt="<lora:ink:0.7>")
    assert [(a.name, a.weight) for a in first] == [("grain", 0.5), ("ink", 0.7)]
    both, _ = unet_and_text_outputs(pipeline)

    second = lora.load_requested(model, [], prompt="a cat <lora:ink:0.7>")
    assert [a.name for a in second] == ["ink"] and lora._adapters(pipeline) == [first[1].adapter]
    assert second[0].adapter == first[1].adapter  # reused, not loaded again
    only_ink, _ = unet_and_text_outputs(pipeline)
    assert not torch.allclose(only_ink, both, atol=1e-5)

    assert lora.load_requested(model, [], prompt="a cat") == []
    none, _ = unet_and_text_outputs(pipeline)
    assert torch.equal(none, plain) and lora._adapters(pipeline) == []


def test_the_engine_applies_the_windows_loras_and_prompt_tags(tmp_path):
    """The window's generate job: LoRAs from the job's list and from the prompt's tags, and a
    LoRA that does not load is one sentence with nothing applied."""
    from app.core import paths
    from app.core.generation import GenerationRequest
    from app.core.jobs import CancelToken
    from app.core.lora.files import LoraRequest
    from app.core.models import load_model
    from app.core.requests.records import GenerateRequest
    from app.engine import jobs
    from app.engine.events import JobRequest
    from app.engine.server import JobContext, Session

    session = Session(model=load_model("demo"))
    own_models = paths.data_dir() / "models"  # a library folder: prompt tags resolve there
    own_models.mkdir(parents=True, exist_ok=True)
    ink = save_lora(kohya_lora(session.model.pipeline, scale=0.05), own_models / "ink.safetensors")
    generation = GenerationRequest(
        "a boat", steps=2, width=64, height=64, seed=7, output_dir=str(tmp_path / "out")
    )

    def run(request: GenerateRequest):
        context = JobContext(JobRequest(1, request), session, [].append, CancelToken())
        return jobs.generate(context, request)

    result = run(GenerateRequest(generation, device="cpu", loras=(LoraRequest(str(ink), 0.4),)))
    assert result.images[0].status == "ok"
    assert [(a.name, a.weight) for a in session.model.loras] == [("ink", 0.4)]
    tagged = replace(generation, prompt="a boat <lora:ink:0.6>")
    run(GenerateRequest(tagged, device="cpu"))
    assert [(a.name, a.weight) for a in session.model.loras] == [("ink", 0.6)]
    with pytest.raises(HalfSafeError, match="between"):
        run(GenerateRequest(generation, device="cpu", loras=(LoraRequest(str(ink), 99),)))


def test_a_lora_for_other_layer_sizes_gets_one_sentence_and_leaves_nothing_behind(tmp_path):
    pipeline = build_tiny_sd_pipeline()
    tensors = kohya_lora(pipeline)
    key = next(k for k in tensors if k.startswith("lora_unet") and k.endswith("lora_down.weight"))
    tensors[key] = torch.ones(RANK, tensors[key].shape[1] * 3)  # made for a wider model
    file = lora.read_lora(save_lora(tensors, tmp_path / "sdxl_only.safetensors"))
    before, _ = unet_and_text_outputs(pipeline)
    with pytest.raises(BadFileError) as raised:
        lora.apply_loras(pipeline, [(file, 1.0)])
    assert "sdxl_only" in str(raised.value) and "\n" not in str(raised.value)
    assert lora._adapters(pipeline) == []
    after, _ = unet_and_text_outputs(pipeline)
    assert torch.equal(before, after)


# Layers of the tiny SD pipeline with alphas unlike each other: (component, layer, rank,
# alpha or None). Most share alpha 4, as in a real file, so a layer whose own alpha is lost
# runs at 4 / rank instead; the conv layer is a LoCon one (3x3 down, 1x1 up, its own rank).
MIXED_LAYERS = (
    ("unet", "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q", 4, 1.0),
    ("unet", "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_k", 4, 4.0),
    ("unet", "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_v", 4, 4.0),
    ("unet", "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_out.0", 4, 0.0),
    ("unet", "down_blocks.0.attentions.0.transformer_blocks.0.ff.net.2", 4, None),
    ("unet", "down_blocks.0.resnets.0.conv1", 2, 8.0),
    ("unet", "up_blocks.1.resnets.0.conv2", 4, -2.0),
    ("text_encoder", "encoder.layers.0.self_attn.q_proj", 4, 2.0),
    ("text_encoder", "encoder.layers.0.self_attn.k_proj", 4, 4.0),
    ("text_encoder", "encoder.layers.0.self_attn.v_proj", 4, 4.0),
    ("text_encoder", "encoder.layers.0.self_attn.out_proj", 2, None),
)


def mixed_alpha_lora(pipeline, layout: str) -> tuple[dict, dict]:
    """A LoRA over MIXED_LAYERS in kohya's or the PEFT layout: its tensors, and per layer
    (component, layer) its (down, up, alpha) as the file holds them."""
    generator = torch.Generator().manual_seed(11)
    tensors: dict[str, torch.Tensor] = {}
    factors = {}
    for component, name, rank, alpha in MIXED_LAYERS:
        layer = getattr(pipeline, component).get_submodule(name)
        if isinstance(layer, torch.nn.Conv2d):
            down = torch.randn(rank, layer.in_channels, *layer.kernel_size, generator=generator)
            up = torch.randn(layer.out_channels, rank, 1, 1, generator=generator) * 0.1
        else:
            down = torch.randn(rank, layer.in_features, generator=generator)
            up = torch.randn(layer.out_features, rank, generator=generator) * 0.1
        if layout == "kohya":
            prefix = "lora_unet_" if component == "unet" else "lora_te_text_model_"
            key, down_end, up_end = prefix + name.replace(".", "_"), ".lora_down", ".lora_up"
        else:
            key, down_end, up_end = f"{component}.{name}", ".lora_A", ".lora_B"
        tensors[f"{key}{down_end}.weight"], tensors[f"{key}{up_end}.weight"] = down, up
        if alpha is not None:
            tensors[f"{key}.alpha"] = torch.tensor(alpha)
        factors[(component, name)] = (down, up, alpha)
    return tensors, factors


@pytest.mark.parametrize("layout", ["kohya", "peft"])
def test_each_layer_runs_at_the_weight_times_its_own_alpha_over_rank(tmp_path, layout):
    """As A1111 and ComfyUI apply a LoRA: a layer's change is weight * alpha / rank * up @ down
    with its own alpha (the rank when it has none; 0 switches it off), measured as the wrapped
    layer's output minus the original layer's, against the delta computed from the file."""
    pipeline = build_tiny_sd_pipeline()
    tensors, factors = mixed_alpha_lora(pipeline, layout)
    file = lora.read_lora(save_lora(tensors, tmp_path / f"mixed_{layout}.safetensors"))
    assert file.problems() is None  # a negative or zero alpha is not damage
    (applied,) = lora.apply_loras(pipeline, [(file, 0.7)])
    generator = torch.Generator().manual_seed(12)
    for weight in (0.7, -0.3):  # the weight set at load, then changed as the window does
        lora.use_weights(pipeline, [applied], {applied.adapter: weight})
        for (component, name), (down, up, alpha) in factors.items():
            wrapped = getattr(pipeline, component).get_submodule(name)
            original = wrapped.base_layer
            rank = down.shape[0]
            scale = weight * (rank if alpha is None else alpha) / rank
            delta = scale * (up.flatten(1) @ down.flatten(1))
            if isinstance(original, torch.nn.Conv2d):
                x = torch.randn(1, original.in_channels, 6, 6, generator=generator)
                kernel = delta.reshape(original.weight.shape)
                expected = torch.nn.functional.conv2d(
                    x, kernel, None, original.stride, original.padding
                )
            else:
                x = torch.randn(3, original.in_features, generator=generator)
                expected = x @ delta.T
            with torch.inference_mode():
                change = wrapped(x) - original(x)
            assert torch.allclose(change, expected, rtol=1e-4, atol=1e-5), (name, alpha, weight)
    # The file's own tensors are as read: the fold works on copies.
    assert all(torch.equal(file.tensors[k], v) for k, v in tensors.items())


@pytest.mark.parametrize("alpha", [float("nan"), float("inf"), 1e30, -1e30])
def test_a_damaged_alpha_is_named_and_makes_the_lora_damaged(tmp_path, alpha):
    pipeline = build_tiny_sd_pipeline()
    tensors = kohya_lora(pipeline)
    key = sorted(k for k in tensors if k.endswith(".alpha"))[0]
    tensors[key] = torch.tensor(alpha)
    file = lora.read_lora(save_lora(tensors, tmp_path / "bad_alpha.safetensors"))
    assert file.damaged == [key]
    assert key in (file.problems() or "") and "damaged" in (file.problems() or "")


def test_an_alpha_of_many_numbers_gets_one_sentence(tmp_path):
    pipeline = build_tiny_sd_pipeline()
    tensors = kohya_lora(pipeline)
    key = sorted(k for k in tensors if k.endswith(".alpha"))[0]
    tensors[key] = torch.ones(1000)
    path = save_lora(tensors, tmp_path / "many_alphas.safetensors")
    with pytest.raises(BadFileError, match="many_alphas.*holds 1000 numbers"):
        lora.read_lora(path)


@pytest.mark.parametrize("alpha", ["nan", "1e30"])
def test_check_with_a_lora_whose_one_layer_has_a_damaged_alpha_is_broken(tmp_path, capsys, alpha):
    """The user's report: one layer's alpha NaN (or 1e30) on an attention layer, the others
    at their rank. `check` names the tensor, says broken, exits 1, and proves dropping it."""
    from app.core.models import load_model

    tensors = kohya_lora(load_model("demo").pipeline, scale=0.05)
    key = "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q.alpha"
    assert key in tensors
    tensors[key] = torch.tensor(float(alpha))
    path = save_lora(tensors, tmp_path / "bad_alpha.safetensors")
    status = main(["check", "demo", "--device", "cpu", "--lora", str(path), "--json"])
    report = json.loads(capsys.readouterr().out)

    assert status == 1 and report["verdict"] == "broken" and report["fix"] is None
    assert key in report["headline"] and "drop the LoRA bad_alpha" in report["headline"]
    assert report["cause"]["kind"] == "weights" and report["cause"]["repair"]["verified"]
    listed = report["loras"][0]["non_finite" if alpha == "nan" else "absurd"]
    assert listed == [key]
    assert any(key in note for note in report["notes"])


# Flux files that diffusers converts itself, folding each layer's alpha / rank into its factors:
# (key in the file, the transformer layers it becomes, rank, alpha). A layer becomes several
# when its `up` is split by rows among them (kohya's fused q/k/v).
FLUX_MIXTURE_LAYERS = (
    (
        "lora_transformer_transformer_blocks_0_attn_to_q",
        ("transformer_blocks.0.attn.to_q",),
        4,
        2.0,
    ),
    (
        "lora_transformer_transformer_blocks_0_attn_to_out_0",
        ("transformer_blocks.0.attn.to_out.0",),
        4,
        4.0,
    ),
    (
        "lora_transformer_single_transformer_blocks_1_attn_to_k",
        ("single_transformer_blocks.1.attn.to_k",),
        2,
        8.0,
    ),
    ("lora_transformer_context_embedder", ("context_embedder",), 4, 4.0),
    ("lora_transformer_x_embedder", ("x_embedder",), 4, -1.0),
)
FLUX_KOHYA_LAYERS = (
    ("lora_unet_double_blocks_0_img_attn_proj", ("transformer_blocks.0.attn.to_out.0",), 4, 2.0),
    (
        "lora_unet_double_blocks_0_txt_mlp_0",
        ("transformer_blocks.0.ff_context.net.0.proj",),
        4,
        4.0,
    ),
    (
        "lora_unet_double_blocks_0_img_attn_qkv",
        tuple(f"transformer_blocks.0.attn.to_{p}" for p in "qkv"),
        4,
        1.0,
    ),
    ("lora_unet_single_blocks_1_linear2", ("single_transformer_blocks.1.proj_out",), 2, 8.0),
    ("lora_unet_double_blocks_0_txt_attn_proj", ("transformer_blocks.0.attn.to_add_out",), 4, None),
)


def flux_converted_lora(transformer, layers) -> tuple[dict, dict]:
    """A Flux LoRA over `layers` in kohya's key layout (lora_down, lora_up, alpha): its tensors,
    and per transformer layer its (down, up rows, rank, alpha) as the file gives them."""
    generator = torch.Generator().manual_seed(13)
    tensors: dict[str, torch.Tensor] = {}
    expected = {}
    for key, names, rank, alpha in layers:
        targets = [transformer.get_submodule(name) for name in names]
        down = torch.randn(rank, targets[0].in_features, generator=generator)
        rows = [t.out_features for t in targets]
        up = torch.randn(sum(rows), rank, generator=generator) * 0.1
        tensors[f"{key}.lora_down.weight"], tensors[f"{key}.lora_up.weight"] = down, up
        if alpha is not None:
            tensors[f"{key}.alpha"] = torch.tensor(alpha)
        for name, part in zip(names, torch.split(up, rows), strict=True):
            expected[name] = (down, part, rank, alpha)
    return tensors, expected


@pytest.mark.parametrize(
    "layers", [FLUX_MIXTURE_LAYERS, FLUX_KOHYA_LAYERS], ids=["mixture", "kohya"]
)
def test_a_flux_lora_that_diffusers_converts_runs_each_layer_at_its_own_alpha(tmp_path, layers):
    """diffusers' Flux converters for these layouts fold alpha / rank into the factors
    themselves (the mixture one refuses a layer without its alpha): the file loads, and each
    wrapped layer's change is weight * alpha / rank * up @ down, scaled once."""
    from tests.support.tiny_models import build_tiny_flux_pipeline

    pipeline = build_tiny_flux_pipeline()
    tensors, expected = flux_converted_lora(pipeline.transformer, layers)
    file = lora.read_lora(save_lora(tensors, tmp_path / "flux_layers.safetensors"))
    assert file.problems() is None
    (applied,) = lora.apply_loras(pipeline, [(file, 0.7)])
    generator = torch.Generator().manual_seed(14)
    for weight in (0.7, -0.3):
        lora.use_weights(pipeline, [applied], {applied.adapter: weight})
        for name, (down, up, rank, alpha) in expected.items():
            wrapped = pipeline.transformer.get_submodule(name)
            original = wrapped.base_layer
            x = torch.randn(3, original.in_features, generator=generator)
            scale = weight * (rank if alpha is None else alpha) / rank
            with torch.inference_mode():
                change = wrapped(x) - original(x)
            want = x @ (scale * (up @ down)).T
            assert torch.allclose(change, want, rtol=1e-4, atol=1e-6), (name, alpha, weight)
    assert all(torch.equal(file.tensors[k], v) for k, v in tensors.items())


@pytest.mark.parametrize(
    "layers", [FLUX_MIXTURE_LAYERS, FLUX_KOHYA_LAYERS], ids=["mixture", "kohya"]
)
def test_a_nan_alpha_in_a_converted_flux_lora_is_named_and_runs_non_finite(tmp_path, layers):
    """A NaN alpha in these layouts is damage named by its tensor, and the LoRA still loads
    (not refused as a misfit) so the check can run it, blame it and prove dropping it."""
    from tests.support.tiny_models import build_tiny_flux_pipeline

    pipeline = build_tiny_flux_pipeline()
    tensors, _ = flux_converted_lora(pipeline.transformer, layers)
    key, names, _, _ = layers[0]
    tensors[f"{key}.alpha"] = torch.tensor(float("nan"))
    file = lora.read_lora(save_lora(tensors, tmp_path / "flux_nan_alpha.safetensors"))
    assert file.damaged == [f"{key}.alpha"]
    assert f"{key}.alpha" in (file.problems() or "")
    lora.apply_loras(pipeline, [(file, 1.0)])
    wrapped = pipeline.transformer.get_submodule(names[0])
    with torch.inference_mode():
        out = wrapped(torch.ones(2, wrapped.base_layer.in_features))
    assert not torch.isfinite(out).any()


def test_a_check_with_loras_crosses_to_the_window_as_records(tmp_path):
    """A check run with a LoRA reaches the window: its report names the LoRA by a record
    (name, file, weight, hash), never by the LoRA's tensors, which the frame reader refuses."""
    import io

    from app.core.jobs import CancelToken
    from app.core.lora.files import LoraRequest
    from app.core.models import load_model
    from app.core.requests.records import CheckRequest
    from app.core.settings import PrecisionSettings
    from app.engine import jobs
    from app.engine.events import EngineEvent, EventState, JobRequest, encode, read_message
    from app.engine.server import JobContext, Session

    session = Session(model=load_model("demo"))
    ink = save_lora(kohya_lora(session.model.pipeline, scale=0.05), tmp_path / "ink.safetensors")
    request = CheckRequest(
        PrecisionSettings("fp32"), size=64, steps=2, loras=(LoraRequest(str(ink), 0.4),)
    )
    context = JobContext(JobRequest(1, request), session, [].append, CancelToken())
    result = jobs.check(context, request)

    (lora,) = result.report.loras
    assert (lora.name, lora.weight, lora.path) == ("ink", 0.4, str(ink))
    event = EngineEvent(1, "check", EventState.RESULT, result=result)
    again = read_message(io.BytesIO(encode(event)))
    assert isinstance(again, EngineEvent) and again.result == result
    assert result.report.to_json()["loras"][0]["name"] == "ink"


# --- a LoRA of which the model has only some layers, or none ------------------------------------


def lora_of_41_layers(pipeline, layout: str, fitting: int = 1) -> dict[str, torch.Tensor]:
    """A LoRA of 41 UNet layers in kohya's or the PEFT layout, of which the first `fitting`
    are layers of `pipeline`'s UNet and the rest name layers it does not have (as a LoRA made
    for a model with more blocks does)."""
    generator = torch.Generator().manual_seed(21)
    tensors: dict[str, torch.Tensor] = {}
    real = [name for name, _ in linears(pipeline.unet, UNET_LAYERS)][:fitting]
    names = real + [f"down_blocks.0.attentions.0.extra_blocks.{i}.proj" for i in range(41)]
    for name in names[:41]:
        inner = pipeline.unet.get_submodule(name) if name in real else torch.nn.Linear(8, 8)
        if layout == "kohya":
            key, down_end, up_end = "lora_unet_" + name.replace(".", "_"), "lora_down", "lora_up"
        else:
            key, down_end, up_end = f"unet.{name}", "lora_A", "lora_B"
        tensors[f"{key}.{down_end}.weight"] = torch.randn(
            RANK, inner.in_features, generator=generator
        )
        tensors[f"{key}.{up_end}.weight"] = (
            torch.randn(inner.out_features, RANK, generator=generator) * 0.3
        )
    return tensors


@pytest.mark.parametrize("layout", ["kohya", "peft"])
def test_a_lora_of_which_the_model_has_one_layer_of_41_says_so_and_runs_that_one(tmp_path, layout):
    from tests.support.planted_sd import loaded

    pipeline = build_tiny_sd_pipeline()
    model = loaded(pipeline)
    before, _ = unet_and_text_outputs(pipeline)
    path = save_lora(lora_of_41_layers(pipeline, layout), tmp_path / "bigger.safetensors")

    (applied,) = lora.load_requested(model, [lora.LoraRequest(str(path))])
    assert (applied.layers, applied.layers_applied) == (41, 1)
    assert model.lora_warnings == [applied.fit_note]
    assert applied.fit_note is not None
    assert applied.fit_note.startswith(
        "Only 1 of the 41 layers of the LoRA bigger exist in the Stable Diffusion 1.x model"
    )
    assert "the other 40 were not applied" in applied.fit_note
    after, _ = unet_and_text_outputs(pipeline)
    assert not torch.allclose(after, before, atol=1e-5)  # the one layer that fits runs

    # Asked again, the LoRA is reused and still said; one that fits whole says nothing.
    lora.load_requested(model, [lora.LoraRequest(str(path), 0.5)])
    assert model.lora_warnings == [applied.fit_note]
    whole = save_lora(peft_lora(pipeline), tmp_path / "whole.safetensors")
    (fits,) = lora.load_requested(model, [lora.LoraRequest(str(whole))])
    assert fits.layers == fits.layers_applied and fits.layers_applied
    assert fits.fit_note is None and model.lora_warnings == []


@pytest.mark.parametrize("layout", ["kohya", "peft"])
def test_a_lora_none_of_whose_layers_the_model_has_is_refused_naming_it_and_the_model(
    tmp_path, layout
):
    from tests.support.planted_sd import loaded

    pipeline = build_tiny_sd_pipeline()
    model = replace(loaded(pipeline), source=str(tmp_path / "model.safetensors"))
    before, _ = unet_and_text_outputs(pipeline)
    path = save_lora(lora_of_41_layers(pipeline, layout, 0), tmp_path / "elsewhere.safetensors")
    with pytest.raises(BadFileError) as raised:
        lora.load_requested(model, [lora.LoraRequest(str(path))])
    assert str(raised.value) == (
        f"{path}: none of the LoRA's 41 layers exist in the Stable Diffusion 1.x model "
        "model.safetensors, so it changes nothing (it is made for another model)."
    )
    assert lora._adapters(pipeline) == [] and model.loras == []
    after, _ = unet_and_text_outputs(pipeline)
    assert torch.equal(before, after)


def test_a_lora_whose_unet_layers_the_model_lacks_leaves_no_text_encoder_part_behind(tmp_path):
    pipeline = build_tiny_sd_pipeline()
    tensors = {k: v for k, v in peft_lora(pipeline).items() if k.startswith("unet.")}
    tensors["text_encoder.no_such_layer.lora_A.weight"] = torch.ones(RANK, 8)
    tensors["text_encoder.no_such_layer.lora_B.weight"] = torch.ones(8, RANK)
    file = lora.read_lora(save_lora(tensors, tmp_path / "half.safetensors"))
    with pytest.raises(BadFileError, match="half.safetensors: the LoRA does not fit"):
        lora.apply_loras(pipeline, [(file, 1.0)])
    assert lora._adapters(pipeline) == []  # the UNet part, loaded first, is removed again


def _flux_lora_for(transformer) -> dict[str, torch.Tensor]:
    """A Flux.1 LoRA in the diffusers layout over the attention of every block, double and
    single."""
    generator = torch.Generator().manual_seed(22)
    tensors = {}
    for name, layer in linears(transformer, ("attn.to_q", "attn.to_k", "attn.to_v")):
        tensors[f"transformer.{name}.lora_A.weight"] = torch.randn(
            RANK, layer.in_features, generator=generator
        )
        tensors[f"transformer.{name}.lora_B.weight"] = (
            torch.randn(layer.out_features, RANK, generator=generator) * 0.3
        )
    return tensors


def test_a_flux_lora_on_qwen_image_is_refused_for_its_family_or_says_how_many_layers_apply(
    tmp_path,
):
    """A Flux LoRA over every block's attention: Qwen-Image's double blocks have some of its
    layer names, but its key set (every layer a module of Flux.1's transformer) tells what it
    was made for: refused, the model untouched. A LoRA whose family nothing tells runs with the
    layers that exist, its note saying how many; one that fits none is refused."""
    from tests.support.planted_sd import loaded
    from tests.support.tiny_models import build_tiny_flux_pipeline, build_tiny_qwenimage_pipeline

    flux = _flux_lora_for(build_tiny_flux_pipeline().transformer)
    pipeline = build_tiny_qwenimage_pipeline()
    source = str(tmp_path / "qwen-image.safetensors")
    model = replace(loaded(pipeline), architecture="qwenimage", source=source)
    layers = {key.rsplit(".lora_", 1)[0].removeprefix("transformer.") for key in flux}
    shared = layers & {name for name, _ in pipeline.transformer.named_modules()}
    assert 0 < len(shared) < len(layers)  # the double blocks' attention has Qwen-Image's names

    path = save_lora(flux, tmp_path / "flux_style.safetensors")
    with pytest.raises(WrongPartError) as raised:
        lora.load_requested(model, [lora.LoraRequest(str(path))])
    assert str(raised.value) == (
        f"{path}: this is a LoRA (Flux.1's or Chroma's), but the Qwen-Image model "
        f"qwen-image.safetensors needs a LoRA made for Qwen-Image (only {len(shared)} of its "
        f"{len(layers)} layers exist there)."
    )
    assert lora._adapters(pipeline) == [] and not getattr(model, "loras", [])

    # The single blocks' layers under names no family's transformer has: nothing tells.
    untold = {
        key.replace(".single_transformer_blocks.", ".extra_blocks."): value
        for key, value in flux.items()
    }
    path = save_lora(untold, tmp_path / "untold.safetensors")
    (applied,) = lora.load_requested(model, [lora.LoraRequest(str(path))])
    assert (applied.layers, applied.layers_applied) == (len(layers), len(shared))
    assert model.lora_warnings == [
        f"Only {len(shared)} of the {len(layers)} layers of the LoRA untold exist in the "
        f"Qwen-Image model qwen-image.safetensors: it runs with those, the other "
        f"{len(layers) - len(shared)} were not applied (is it made for another model?)."
    ]
    lora.load_requested(model, [])

    single = {key: value for key, value in flux.items() if ".single_transformer_blocks." in key}
    path = save_lora(single, tmp_path / "flux_single.safetensors")
    with pytest.raises(BadFileError) as raised:
        lora.load_requested(model, [lora.LoraRequest(str(path))])
    assert str(raised.value) == (
        f"{path}: none of the LoRA's {len(single) // 2} layers exist in the Qwen-Image model "
        "qwen-image.safetensors, so it changes nothing (it is made for another model)."
    )
    assert lora._adapters(pipeline) == []


def test_generate_says_how_many_layers_of_a_lora_were_applied_and_refuses_one_that_fits_none(
    tmp_path, capsys
):
    from app.core.models import load_model
    from tests.support.cli_output import without_progress

    pipeline = load_model("demo").pipeline
    some = save_lora(lora_of_41_layers(pipeline, "peft", 2), tmp_path / "some.safetensors")
    none = save_lora(lora_of_41_layers(pipeline, "kohya", 0), tmp_path / "none.safetensors")
    argv = ["generate", "demo", "--device", "cpu", "--steps", "2", "--out", str(tmp_path)]

    assert main([*argv, "--lora", str(some), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert any(
        w.startswith("Only 2 of the 41 layers of the LoRA some exist in")
        for w in result["warnings"]
    )

    assert main([*argv, "--lora", str(none)]) == 2
    err = without_progress(capsys.readouterr().err)
    assert err == (
        f"halfsafe: {none}: none of the LoRA's 41 layers exist in the Stable Diffusion 1.x "
        "model demo, so it changes nothing (it is made for another model).\n"
    )


def test_the_check_says_how_many_layers_of_a_lora_were_applied(tmp_path):
    from app.core.causes import check_and_attribute
    from app.core.settings import PrecisionSettings
    from tests.support.planted_sd import loaded

    pipeline = build_tiny_sd_pipeline()
    model = loaded(pipeline)
    path = save_lora(lora_of_41_layers(pipeline, "peft"), tmp_path / "bigger.safetensors")
    (applied,) = lora.load_requested(model, [lora.LoraRequest(str(path))])
    report = check_and_attribute(
        model,
        CheckRequest(precision=PrecisionSettings(precision="fp32"), device="cpu", size=64),
        run=CheckRun(remember=False, measure_cost=False),
    )
    assert applied.fit_note in report.notes
