"""Train the built-in demo model on drawn scenes: "a red circle on a blue background".

The demo is the tiny SD1.x-shaped pipeline of app/core/demo.py (CLIP text encoder 32 wide, VAE
16-32 channels, UNet 32-64 channels, 128 px). This script draws its training pictures with
Pillow (a circle, square or triangle of one colour on a background of another, from the
vocabulary in app/core/demo.py), then
1. trains the VAE as an autoencoder on 64 px crops of those pictures (it is fully convolutional,
   so it then works at 128 px);
2. trains the decoder alone some more (the encoder frozen), and rounds the VAE through fp16 as
   it ships;
3. trains the UNet with v-prediction (SD 2.x's parameterisation: at high noise its target is the
   picture itself, so it lays out a picture from pure noise) on the VAE's latents (their spread
   gives the scaling factor), and the text encoder with it (no weight decay there, so the
   token embeddings of words never seen stay as initialised). The text encoder starts as the
   randomly initialised tiny CLIP, which puts the captions almost on top of each other: cosine
   distance between two captions' hidden states (all 77 tokens) mean 0.022, nearest 0.002 at the
   default seed; trained with the UNet the mean is 0.70 after 1750 steps. Measured with
   seed 2000 and an earlier, duller purple: kept frozen, the UNet followed 0 of 8 probe prompts
   after 250 steps, trained jointly 3. One caption in ten is dropped to the empty prompt, for
   classifier-free guidance. Every --check-every steps it draws 8 probe prompts with the app's
   defaults (DPM++ 2M Karras, 25 steps, CFG 7, seed 7), logs how many come out in their colours,
   and keeps that state in OUT/after-N-steps (the same files as --unet-steps N writes);
4. writes the three components as fp16 safetensors plus demo.json (scaling factor, prediction
   type, settings) to app/resources/demo/.

Deterministic for a given --seed, torch limited to --threads (default 1) threads. Stages 1 and 2
draw from their own random streams and do not depend on stage 3, so `--vae FILE` starts stage 3
from a VAE they wrote (the shipped vae.safetensors is what they give) with the same result. With
the defaults two runs took 21.5 and 15 minutes on one thread of this project's shared 2-core CPU
with other work running (stages 1 and 2 5 and 3.5 minutes, stage 3 16.5 and 11.5 minutes with
its checks); the second wrote the shipped files byte for byte. Under heavier load the same
stages took 13 and 33 minutes (seed 2000). The shipped weights draw all 90
captions in their colours (the shape's middle and the background, judged as
tests/core/test_demo.py does) at seeds 7 and 8 with the app's defaults; the probe gave 5 of 8
after 250 steps, 8 of 8 after 500 to 1250 and after 1750, 7 of 8 after 1500. The shapes come out
recognisable but soft (a circle may be lumpy, a square's sides pinched).
Usage: python tools/train_demo.py [--out app/resources/demo] [--seed 3000] [--vae FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.core import demo  # noqa: E402
from app.core.encoders.tokenizers import clip_tokenizer  # noqa: E402

SIZE = demo.DEMO_SIZE


def draw_scene(shape: str, colour: str, background: str, rng: np.random.Generator) -> Image.Image:
    """One training picture: the shape roughly centred (a few pixels of jitter), flat colours."""
    image = Image.new("RGB", (SIZE, SIZE), demo.DEMO_COLOURS[background])
    draw = ImageDraw.Draw(image)
    cx, cy = (SIZE / 2 + rng.uniform(-6, 6) for _ in range(2))
    r = rng.uniform(32, 42)  # half the shape's size, px
    fill = demo.DEMO_COLOURS[colour]
    if shape == "circle":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill)
    elif shape == "square":
        s = r * 0.9
        draw.rectangle((cx - s, cy - s, cx + s, cy + s), fill=fill)
    elif shape == "triangle":
        # Equilateral, pointing up, centred on its centroid.
        R = r * 1.2
        points = [
            (cx + R * math.cos(math.radians(a)), cy - R * math.sin(math.radians(a)))
            for a in (90, 210, 330)
        ]
        draw.polygon(points, fill=fill)
    else:
        raise ValueError(shape)
    return image


def captions() -> list[tuple[str, str, str]]:
    return [
        (shape, colour, background)
        for shape in demo.DEMO_SHAPES
        for colour in demo.DEMO_COLOURS
        for background in demo.DEMO_COLOURS
        if colour != background
    ]


def to_tensor(images: list[Image.Image]):
    import torch

    array = np.stack([np.asarray(image, dtype=np.float32) for image in images])
    return torch.from_numpy(array).permute(0, 3, 1, 2) / 127.5 - 1.0


def log(message: str, started: float) -> None:
    print(f"[{time.time() - started:7.1f} s] {message}", flush=True)


def train_vae(args, rng: np.random.Generator, started: float):
    import torch

    vae = demo.demo_vae(args.seed + 1).to(args.device).train()
    optimiser = torch.optim.AdamW(vae.parameters(), lr=args.vae_lr, weight_decay=0.0)
    combos = captions()
    crop = args.vae_crop
    for step in range(args.vae_steps):
        picks = rng.integers(len(combos), size=args.vae_batch)
        crops = []
        for pick in picks:
            scene = draw_scene(*combos[pick], rng)
            x, y = rng.integers(0, SIZE - crop + 1, size=2)
            crops.append(scene.crop((int(x), int(y), int(x) + crop, int(y) + crop)))
        batch = to_tensor(crops).to(args.device)
        posterior = vae.encode(batch).latent_dist
        # A plain autoencoder with a little fixed noise on the latents (so the decoder tolerates
        # the UNet's small errors): sampling with the posterior's own spread, which starts at 1,
        # drowns the latents and trains several times slower.
        noise = torch.randn(posterior.mean.shape, generator=args.generator)
        latents = posterior.mean + args.vae_noise * noise.to(args.device)
        decoded = vae.decode(latents).sample
        reconstruction = (decoded - batch).pow(2).mean()
        kl = posterior.kl().mean() / (crop * crop * 3)
        loss = reconstruction + args.vae_kl * kl
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        if step % 25 == 0 or step == args.vae_steps - 1:
            log(f"vae {step}: mse {reconstruction.item():.5f} kl {kl.item():.3f}", started)
    return vae.eval()


def refine_decoder(vae, args, started: float):
    """More training for the decoder alone, the encoder frozen: the latents the UNet learns
    from do not change, so this stage needs nothing from, and changes nothing in, the UNet's
    stage (it draws from its own random streams)."""
    import torch

    rng = np.random.default_rng(args.seed + 1)
    generator = torch.Generator().manual_seed(args.seed + 1)
    # Start from the VAE as vae-only.safetensors stores it (fp16), so that this stage can also
    # be run alone from that file, alongside the UNet's stage, with the same result.
    with torch.no_grad():
        for tensor in vae.state_dict().values():
            tensor.copy_(tensor.half().float())
    decoder = [*vae.decoder.parameters(), *vae.post_quant_conv.parameters()]
    optimiser = torch.optim.AdamW(decoder, lr=args.vae_lr, weight_decay=0.0)
    combos = captions()
    crop = args.vae_crop
    vae.train()
    for step in range(args.decoder_steps):
        picks = rng.integers(len(combos), size=args.vae_batch)
        crops = []
        for pick in picks:
            scene = draw_scene(*combos[pick], rng)
            x, y = rng.integers(0, SIZE - crop + 1, size=2)
            crops.append(scene.crop((int(x), int(y), int(x) + crop, int(y) + crop)))
        batch = to_tensor(crops).to(args.device)
        with torch.no_grad():
            latents = vae.encode(batch).latent_dist.mean
        noise = torch.randn(latents.shape, generator=generator)
        decoded = vae.decode(latents + args.vae_noise * noise.to(args.device)).sample
        loss = (decoded - batch).pow(2).mean()
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        if step % 25 == 0 or step == args.decoder_steps - 1:
            log(f"decoder {step}: mse {loss.item():.5f}", started)
    return vae.eval()


def scene_latents(vae, args, rng: np.random.Generator):
    """Latents (unscaled means) of `--variants` drawings of every caption."""
    import torch

    combos = captions()
    latents, labels = [], []
    with torch.no_grad():
        for combo_index, combo in enumerate(combos):
            images = [draw_scene(*combo, rng) for _ in range(args.variants)]
            latents.append(vae.encode(to_tensor(images).to(args.device)).latent_dist.mean)
            labels += [combo_index] * args.variants
    return torch.cat(latents), torch.tensor(labels, device=args.device)


def caption_tokens(args):
    """Every caption's token ids, and the empty prompt's (last row), tokenised as the pipeline
    does (padded to 77 tokens)."""
    tokenizer = clip_tokenizer()
    texts = [demo.demo_prompt(*combo) for combo in captions()] + [""]
    return tokenizer(
        texts, padding="max_length", max_length=77, truncation=True, return_tensors="pt"
    ).input_ids.to(args.device)


def caption_distances(text_encoder, tokens) -> tuple[float, float]:
    """The smallest and the mean cosine distance between two captions' hidden states (all 77
    tokens, flattened): how far apart the text encoder puts the prompts."""
    import torch

    with torch.no_grad():
        states = text_encoder(tokens[:-1])[0].flatten(1)
    states = torch.nn.functional.normalize(states, dim=1)
    distances = 1 - states @ states.T
    count = len(states)
    others = distances[~torch.eye(count, dtype=torch.bool, device=distances.device)]
    return float(others.min()), float(others.mean())


def judge(image) -> tuple[str, str]:
    """The palette colours nearest to a picture's middle (24 px) and its four corners (14 px),
    the regions that tests/core/test_demo.py judges."""
    array = np.asarray(image.convert("RGB"), dtype=np.float64)
    half, c = array.shape[0] // 2, 14
    middle = array[half - 12 : half + 12, half - 12 : half + 12].reshape(-1, 3).mean(0)
    corners = (
        np.concatenate([array[:c, :c], array[:c, -c:], array[-c:, :c], array[-c:, -c:]])
        .reshape(-1, 3)
        .mean(0)
    )
    palette = np.asarray(list(demo.DEMO_COLOURS.values()), dtype=np.float64)
    names = list(demo.DEMO_COLOURS)
    nearest = [
        names[int(np.linalg.norm(palette - rgb, axis=1).argmin())] for rgb in (middle, corners)
    ]
    return nearest[0], nearest[1]


def prompts_followed(unet, text_encoder, vae, scaling: float, combos, seed: int = 7) -> int:
    """How many of `combos` the model draws in their colours (shape and background), with the
    app's default sampler (DPM++ 2M Karras), 25 steps and CFG 7."""
    import torch
    from diffusers import StableDiffusionPipeline

    from app.core.families import make_scheduler

    pipeline = StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=clip_tokenizer(),
        unet=unet,
        scheduler=make_scheduler("dpmpp_2m_karras", demo.SD_SCHEDULER_CONFIG, "v_prediction"),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipeline.set_progress_bar_config(disable=True)
    vae.register_to_config(scaling_factor=scaling)
    right = 0
    for shape, colour, background in combos:
        with torch.no_grad():
            image = pipeline(
                demo.demo_prompt(shape, colour, background),
                height=SIZE,
                width=SIZE,
                num_inference_steps=25,
                guidance_scale=7.0,
                generator=torch.Generator().manual_seed(seed),
            ).images[0]  # pyright: ignore[reportAttributeAccessIssue]
        right += judge(image) == (colour, background)
    return right


