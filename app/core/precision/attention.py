"""Attention for a plan: the processor that honours `upcast_attention` under every SDPA kernel,
installing it on a component's attention layers, and PyTorch's precision and attention-kernel
flags set for one job. A named backend is PyTorch's own kernel even where another library
replaced `scaled_dot_product_attention` in this process (`kernels.patched_sdpa`), and runs
PyTorch's own functional ops where a fused-kernel library replaced them (`kernels.patched_ops`);
`auto` runs whatever the environment installed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from app.core.precision import kernels
from app.core.precision.plan import PrecisionPlan


class SafeAttnProcessor:
    """Scaled-dot-product attention that can compute scores, softmax and the weighted sum in fp32.

    diffusers' default processor ignores `upcast_attention`; this one honours it, and also the
    model's own config flag (SD2.x sets it on some blocks), whichever SDPA kernel is selected.
    The result is cast back to the layer's dtype, so the rest of the model is unchanged.
    """

    def __init__(self, upcast: bool) -> None:
        self.upcast = upcast

    def __call__(
        self,
        attn,
        hidden_states,
        encoder_hidden_states=None,
        attention_mask=None,
        temb=None,
        *args,
        **kwargs,
    ):
        import torch.nn.functional as F

        residual = hidden_states
        if attn.spatial_norm is not None:
            hidden_states = attn.spatial_norm(hidden_states, temb)
        image_shape = None
        if hidden_states.ndim == 4:
            image_shape = hidden_states.shape
            b, c, h, w = image_shape
            hidden_states = hidden_states.view(b, c, h * w).transpose(1, 2)
        context = hidden_states if encoder_hidden_states is None else encoder_hidden_states
        batch, context_len, _ = context.shape

        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(attention_mask, context_len, batch)
            attention_mask = attention_mask.view(batch, attn.heads, -1, attention_mask.shape[-1])
        if attn.group_norm is not None:
            hidden_states = attn.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)
        if encoder_hidden_states is None:  # self-attention: keys and values from the normed input
            context = hidden_states
        elif attn.norm_cross:
            context = attn.norm_encoder_hidden_states(context)

        query, key, value = attn.to_q(hidden_states), attn.to_k(context), attn.to_v(context)
        head_dim = key.shape[-1] // attn.heads

        def heads(t):
            return t.view(batch, -1, attn.heads, head_dim).transpose(1, 2)

        query, key, value = heads(query), heads(key), heads(value)
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)

        scores = getattr(attn, "_halfsafe_scores", None)
        if scores is not None:  # a probe is recording: bound |q.k| * scale (Cauchy-Schwarz)
            norms_q = query.detach().float().norm(dim=-1).amax()
            norms_k = key.detach().float().norm(dim=-1).amax()
            scores.append(norms_q * norms_k * (attn.scale or head_dim**-0.5))

        out_dtype = query.dtype
        if self.upcast or getattr(attn, "upcast_attention", False):
            query, key, value = query.float(), key.float(), value.float()
            if attention_mask is not None:
                attention_mask = attention_mask.float()
        hidden_states = F.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=attention_mask,
            dropout_p=0.0,
            is_causal=False,
            scale=attn.scale,
        )
        hidden_states = hidden_states.transpose(1, 2).reshape(batch, -1, attn.heads * head_dim)
        hidden_states = attn.to_out[1](attn.to_out[0](hidden_states.to(out_dtype)))

        if image_shape is not None:
            hidden_states = hidden_states.transpose(-1, -2).reshape(image_shape)
        if attn.residual_connection:
            hidden_states = hidden_states + residual
        return hidden_states / attn.rescale_output_factor


def set_attention(module, plan: PrecisionPlan) -> None:
    """Install the attention processor the plan asks for on every attention layer of `module`.

    `classic` is diffusers' original processor, which honours the per-layer upcast flags; every
    other backend runs `SafeAttnProcessor` and is picked by `backend_flags` at run time.
    """
    from diffusers.models.attention_processor import Attention, AttnProcessor

    for layer in module.modules():
        if not isinstance(layer, Attention):
            continue
        # The model's own flags, kept once so that a later plan without upcast restores them.
        config: tuple[bool, bool] | None = getattr(layer, "_halfsafe_config_upcast", None)
        if config is None:
            config = (bool(layer.upcast_attention), bool(layer.upcast_softmax))
            object.__setattr__(layer, "_halfsafe_config_upcast", config)
        layer.upcast_attention = config[0] or plan.upcast_attention
        layer.upcast_softmax = config[1] or plan.upcast_attention
        processor: Any = (
            AttnProcessor()
            if plan.attention_backend == "classic"
            else SafeAttnProcessor(plan.upcast_attention)
        )
        layer.set_processor(processor)


@contextmanager
def backend_flags(plan: PrecisionPlan) -> Iterator[None]:
    """Set PyTorch's precision and attention-kernel flags for one job, and restore them after.

    The flags are process-wide; the engine runs one job at a time, so a job owns them. Every
    backend but `auto` runs PyTorch's own SDPA for the job, and a library's replacement of it
    (SageAttention patched in, say) is put back after: choosing a backend is how a user turns
    such a kernel off in HalfSafe.
    """
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    matmul = torch.backends.cuda.matmul
    saved = (
        matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        matmul.allow_fp16_reduced_precision_reduction,
        getattr(matmul, "allow_fp16_accumulation", False),
        torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed(),
    )
    matmul.allow_tf32 = plan.allow_tf32
    torch.backends.cudnn.allow_tf32 = plan.allow_tf32
    matmul.allow_fp16_reduced_precision_reduction = plan.fp16_reduced_precision_reduction
    if hasattr(matmul, "allow_fp16_accumulation"):
        matmul.allow_fp16_accumulation = plan.fp16_accumulation
    torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(plan.attention_reduced_precision)

    chosen = {
        "flash": [SDPBackend.FLASH_ATTENTION],
        "efficient": [SDPBackend.EFFICIENT_ATTENTION],
        "cudnn": [SDPBackend.CUDNN_ATTENTION],
        "math": [SDPBackend.MATH],
    }.get(plan.attention_backend)
    if chosen is not None:
        # Math is always allowed as a fallback: a kernel that cannot run a shape (flash in
        # fp32 under upcast, any fused kernel on CPU) must not turn into an error.
        chosen = [*chosen, SDPBackend.MATH] if SDPBackend.MATH not in chosen else chosen
    own = (
        kernels.torch_own_kernels()
        if plan.attention_backend != "auto"
        else contextlib.nullcontext()
    )
    try:
        with own:
            if chosen is None:
                yield
            else:
                with sdpa_kernel(chosen, set_priority=True):
                    yield
    finally:
        (
            matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32,
            matmul.allow_fp16_reduced_precision_reduction,
            fp16_acc,
            math_sdp,
        ) = saved
        if hasattr(matmul, "allow_fp16_accumulation"):
            matmul.allow_fp16_accumulation = fp16_acc
        torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(math_sdp)
