"""Run by ComfyUI's Python (not HalfSafe's): HalfSafe Check's text encoder check on a tiny Lens
GPT-OSS text encoder loaded by ComfyUI's own loader (`comfy.sd.load_clip`), and what it said as
one JSON object on the last line.

    python drive_lens_clip.py COMFYUI_FOLDER NODE_PACKAGE_FOLDER WORK_FOLDER

The encoder file is written here as a Lens file is laid out: GPT-OSS's weights (two layers, a
32-wide hidden state, four experts; seeded, norms at one) stored in fp16, with its tokenizer
JSON as the `tokenizer_json` byte tensor. The tokenizer is a word-level one made with the
`tokenizers` library: the Harmony chat template's special tokens and its words. The size is
given to ComfyUI's Lens encoder in its `gpt_oss_config` model option. Lens answers the empty
prompt with zeros and runs no layer; it computes in the dtype its weights are stored in (fp16
here, ComfyUI's default for a text encoder), unlike ComfyUI's other text encoders. Two files:
one as it is, one with a layer's weights scaled so that its output passes fp16's range."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import drive  # beside this file: ComfyUI's start on a CPU, the package loader

PLANTED = "layers.0.self_attn.q_proj"  # in GPT-OSS's own names (the file's keys)
SPECIAL = ["<|start|>", "<|message|>", "<|end|>", "<|channel|>", "<|endoftext|>"]
UNKNOWN = "<|unk|>"
WORDS = "a photo of a cat"  # the words the tokenizer holds besides the template's
TINY = {
    "hidden_size": 32,
    "intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
}


def tokenizer_json(prompt: str) -> str:
    """A word-level tokenizer holding the chat template's special tokens and every word of the
    template rendered around `prompt`; other words are `UNKNOWN`."""
    from comfy.text_encoders.gpt_oss import _lens_render_chat
    from tokenizers import Tokenizer, models, pre_tokenizers

    splitter = pre_tokenizers.Whitespace()
    text = _lens_render_chat(prompt)
    for special in SPECIAL:
        text = text.replace(special, " ")
    words = sorted({w for w, _ in splitter.pre_tokenize_str(text)})
    vocab = {token: i for i, token in enumerate([UNKNOWN, *SPECIAL, *words])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNKNOWN))
    tokenizer.pre_tokenizer = splitter
    tokenizer.add_special_tokens(SPECIAL)
    return tokenizer.to_str()


def gpt_oss_weights(vocab: int, seed: int = 0) -> dict:
    """GPT-OSS's state dict at the tiny size (its own key layout), seeded, in fp32."""
    import torch

    h, inner, e = TINY["hidden_size"], TINY["intermediate_size"], TINY["num_local_experts"]
    q = TINY["num_attention_heads"] * TINY["head_dim"]
    kv = TINY["num_key_value_heads"] * TINY["head_dim"]
    shapes = {"embed_tokens.weight": (vocab, h), "norm.weight": (h,)}
    for i in range(TINY["num_hidden_layers"]):
        at, mlp = f"layers.{i}.self_attn", f"layers.{i}.mlp"
        for proj, (out, into) in {"q": (q, h), "k": (kv, h), "v": (kv, h), "o": (h, q)}.items():
            shapes[f"{at}.{proj}_proj.weight"] = (out, into)
            shapes[f"{at}.{proj}_proj.bias"] = (out,)
        shapes[f"{at}.sinks"] = (TINY["num_attention_heads"],)
        shapes[f"{mlp}.router.weight"] = (e, h)
        shapes[f"{mlp}.router.bias"] = (e,)
        shapes[f"{mlp}.experts.gate_up_proj.weight"] = (e, 2 * inner, h)
        shapes[f"{mlp}.experts.gate_up_proj.bias"] = (e, 2 * inner)
        shapes[f"{mlp}.experts.down_proj.weight"] = (e, h, inner)
        shapes[f"{mlp}.experts.down_proj.bias"] = (e, h)
        shapes[f"layers.{i}.input_layernorm.weight"] = (h,)
        shapes[f"layers.{i}.post_attention_layernorm.weight"] = (h,)
    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape in shapes.items():
        if "norm" in name:
            weights[name] = torch.ones(shape)
        elif name.endswith(("bias", "sinks")):
            weights[name] = torch.zeros(shape)
        else:
            weights[name] = torch.randn(shape, generator=generator) * 0.2
    return weights


