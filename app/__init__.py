"""HalfSafe: make half precision safe for local Stable Diffusion."""

__version__ = "0.1.0"