def train_unet(vae, text_encoder, args, started: float, checkpoint):
    """The UNet, with v-prediction, and the text encoder with it, on the VAE's latents."""
    import copy

    import torch
    from diffusers import DDPMScheduler

    rng = np.random.default_rng(args.seed + 3)
    generator = torch.Generator().manual_seed(args.seed + 3)
    latents, labels = scene_latents(vae, args, rng)
    scaling = round(float(1.0 / latents.std()), 6)  # as demo.json keeps it
    latents = latents * scaling
    log(f"{len(latents)} scene latents, scaling factor {scaling:.4f}", started)
    tokens = caption_tokens(args)
    empty = len(tokens) - 1
    nearest, mean = caption_distances(text_encoder, tokens)
    log(f"captions' cosine distance: nearest {nearest:.4f}, mean {mean:.4f}", started)
    scheduler = DDPMScheduler(
        **{k: v for k, v in demo.SD_SCHEDULER_CONFIG.items() if k != "timestep_spacing"}
    )
    alphas = scheduler.alphas_cumprod.to(args.device)
    unet = demo.demo_unet(args.seed + 3).to(args.device).train()
    text_encoder.train().requires_grad_(args.text_lr > 0)
    average_unet = copy.deepcopy(unet).eval().requires_grad_(False)
    average_text = copy.deepcopy(text_encoder).eval().requires_grad_(False)
    groups = [{"params": list(unet.parameters()), "lr": args.unet_lr, "weight_decay": 1e-4}]
    if args.text_lr > 0:
        # No weight decay: the token embeddings of words never seen stay as initialised.
        groups.append(
            {"params": list(text_encoder.parameters()), "lr": args.text_lr, "weight_decay": 0.0}
        )
    optimiser = torch.optim.AdamW(groups)
    pairs = [
        *zip(average_unet.parameters(), unet.parameters(), strict=True),
        *zip(average_text.parameters(), text_encoder.parameters(), strict=True),
    ]
    combos = captions()
    probe = [combos[int(i)] for i in np.random.default_rng(0).choice(len(combos), 8, replace=False)]
    for step in range(args.unet_steps):
        picks = torch.from_numpy(rng.integers(len(latents), size=args.unet_batch)).to(args.device)
        clean = latents[picks]
        condition = labels[picks].clone()
        dropped = torch.from_numpy(rng.random(args.unet_batch) < args.drop).to(args.device)
        condition[dropped] = empty
        noise = torch.randn(clean.shape, generator=generator).to(args.device)
        timesteps = torch.from_numpy(rng.integers(0, 1000, size=args.unet_batch)).to(args.device)
        a = alphas[timesteps].view(-1, 1, 1, 1)
        noisy = a.sqrt() * clean + (1 - a).sqrt() * noise
        states = text_encoder(tokens[condition])[0]
        predicted = unet(noisy, timesteps, states).sample
        target = a.sqrt() * noise - (1 - a).sqrt() * clean  # v-prediction (SD 2.x's)
        loss = (predicted - target).pow(2).mean()
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        decay = min(args.ema, (1 + step) / (10 + step))
        with torch.no_grad():
            for kept, live in pairs:
                kept.lerp_(live, 1 - decay)
        if step % 50 == 0 or step == args.unet_steps - 1:
            log(f"unet {step}: loss {loss.item():.4f}", started)
        done = step + 1
        if args.check_every and done % args.check_every == 0 and done < args.unet_steps:
            nearest, mean = caption_distances(average_text, tokens)
            right = prompts_followed(average_unet, average_text, vae, scaling, probe)
            log(
                f"unet after {done} steps: {right} of {len(probe)} probe prompts followed; "
                f"captions' cosine distance nearest {nearest:.4f}, mean {mean:.4f}",
                started,
            )
            checkpoint(average_unet, average_text, scaling, done)
    return average_unet, average_text, scaling


