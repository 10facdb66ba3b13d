"""FLUX.3's sampling recipe as diffusers' FLUX.3 blocks set it, shared by the family (its
sentences, its probe), its adapter (the calls' defaults) and its folder loader (a folder's
missing scheduler): the steps each variant runs, the base model's CFG scale, the schedule's
constant shift, and how a prompt is read (the Qwen3-VL layers, the padding)."""

from __future__ import annotations

# Steps by default: the base model's (Flux3SetTimestepsStep's) and the distilled Klein's.
BASE_STEPS = 50
DISTILLED_STEPS = 16
# The base model's CFG scale by default (its denoiser's guider); the distilled one has none.
BASE_CFG = 3.5
# The constant shift ("alpha") of the schedule, set on the scheduler.
FLUX3_SHIFT = 6.93
# The Qwen3-VL layers whose hidden states are read, side by side per token (8 of the 4B's 36);
# the prompt in its chat form, right-padded to a multiple of 80 tokens (the transformer attends
# to the padding) and cut at 8,192.
TEXT_LAYERS = (4, 8, 12, 16, 20, 24, 28, 32)
PAD_MULTIPLE = 80
MAX_SEQUENCE_LENGTH = 8192
