"""Precision plans: turn the user's settings into per-component dtypes and backend flags, and
apply them to a pipeline for one job.

A plan is resolved once per job from the settings, the device and the model; `auto` is never
left in a plan. Applying it places each component on the device in its dtype, casts tensors at
component boundaries (so an fp16 UNet can feed an fp32 VAE), installs an attention processor
that honours `upcast_attention` under every attention backend, and sets PyTorch's backend flags
for the duration of the job only.

One responsibility per module, each importing only those before it:
  plan        PrecisionPlan, the dtype names, what a plan's weights cost, a pipeline's components
  autocast    whether fp16 autocast exists here and what it upcasts; the hooks that apply it
  resolve     resolve_plan: settings, device, model and a remembered fix to a plan;
              expected_dtypes, what the settings give before a model is loaded
  attention   SafeAttnProcessor, set_attention, backend_flags for one job
  placement   PlacedPipeline: components placed in their dtypes, islands, clamps, casts

No torch at import: every module imports it inside the functions that need it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core.lazy import lazy_exports

if TYPE_CHECKING:
    from app.core.components import FP16_MAX
    from app.core.precision.attention import SafeAttnProcessor, backend_flags, set_attention
    from app.core.precision.autocast import (
        autocast_available,
        autocast_problem,
        autocast_upcasts_norms,
    )
    from app.core.precision.placement import PlacedPipeline
    from app.core.precision.plan import (
        COMPONENT_SETTING,
        COMPONENTS,
        DTYPE_NAMES,
        PrecisionPlan,
        dtype_name,
        parameter_counts,
        pipeline_components,
        plan_weights_mb,
        torch_dtype,
    )
    from app.core.precision.resolve import (
        CUDA_ONLY_BACKENDS,
        expected_dtypes,
        idle_settings,
        resolve_plan,
    )

__all__ = [
    "COMPONENTS",
    "COMPONENT_SETTING",
    "CUDA_ONLY_BACKENDS",
    "DTYPE_NAMES",
    "FP16_MAX",
    "PlacedPipeline",
    "PrecisionPlan",
    "SafeAttnProcessor",
    "autocast_available",
    "autocast_problem",
    "autocast_upcasts_norms",
    "backend_flags",
    "dtype_name",
    "expected_dtypes",
    "idle_settings",
    "parameter_counts",
    "pipeline_components",
    "plan_weights_mb",
    "resolve_plan",
    "set_attention",
    "torch_dtype",
]

if not TYPE_CHECKING:  # pyright would take any name from a module with __getattr__
    __getattr__, __dir__ = lazy_exports(
        globals(),
        {
            "app.core.components": ["FP16_MAX"],
            ".attention": ["SafeAttnProcessor", "backend_flags", "set_attention"],
            ".autocast": ["autocast_available", "autocast_problem", "autocast_upcasts_norms"],
            ".placement": ["PlacedPipeline"],
            ".plan": [
                "COMPONENT_SETTING",
                "COMPONENTS",
                "DTYPE_NAMES",
                "PrecisionPlan",
                "dtype_name",
                "parameter_counts",
                "pipeline_components",
                "plan_weights_mb",
                "torch_dtype",
            ],
            ".resolve": ["CUDA_ONLY_BACKENDS", "expected_dtypes", "idle_settings", "resolve_plan"],
        },
    )