def as_shipped(*components) -> None:
    """Round weights through fp16, as the shipped files store them, so that the later stages
    work on exactly what ships (and can be resumed from the files)."""
    import torch

    with torch.no_grad():
        for component in components:
            for tensor in component.state_dict().values():
                tensor.copy_(tensor.half().float())


def save(component, path: Path, metadata: dict[str, str]) -> None:
    from safetensors.torch import save_file

    tensors = {
        name: tensor.detach().to("cpu").half().contiguous()
        for name, tensor in component.state_dict().items()
    }
    save_file(tensors, str(path), metadata=metadata)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "app" / "resources" / "demo")
    parser.add_argument("--seed", type=int, default=demo.DEMO_VERSION * 1000)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--vae",
        type=Path,
        help="start from this VAE file (as stages 1 and 2 wrote it) instead of training one",
    )
    parser.add_argument("--vae-steps", type=int, default=500)
    parser.add_argument("--vae-batch", type=int, default=12)
    parser.add_argument("--vae-crop", type=int, default=64)
    parser.add_argument("--vae-lr", type=float, default=2e-3)
    parser.add_argument("--vae-kl", type=float, default=1e-4)
    parser.add_argument("--vae-noise", type=float, default=0.1)
    parser.add_argument("--decoder-steps", type=int, default=600)
    parser.add_argument("--variants", type=int, default=6)
    parser.add_argument("--unet-steps", type=int, default=2000)
    parser.add_argument("--unet-batch", type=int, default=16)
    parser.add_argument("--unet-lr", type=float, default=2e-3)
    parser.add_argument("--text-lr", type=float, default=1e-3, help="0 keeps it frozen")
    parser.add_argument("--drop", type=float, default=0.1)
    parser.add_argument("--ema", type=float, default=0.99)
    parser.add_argument(
        "--check-every", type=int, default=250, help="UNet steps between checks (0: none)"
    )
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    args.generator = torch.Generator().manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    started = time.time()

    text_encoder = demo.demo_text_encoder(args.seed + 2).to(args.device).eval()
    if args.vae is None:
        vae = train_vae(args, rng, started)
        vae = refine_decoder(vae, args, started)
    else:
        from safetensors.torch import load_file

        vae = demo.demo_vae(args.seed + 1)
        vae.load_state_dict({k: t.float() for k, t in load_file(str(args.vae)).items()})
        vae = vae.to(args.device)
    as_shipped(vae)
    vae.eval().requires_grad_(False)
    settings = {
        key: value
        for key, value in vars(args).items()
        if key not in ("out", "generator", "device", "threads", "check_every", "vae")
    }

    def write(unet, text_encoder, scaling: float, steps: int | None = None) -> None:
        # A check on the way is kept in its own folder: the same as --unet-steps STEPS gives.
        out = args.out if steps is None else args.out / f"after-{steps}-steps"
        out.mkdir(parents=True, exist_ok=True)
        stamp = {"seed": str(args.seed), "made_by": "tools/train_demo.py"}
        save(text_encoder, out / "text_encoder.safetensors", stamp)
        save(vae, out / "vae.safetensors", stamp)
        save(unet, out / "unet.safetensors", stamp)
        summary = {
            "scaling_factor": scaling,
            "prediction_type": "v_prediction",
            "trained_with": {**settings, "unet_steps": steps or args.unet_steps},
        }
        (out / "demo.json").write_text(json.dumps(summary, indent=2) + "\n")
        log(f"saved to {out}", started)

    unet, text_encoder, scaling = train_unet(vae, text_encoder, args, started, write)
    write(unet, text_encoder, scaling)
    return 0


if __name__ == "__main__":
    sys.exit(main())
