"""Pictures made in code for explain's pixel tests: natural ones (1/f fields, the power
spectrum of photographs; a starry sky, a white background), failed ones (latent-sized noise
decoded, a tiny VAE's fp16 overflow written as 8 bits, a NaN image zeroed) and the looks between
(tiles repeated, colour blocks, RGB static, normal maps, channels apart)."""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageFilter

from app.core.images.finished import to_image
from tests.support.image_files import png_text
from tests.support.tiny_models import tiny_vae

SIZE = 512


def one_over_f(seed: int, colour: float = 0.4, size: int = SIZE) -> np.ndarray:
    """A picture-like field: 1/f amplitude (the spectrum of photographs), shared between the
    channels with some colour of its own; zero mean, unit spread."""
    rng = np.random.default_rng(seed)
    frequencies = np.fft.fftfreq(size)
    radius = np.hypot(frequencies[:, None], frequencies[None, :])
    radius[0, 0] = 1.0

    def field() -> np.ndarray:
        return np.fft.ifft2(np.fft.fft2(rng.standard_normal((size, size))) / radius).real

    shared = field()
    channels = np.stack([shared + colour * field() for _ in range(3)], axis=-1)
    return (channels - channels.mean()) / channels.std()


def written(values: np.ndarray, mean: float, spread: float, grain: float = 0.0, seed: int = 0):
    rng = np.random.default_rng(seed)
    unit = values * spread + mean + rng.normal(0.0, grain, values.shape[:2] + (1,))
    return (np.clip(unit, 0.0, 1.0) * 255).round().astype(np.uint8)


NATURAL = {
    "a photograph": written(one_over_f(1), 0.5, 0.2),
    "a grey photograph": written(one_over_f(2, colour=0.0), 0.5, 0.2),
    "a night scene": written(one_over_f(3), 0.06, 0.04),
    "snow": written(one_over_f(4), 0.9, 0.05),
    "film grain": written(one_over_f(5), 0.5, 0.2, grain=0.05),
    "heavy grain": written(one_over_f(6), 0.45, 0.15, grain=0.12),
    "colour grain": np.clip(
        written(one_over_f(9), 0.5, 0.2).astype(float)
        + np.random.default_rng(9).normal(0, 12, (SIZE, SIZE, 3)),
        0,
        255,
    ).astype(np.uint8),
}


def starry_sky() -> np.ndarray:
    rng = np.random.default_rng(7)
    stars = (rng.random((SIZE, SIZE, 1)) < 0.01) * 230.0
    return np.clip(stars + 5 + rng.normal(0, 2, (SIZE, SIZE, 3)), 0, 255).astype(np.uint8)


def white_background() -> np.ndarray:
    """A product shot: a subject on a blown-out white background (60% of it 255)."""
    picture = written(one_over_f(8), 0.5, 0.2)
    picture[:, : int(SIZE * 0.6)] = 255
    return picture