def write_encoder(path: Path, tokenizer: str, planted: bool) -> Path:
    """A Lens text encoder file: the weights in fp16 and the tokenizer JSON as bytes."""
    import torch
    from safetensors.torch import save_file

    vocab = len(json.loads(tokenizer)["model"]["vocab"])
    weights = gpt_oss_weights(vocab)
    if planted:  # |q| passes fp16's range (65504) while fp32 holds it: weights ~ 1e4
        weights[f"{PLANTED}.weight"] = weights[f"{PLANTED}.weight"].mul(5e4)
    tensors = {k: v.half().contiguous() for k, v in weights.items()}
    tensors["tokenizer_json"] = torch.tensor(list(tokenizer.encode()), dtype=torch.uint8)
    save_file(tensors, str(path))
    return path


def main() -> None:
    comfy_folder, package_folder, work = (Path(a) for a in sys.argv[1:4])
    drive.start_comfy(comfy_folder)
    import comfy.sd
    import torch
    from comfy.text_encoders.gpt_oss import _lens_render_chat

    package = drive.load_package(package_folder)
    parts = importlib.import_module("comfyui_halfsafe.parts")
    tokenizer = tokenizer_json(WORDS)
    # Lens drops the template's tokens before the prompt from its output: here as many as the
    # word-level tokenizer makes of them.
    before_prompt = _lens_render_chat("\0").split("\0")[0]
    from tokenizers import Tokenizer

    offset = len(Tokenizer.from_str(tokenizer).encode(before_prompt).ids)
    vocab = len(json.loads(tokenizer)["model"]["vocab"])
    options = {
        "gpt_oss_config": {**TINY, "vocab_size": vocab},
        "selected_layers": (0, 1),
        "txt_offset": offset,
    }
    found: dict = {"txt_offset": offset}
    for name, planted in (("sound", False), ("planted", True)):
        path = write_encoder(work / f"lens_{name}.safetensors", tokenizer, planted)
        clip = comfy.sd.load_clip(
            [str(path)], clip_type=comfy.sd.CLIPType.LENS, model_options=options
        )
        encoder = clip.cond_stage_model
        tokens = clip.tokenize(WORDS)
        before = clip.encode_from_tokens(tokens)
        outcome = parts.check_text_encoder(clip)
        after = clip.encode_from_tokens(tokens)
        # As `--fp32-text-enc` loads it: ComfyUI builds the encoder in fp32.
        wide = comfy.sd.load_clip(
            [str(path)],
            clip_type=comfy.sd.CLIPType.LENS,
            model_options={**options, "dtype": torch.float32},
        )
        found[name] = {
            "encoder": type(encoder.gpt_oss).__name__,
            "stored": sorted({str(p.dtype) for p in encoder.parameters()}),
            "empty_tokens": clip.tokenize(""),
            "prompt_tokens": len(tokens["gpt_oss"][0]),
            "output_dtype": str(before.dtype),
            "finite": drive.finite(before),
            "fp32_finite": drive.finite(wide.encode_from_tokens(tokens)),
            "untouched": encoder.gpt_oss.transformer.dtype == torch.float16
            and bool(torch.allclose(before, after, rtol=0, atol=0, equal_nan=True)),
            "verdict": outcome.verdict,
            "lines": outcome.lines,
            "first_bad_layer": outcome.first_bad_layer,
            "fix": outcome.fix,
        }
        if outcome.fix:
            found[name]["fixed"] = fixed(package, clip, outcome.fix, tokens, before, wide, work)
    print(json.dumps(found))


def fixed(package, clip, fix: dict, tokens, before, wide, work: Path) -> dict:
    """HalfSafe Fix with the CLIP connected and the check's text-encoder fix (beside a tiny SD1
    UNet's MODEL, which the fix leaves as it is): its CLIP's encode against the encoder built in
    fp32 as `--fp32-text-enc` builds it; the CLIP passed in encoding as before."""
    import comfy.sd
    import torch

    from app.core.fixing.quality import compare

    model = comfy.sd.load_diffusion_model(str(drive.write_tiny_unet(work / "unet.safetensors")))
    whole = {"islands": {}, "component": None, "summary": fix["summary"], "text_encoder": fix}
    patched_before = sorted(clip.patcher.object_patches)
    _, said, _, patched = package.NODE_CLASS_MAPPINGS["HalfSafeFix"]().fix(model, whole, None, clip)
    output = patched.encode_from_tokens(tokens)
    reference = wide.encode_from_tokens(tokens)
    again = clip.encode_from_tokens(tokens)
    patches = patched.patcher.object_patches
    return {
        "said": said,
        "finite": drive.finite(output),
        "dtype": str(output.dtype),
        "db": compare(output, reference).value,
        "patches": len(patches),
        "copied": any(isinstance(v, (torch.Tensor, torch.nn.Module)) for v in patches.values()),
        "original_patches": [patched_before, sorted(clip.patcher.object_patches)],
        "untouched": bool(torch.allclose(before, again, rtol=0, atol=0, equal_nan=True)),
    }


if __name__ == "__main__":
    main()
