"""Train the built-in demo model on drawn scenes: "a red circle on a blue background".

The demo is the tiny SD1.x-shaped pipeline of app/core/demo.py (CLIP text encoder 32 wide, VAE
16-32 channels, UNet 32-64 channels, 128 px). This script draws its training pictures with
Pillow (a circle, square or triangle of one colour on a background of another, from the
vocabulary in app/core/demo.py), then
1. trains the VAE as an autoencoder on 64 px crops of those pictures (it is fully convolutional,
   so it then works at 128 px) and measures its latent spread for the scaling factor;
2. trains the UNet with Stable Diffusion's epsilon-prediction DDPM loss on the VAE latents,
   conditioned on the frozen, randomly initialised text encoder's embeddings of the captions
   (one caption in ten is dropped to the empty prompt, for classifier-free guidance);
3. trains the decoder alone some more (the encoder, hence the UNet's latents, frozen);
4. goes on training the UNet with v-prediction (SD 2.x's parameterisation) in rounds: after
   the epsilon stage the UNet could denoise up to t=800 but laid out no picture from pure noise,
   and v-prediction's target at high noise is the picture itself (measured: epsilon-weighted
   rounds still gave noise-like pictures; v-prediction gives a clean shape on a background);
5. writes the three components as fp16 safetensors plus demo.json (scaling factor, prediction
   type, settings) to resources/demo/.

Deterministic for a given --seed, torch limited to --threads (default 1) threads. With the
default step counts it takes about 40 minutes on one thread of this project's shared 2-core
CPU (stage 1 6.5 min, 2 13.5 min, 3 9 min, 4 10 min, measured with other work running). At
these step counts the model draws a flat shape on a flat background but does not yet follow
the prompt's colours: the UNet needs more steps to learn the text conditioning.
Usage: python tools/train_demo.py [--out resources/demo] [--seed 2000]
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

    vae = demo.tiny_vae(args.seed + 1).to(args.device).train()
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


def caption_embeddings(text_encoder, args):
    """The frozen text encoder's hidden states for every caption, and for the empty prompt
    (last row), tokenised as the pipeline does (padded to 77 tokens)."""
    import torch

    tokenizer = demo.clip_tokenizer()
    texts = [demo.demo_prompt(*combo) for combo in captions()] + [""]
    tokens = tokenizer(
        texts, padding="max_length", max_length=77, truncation=True, return_tensors="pt"
    ).input_ids.to(args.device)
    with torch.no_grad():
        return text_encoder(tokens)[0]


def train_unet(vae, text_encoder, args, rng: np.random.Generator, started: float, checkpoint):
    import copy

    import torch
    from diffusers import DDPMScheduler

    latents, labels = scene_latents(vae, args, rng)
    scaling = float(1.0 / latents.std())
    latents = latents * scaling
    log(f"{len(latents)} scene latents, scaling factor {scaling:.4f}", started)
    embeddings = caption_embeddings(text_encoder, args)
    empty = len(embeddings) - 1
    distances = torch.cdist(embeddings[:empty].flatten(1), embeddings[:empty].flatten(1))
    nearest = distances + torch.eye(empty, device=args.device) * 1e9
    log(
        f"caption embeddings: nearest other caption at {nearest.min().item():.3f} "
        f"(mean pairwise {distances.mean().item():.3f})",
        started,
    )
    scheduler = DDPMScheduler(
        **{k: v for k, v in demo.SD_SCHEDULER_CONFIG.items() if k != "timestep_spacing"}
    )
    unet = demo.tiny_unet(args.seed + 3).to(args.device).train()
    average = copy.deepcopy(unet).eval().requires_grad_(False)
    optimiser = torch.optim.AdamW(unet.parameters(), lr=args.unet_lr, weight_decay=1e-4)
    alphas = scheduler.alphas_cumprod.to(args.device)
    for step in range(args.unet_steps):
        picks = torch.from_numpy(rng.integers(len(latents), size=args.unet_batch)).to(args.device)
        clean = latents[picks]
        condition = labels[picks].clone()
        condition[torch.from_numpy(rng.random(args.unet_batch) < args.drop).to(args.device)] = empty
        noise = torch.randn(clean.shape, generator=args.generator).to(args.device)
        timesteps = torch.from_numpy(rng.integers(0, 1000, size=args.unet_batch)).to(args.device)
        a = alphas[timesteps].view(-1, 1, 1, 1)
        noisy = a.sqrt() * clean + (1 - a).sqrt() * noise
        predicted = unet(noisy, timesteps, embeddings[condition]).sample
        loss = (predicted - noise).pow(2).mean()
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        decay = min(args.ema, (1 + step) / (10 + step))
        with torch.no_grad():
            for kept, live in zip(average.parameters(), unet.parameters(), strict=True):
                kept.lerp_(live, 1 - decay)
        if step % 25 == 0 or step == args.unet_steps - 1:
            log(f"unet {step}: loss {loss.item():.4f}", started)
        if step % args.checkpoint_every == 0 and step > 0:
            checkpoint(average, scaling)
    return average, scaling


def as_shipped(*components) -> None:
    """Round weights through fp16, as the shipped files store them, so that the later stages
    work on exactly what ships (and can be resumed from the files)."""
    import torch

    with torch.no_grad():
        for component in components:
            for tensor in component.state_dict().values():
                tensor.copy_(tensor.half().float())


def train_high_noise(
    unet, vae, text_encoder, scaling: float, args, started: float, round_index: int = 0
):
    """More UNet training on the noisiest timesteps, where the picture's layout is decided:
    the plain epsilon loss gives them almost no weight (their error in the picture is the
    epsilon error divided by the signal level), so the loss is weighted by 1/SNR, capped.
    Draws from its own random streams; the text encoder and VAE are used as shipped."""
    import copy

    import torch
    from diffusers import DDPMScheduler

    as_shipped(unet, vae, text_encoder)
    rng = np.random.default_rng(args.seed + 2 + round_index)
    generator = torch.Generator().manual_seed(args.seed + 2 + round_index)
    latents, labels = scene_latents(vae, args, rng)
    latents = latents * scaling
    embeddings = caption_embeddings(text_encoder, args)
    empty = len(embeddings) - 1
    scheduler = DDPMScheduler(
        **{k: v for k, v in demo.SD_SCHEDULER_CONFIG.items() if k != "timestep_spacing"}
    )
    alphas = scheduler.alphas_cumprod.to(args.device)
    unet.train().requires_grad_(True)
    average = copy.deepcopy(unet).eval().requires_grad_(False)
    optimiser = torch.optim.AdamW(unet.parameters(), lr=args.high_noise_lr, weight_decay=1e-4)
    for step in range(args.high_noise_steps):
        picks = torch.from_numpy(rng.integers(len(latents), size=args.unet_batch)).to(args.device)
        condition = labels[picks].clone()
        dropped = torch.from_numpy(rng.random(args.unet_batch) < args.drop).to(args.device)
        condition[dropped] = empty
        noise = torch.randn(latents[picks].shape, generator=generator).to(args.device)
        lowest = 300 if args.prediction == "epsilon" else 0
        timesteps = torch.from_numpy(rng.integers(lowest, 1000, size=args.unet_batch))
        timesteps = timesteps.to(args.device)
        a = alphas[timesteps].view(-1, 1, 1, 1)
        noisy = a.sqrt() * latents[picks] + (1 - a).sqrt() * noise
        predicted = unet(noisy, timesteps, embeddings[condition]).sample
        if args.prediction == "epsilon":
            weight = ((1 - a) / a).clamp(1.0, args.high_noise_weight)
            target = noise
        else:
            # v-prediction (SD 2.x's): at high noise its target is the picture itself.
            weight = torch.ones_like(a)
            target = a.sqrt() * noise - (1 - a).sqrt() * latents[picks]
        loss = (weight * (predicted - target).pow(2)).mean() / weight.mean()
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        decay = min(args.ema, (1 + step) / (10 + step))
        with torch.no_grad():
            for kept, live in zip(average.parameters(), unet.parameters(), strict=True):
                kept.lerp_(live, 1 - decay)
        if step % 25 == 0 or step == args.high_noise_steps - 1:
            log(f"unet, high noise {step}: weighted loss {loss.item():.4f}", started)
    return average


def save(component, path: Path, metadata: dict[str, str]) -> None:
    from safetensors.torch import save_file

    tensors = {
        name: tensor.detach().to("cpu").half().contiguous()
        for name, tensor in component.state_dict().items()
    }
    save_file(tensors, str(path), metadata=metadata)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "resources" / "demo")
    parser.add_argument("--seed", type=int, default=demo.DEMO_VERSION * 1000)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--vae-steps", type=int, default=500)
    parser.add_argument("--vae-batch", type=int, default=12)
    parser.add_argument("--vae-crop", type=int, default=64)
    parser.add_argument("--vae-lr", type=float, default=2e-3)
    parser.add_argument("--vae-kl", type=float, default=1e-4)
    parser.add_argument("--vae-noise", type=float, default=0.1)
    parser.add_argument("--decoder-steps", type=int, default=600)
    parser.add_argument("--variants", type=int, default=6)
    parser.add_argument("--unet-steps", type=int, default=451)
    parser.add_argument("--unet-batch", type=int, default=16)
    parser.add_argument("--unet-lr", type=float, default=2e-3)
    parser.add_argument(
        "--high-noise-steps", type=int, nargs="+", default=[250, 150], help="steps per round"
    )
    parser.add_argument("--high-noise-lr", type=float, default=1e-3)
    parser.add_argument("--high-noise-weight", type=float, default=20.0)
    parser.add_argument(
        "--prediction",
        choices=("epsilon", "v_prediction"),
        default="epsilon",
        help="what the UNet predicts after its last stage",
    )
    parser.add_argument("--drop", type=float, default=0.1)
    parser.add_argument("--ema", type=float, default=0.99)
    parser.add_argument("--checkpoint-every", type=int, default=150, help="UNet steps")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    args.generator = torch.Generator().manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    started = time.time()

    text_encoder = demo.tiny_text_encoder(args.seed + 2).to(args.device).eval()
    vae = train_vae(args, rng, started)
    args.out.mkdir(parents=True, exist_ok=True)
    save(vae, args.out / "vae-only.safetensors", {})
    settings = {
        key: value
        for key, value in vars(args).items()
        if key not in ("out", "generator", "device", "threads", "checkpoint_every")
    }

    def write(unet, scaling: float) -> None:
        args.out.mkdir(parents=True, exist_ok=True)
        stamp = {"seed": str(args.seed), "made_by": "tools/train_demo.py"}
        save(text_encoder, args.out / "text_encoder.safetensors", stamp)
        save(vae, args.out / "vae.safetensors", stamp)
        save(unet, args.out / "unet.safetensors", stamp)
        summary = {
            "scaling_factor": round(scaling, 6),
            "prediction_type": args.prediction,
            "trained_with": settings,
        }
        (args.out / "demo.json").write_text(json.dumps(summary, indent=2) + "\n")
        log(f"saved to {args.out}", started)

    unet, scaling = train_unet(vae, text_encoder, args, rng, started, write)
    scaling = round(scaling, 6)  # as demo.json keeps it
    vae = refine_decoder(vae, args, started)
    for round_index, steps in enumerate(args.high_noise_steps):
        args_round = argparse.Namespace(**{**vars(args), "high_noise_steps": steps})
        unet = train_high_noise(unet, vae, text_encoder, scaling, args_round, started, round_index)
    write(unet, scaling)
    (args.out / "vae-only.safetensors").unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