def decoded_noise(seed: int = 0, size: int = SIZE, grain: int = 8) -> np.ndarray:
    """Latents that were never denoised, turned into pixels: one random colour per 8 px cell
    (`grain`), smoothed between cells as a VAE's upsampling does."""
    rng = np.random.default_rng(seed)
    cells = rng.standard_normal((size // grain, size // grain, 3))
    unit = (cells - cells.min()) / (cells.max() - cells.min())
    small = Image.fromarray((unit * 255).astype(np.uint8), "RGB")
    return np.asarray(small.resize((size, size), Image.Resampling.BILINEAR))


def a1111_write(sample) -> np.ndarray:
    """A decoded sample in [-1, 1] written as A1111 and ComfyUI write it: clipped, then cast
    (+inf becomes 255, -inf and NaN 0)."""
    unit = np.clip(np.asarray(sample, dtype=np.float32) / 2 + 0.5, 0.0, 1.0)
    return (255.0 * np.nan_to_num(unit, nan=0.0)).astype(np.uint8)


def fp16_overflow_decoded() -> np.ndarray:
    """A tiny VAE whose last layer overflows fp16 (weights scaled 1e6): its output cast to
    fp16 is +-inf in every value, as a half-precision decode writes it."""
    import torch

    vae = tiny_vae(1)
    with torch.no_grad():
        vae.decoder.conv_out.weight.mul_(1e6)
        vae.decoder.conv_out.bias.fill_(1e6)
        latents = torch.randn(1, 4, 32, 32, generator=torch.Generator().manual_seed(0))
        sample = vae.decode(latents)
    half = sample.sample.to(torch.float16).float()[0].permute(1, 2, 0).numpy()
    return a1111_write(half)


def save(tmp_path, name: str, picture: np.ndarray, texts: dict[str, str] | None = None):
    image = Image.fromarray(picture, "RGB")
    if texts is None:
        path = tmp_path / name
        image.save(path)
        return path
    return png_text(tmp_path / name, texts, image)


def photograph(seed: int, size: int, alpha: float, colour: float) -> np.ndarray:
    """A photograph's spectrum: a 1/f^alpha field (alpha 1 is the photographs' average), its
    channels sharing one field with `colour` of their own each."""
    rng = np.random.default_rng(seed)
    frequencies = np.fft.fftfreq(size)
    radius = np.hypot(frequencies[:, None], frequencies[None, :])
    radius[0, 0] = 1.0

    def field() -> np.ndarray:
        return np.fft.ifft2(np.fft.fft2(rng.standard_normal((size, size))) / radius**alpha).real

    shared = field()
    channels = np.stack([shared + colour * field() for _ in range(3)], axis=-1)
    return written((channels - channels.mean()) / channels.std(), 0.5, 0.2)


PHOTOGRAPHS = [
    (seed, alpha, colour)
    for alpha in (1.0, 1.25, 1.5)
    for colour in (0.4, 1.0, 3.0)
    for seed in range(3)
]


def upsampled_noise(seed: int, size: int, times: int, method: Image.Resampling) -> np.ndarray:
    """Coloured noise per pixel, drawn `times` smaller and enlarged."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (size // times, size // times, 3)).astype(np.uint8)
    return np.asarray(Image.fromarray(small, "RGB").resize((size, size), method))


def real_noise(size: int) -> dict[str, np.ndarray]:
    noise = {
        "per pixel": upsampled_noise(0, size, 1, Image.Resampling.NEAREST),
        **{
            f"{times}x {method.name.lower()}": upsampled_noise(times, size, times, method)
            for times in (2, 3, 4)
            for method in (Image.Resampling.NEAREST, Image.Resampling.BILINEAR)
        },
        **{f"decoded latents {seed}": decoded_noise(seed, size) for seed in range(6)},
    }
    if size >= 512:  # a second pass's grain: decoded noise enlarged twice
        noise["decoded latents, enlarged twice"] = decoded_noise(0, size, grain=16)
    return noise


def tiled_picture(tile: np.ndarray, size: int = SIZE) -> np.ndarray:
    times = size // tile.shape[0] + 1
    return np.tile(tile, (times, times, 1))[:size, :size]


def smoothed(picture: np.ndarray, radius: float = 1.0) -> np.ndarray:
    return np.asarray(Image.fromarray(picture).filter(ImageFilter.GaussianBlur(radius)))


def repeated(kind: str, period: int, size: int = SIZE) -> np.ndarray:
    """A tile of `period` px repeated: noise per pixel, latents' noise decoded, or a smooth
    psychedelic 1/f tile (seamless: the field is periodic), that one also smoothed."""
    rng = np.random.default_rng(period)
    if kind == "pixel":
        tile = rng.integers(0, 256, (period, period, 3)).astype(np.uint8)
    elif kind == "decoded":
        tile = decoded_noise(period, period, grain=max(2, min(8, period // 4)))
    else:
        tile = written(one_over_f(period, 1.0, size=period), 0.5, 0.25)
    picture = tiled_picture(tile, size)
    return smoothed(picture) if kind == "smoothed" else picture


def blocky(kind: str, period: int, size: int = SIZE) -> np.ndarray:
    """One random colour per `period` px block: sharp, smoothed over three pixels or (a decoder's
    wider smoothing) over about eight, or with grain."""
    rng = np.random.default_rng(period)
    cells = rng.integers(0, 256, (size // period, size // period, 3)).astype(np.uint8)
    sharp = np.asarray(Image.fromarray(cells).resize((size, size), Image.Resampling.NEAREST))
    if kind == "smoothed":
        return smoothed(sharp)
    if kind == "smoothed wide":
        return smoothed(sharp, 2.0)
    if kind == "grain":
        return np.clip(sharp + rng.normal(0, 12, sharp.shape), 0, 255).astype(np.uint8)
    return sharp


def rgb_static(kind: str, size: int = SIZE) -> np.ndarray:
    """Every pixel its own colour: pure red, green or blue; any of the eight colours whose
    channels are 0 or 255; pure colours with a little noise off the extremes."""
    rng = np.random.default_rng(3)
    pure = np.eye(3, dtype=np.uint8)[rng.integers(0, 3, (size, size))] * 255
    if kind == "pure":
        return pure
    if kind == "eight":
        return (rng.integers(0, 2, (size, size, 3)) * 255).astype(np.uint8)
    off = rng.integers(0, 20, pure.shape)
    return np.clip(pure.astype(int) + np.where(pure > 0, -off, off), 0, 255).astype(np.uint8)


def normal_map(seed: int, strength: float, size: int = SIZE) -> np.ndarray:
    """The normals of a smooth surface (a 1/f^2 height field) as a normal map writes them:
    (n + 1) / 2, blue the surface's up."""
    rng = np.random.default_rng(seed)
    frequencies = np.fft.fftfreq(size)
    radius = np.hypot(frequencies[:, None], frequencies[None, :])
    radius[0, 0] = 1.0
    height = np.fft.ifft2(np.fft.fft2(rng.standard_normal((size, size))) / radius**2).real
    dy, dx = np.gradient(height / height.std())
    normals = np.stack([-dx * strength, -dy * strength, np.ones_like(height)], axis=-1)
    normals /= np.linalg.norm(normals, axis=-1, keepdims=True)
    return ((normals + 1) / 2 * 255).round().astype(np.uint8)


def channels_apart(seed: int, colour: tuple[int, int, int], size: int = SIZE) -> np.ndarray:
    """Smooth fields, one per channel and nearly apart, around one strong colour."""
    fields = one_over_f(seed, colour=8.0, size=size)
    unit = np.clip(np.array(colour) / 255 + fields * 0.12, 0.0, 1.0)
    return (unit * 255).round().astype(np.uint8)


def decoded(latents) -> np.ndarray:
    """Latents (1, 4, h, w) through the SD-shaped tiny VAE, written as HalfSafe writes a PNG."""
    import torch

    vae = tiny_vae(1)
    with torch.no_grad():
        sample = vae.decode(latents / vae.config.scaling_factor).sample
    image, _ = to_image(sample[0].permute(1, 2, 0).numpy())
    return np.asarray(image)


def nan_pixels_zeroed(size: int = 64):
    """A decoded image that came out all NaN, after torch.nan_to_num: zeros in [-1, 1]."""
    import torch

    return torch.nan_to_num(torch.full((size, size, 3), float("nan"))).numpy()
