"""Samplers and noise schedules by the names AUTOMATIC1111/Forge and ComfyUI use, each run by one
of diffusers' schedulers: one table, read by the settings (the choices), the PNG's `Sampler` and
`Schedule type` (written and read), `explain` (an image made elsewhere, made again with its own
sampler) and the window's words.

A setting's value is the sampler's key, then the schedule's when it is not the sampler's own
(`dpmpp_2m_sde_karras`: DPM++ 2M SDE with Karras sigmas), as A1111 before 1.9 named them in one
word. A sampler diffusers does not run the same way is refused in one sentence naming the
closest one HalfSafe runs, and so is a schedule (`read`); an image's record takes the closest. Plain Python: diffusers is imported when a scheduler is made.

Sources of the names (facts, not code): A1111's `sd_samplers_kdiffusion.py` and
`sd_schedulers.py` (AGPL-3.0), ComfyUI's `KSampler.SAMPLERS` and `SCHEDULER_NAMES` (GPL-3.0),
diffusers' scheduler overview table (Apache-2.0), which says which diffusers scheduler and
options give which of them.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.core.errors import HalfSafeError


@dataclass(frozen=True)
class Schedule:
    """A noise schedule: `key` as HalfSafe's setting spells it, A1111's `name` ("Karras"),
    ComfyUI's `comfy` word, and the scheduler options that give it."""

    key: str
    name: str
    comfy: str
    options: Mapping[str, Any]


@dataclass(frozen=True)
class Sampler:
    """A sampler: `key`, A1111's `name` ("DPM++ 2M SDE"), ComfyUI's `comfy` words, the
    diffusers scheduler class and its options, the schedules it runs beside its own, and
    whether it takes rescaled zero-terminal-SNR betas (a v-prediction model trained so)."""

    key: str
    name: str
    comfy: tuple[str, ...]
    scheduler: str
    options: Mapping[str, Any] = field(default_factory=dict)
    schedules: tuple[str, ...] = ()
    zero_snr: bool = True


SCHEDULES: tuple[Schedule, ...] = (
    Schedule("karras", "Karras", "karras", {"use_karras_sigmas": True}),
    Schedule("exponential", "Exponential", "exponential", {"use_exponential_sigmas": True}),
    Schedule("beta", "Beta", "beta", {"use_beta_sigmas": True}),
    # diffusers' overview: SGM uniform is trailing timestep spacing.
    Schedule("sgm_uniform", "SGM Uniform", "sgm_uniform", {"timestep_spacing": "trailing"}),
)
_SIGMA_SCHEDULES = ("karras", "exponential", "beta", "sgm_uniform")

SAMPLERS: tuple[Sampler, ...] = (
    Sampler("euler", "Euler", ("euler",), "EulerDiscreteScheduler", {}, _SIGMA_SCHEDULES),
    Sampler(
        "euler_a", "Euler a", ("euler_ancestral",), "EulerAncestralDiscreteScheduler", {},
        ("sgm_uniform",),
    ),
    Sampler("heun", "Heun", ("heun",), "HeunDiscreteScheduler", {}, _SIGMA_SCHEDULES, False),
    # DPM2 and DPM2 a: second order, two denoiser calls a step but the last (as Heun); no
    # rescaled betas in diffusers' KDPM2 schedulers.
    Sampler("dpm2", "DPM2", ("dpm_2",), "KDPM2DiscreteScheduler", {}, _SIGMA_SCHEDULES, False),
    Sampler(
        "dpm2_a", "DPM2 a", ("dpm_2_ancestral",), "KDPM2AncestralDiscreteScheduler", {},
        _SIGMA_SCHEDULES, False,
    ),
    Sampler(
        "dpmpp_2m", "DPM++ 2M", ("dpmpp_2m",), "DPMSolverMultistepScheduler",
        {"algorithm_type": "dpmsolver++", "solver_order": 2}, _SIGMA_SCHEDULES,
    ),
    Sampler(
        "dpmpp_2m_sde", "DPM++ 2M SDE", ("dpmpp_2m_sde", "dpmpp_2m_sde_gpu"),
        "DPMSolverMultistepScheduler", {"algorithm_type": "sde-dpmsolver++", "solver_order": 2},
        _SIGMA_SCHEDULES,
    ),
    # DPM++ SDE: second order (two denoiser calls a step but the last), its fresh noise drawn
    # from a Brownian tree seeded by each image's seed (`seeded`), as A1111 and ComfyUI seed
    # it; no rescaled betas in diffusers' DPMSolverSDEScheduler.
    Sampler(
        "dpmpp_sde", "DPM++ SDE", ("dpmpp_sde", "dpmpp_sde_gpu"), "DPMSolverSDEScheduler", {},
        _SIGMA_SCHEDULES, False,
    ),
    Sampler(
        "dpmpp_3m_sde", "DPM++ 3M SDE", ("dpmpp_3m_sde", "dpmpp_3m_sde_gpu"),
        "DPMSolverMultistepScheduler", {"algorithm_type": "sde-dpmsolver++", "solver_order": 3},
        _SIGMA_SCHEDULES,
    ),
    Sampler("unipc", "UniPC", ("uni_pc", "uni_pc_bh2"), "UniPCMultistepScheduler", {},
            _SIGMA_SCHEDULES),
    Sampler("lcm", "LCM", ("lcm",), "LCMScheduler", {}, ("sgm_uniform",)),
    Sampler("ddim", "DDIM", ("ddim",), "DDIMScheduler", {}, ("sgm_uniform",)),
)  # fmt: skip

# Samplers the tools name that HalfSafe does not run, with the closest one it does.
CLOSEST: Mapping[str, str] = {
    "dpm++ 2s a": "euler_a",
    "dpmpp_2s_ancestral": "euler_a",
    "dpm++ 2m sde heun": "dpmpp_2m_sde",
    "dpmpp_2m_sde_heun": "dpmpp_2m_sde",
    "dpmpp_2m_sde_heun_gpu": "dpmpp_2m_sde",
    "dpm fast": "dpmpp_2m",
    "dpm adaptive": "dpmpp_2m",
    "lms": "euler",
    "plms": "ddim",
    "restart": "dpmpp_2m",
}

# Schedules the tools name that HalfSafe does not run, with the closest one it does (a key of
# SCHEDULES; None: the sampler's own). What each is (A1111's sd_schedulers.py, ComfyUI's
# comfy/samplers.py, as facts):
# - Simple (ComfyUI): the model's sigmas at evenly spaced indices from the top,
#   999 - floor(i * 1000 / steps). diffusers' trailing spacing (SGM Uniform here) takes
#   999 - round(i * 1000 / steps): the same sigmas where steps divide 1000, one index lower
#   where the fraction is a half or more (30 steps: 933 for 934), and no diffusers scheduler
#   option floors.
# - DDIM uniform (A1111's DDIM): indices 1, 1 + 1000 // steps, ...: the leading spacing with
#   steps_offset 1 that SD's own scheduler configs set (the sampler's own), where steps divide
#   999 evenly enough; elsewhere ComfyUI runs a step more than asked.
# - KL Optimal: tan of evenly spaced arctan(sigma), crowded at low noise as Karras is.
# - Align Your Steps (and its GITS, 11 and 32 variants): NVIDIA's fixed sigma tables, log-
#   interpolated to the step count, again crowded at low noise: Karras.
# - Polyexponential: exponential with a power on the ramp. Turbo: SD-Turbo's trailing steps.
# - Linear quadratic (for flow models): linear, then quadratic sigmas: the sampler's own.
UNRUN_SCHEDULES: Mapping[str, str | None] = {
    "simple": "sgm_uniform",
    "ddim_uniform": None,
    "ddim uniform": None,
    "ddim": None,
    "kl_optimal": "karras",
    "kl optimal": "karras",
    "align your steps": "karras",
    "align_your_steps": "karras",
    "align your steps gits": "karras",
    "align your steps 11": "karras",
    "align your steps 32": "karras",
    "ays": "karras",
    "polyexponential": "exponential",
    "turbo": "sgm_uniform",
    "linear_quadratic": None,
    "linear quadratic": None,
}
# The words for the sampler's own schedule: A1111's Automatic, ComfyUI's normal.
_OWN_SCHEDULE = ("automatic", "normal")

BY_KEY: Mapping[str, Sampler] = {sampler.key: sampler for sampler in SAMPLERS}
SCHEDULE_BY_KEY: Mapping[str, Schedule] = {schedule.key: schedule for schedule in SCHEDULES}


def _keys() -> tuple[str, ...]:
    keys = []
    for sampler in SAMPLERS:
        keys.append(sampler.key)
        keys.extend(f"{sampler.key}_{schedule}" for schedule in sampler.schedules)
    return tuple(keys)


# Every value the sampler setting takes, in the order the window lists them.
KEYS: tuple[str, ...] = _keys()
DEFAULT = "dpmpp_2m_karras"


def split(key: str) -> tuple[Sampler, Schedule | None]:
    """A setting's value as its sampler and schedule (None: the sampler's own); KeyError for a
    value the table does not hold."""
    if key in BY_KEY:
        return BY_KEY[key], None
    for sampler in SAMPLERS:
        for schedule in sampler.schedules:
            if key == f"{sampler.key}_{schedule}":
                return sampler, SCHEDULE_BY_KEY[schedule]
    raise KeyError(key)


def join(sampler_key: str, schedule_key: str | None = None) -> str:
    """The setting's value for a sampler run with a schedule (None: its own), as `split` reads
    it back; KeyError for a sampler the table does not hold or a schedule it does not run."""
    sampler = BY_KEY[sampler_key]
    if schedule_key is None:
        return sampler.key
    if schedule_key not in sampler.schedules:
        raise KeyError(f"{sampler_key}_{schedule_key}")
    return f"{sampler.key}_{schedule_key}"


# A1111's word for a sampler's own schedule (its `Schedule type` when none is chosen).
OWN_SCHEDULE_WORDS = "Automatic"


def words(key: str) -> str:
    """A setting's value in A1111's words, sampler then schedule: "DPM++ 2M SDE Karras"."""
    sampler, schedule = split(key)
    return f"{sampler.name} {schedule.name}" if schedule else sampler.name


def infotext_words(key: str) -> tuple[str, str | None]:
    """What A1111 1.9 and later write for it: `Sampler` and `Schedule type` (None: the
    sampler's own schedule, which A1111 calls Automatic and leaves out)."""
    sampler, schedule = split(key)
    return sampler.name, schedule.name if schedule else None


def key_for(sampler_words: str | None, schedule_words: str | None = None) -> str | None:
    """HalfSafe's value for a tool's sampler (and schedule) words, or None when the table
    does not know the sampler. Reads A1111's names ("DPM++ 2M SDE", with "Schedule type:
    Karras", or in one word "DPM++ 2M SDE Karras" as before 1.9), ComfyUI's (`dpmpp_2m_sde_gpu`,
    scheduler `karras`; `normal` is the sampler's own), and HalfSafe's keys. A schedule
    HalfSafe does not run gives the closest it does (`read` says so in a sentence)."""
    return read(sampler_words, schedule_words)[0]


def read(
    sampler_words: str | None, schedule_words: str | None = None
) -> tuple[str | None, str | None]:
    """(`key_for`'s value, one sentence when that is not the schedule the words ask for: a
    schedule HalfSafe does not run, or one this sampler does not take in diffusers, naming the
    closest it runs, which the value is; None when it runs what was asked)."""
    if not sampler_words:
        return None, None
    said = sampler_words.strip().lower()
    schedule = schedule_words.strip() if schedule_words and schedule_words.strip() else None
    if said in KEYS and schedule is None:
        return said, None
    found = _sampler_named(said)
    if found is None:  # the schedule in the same words: "DPM++ 2M Karras", "euler_kl_optimal"
        for spelling in _schedule_spellings():
            for separator in (" ", "_"):
                suffix = separator + spelling
                if said.endswith(suffix) and (found := _sampler_named(said[: -len(suffix)])):
                    schedule = schedule or sampler_words.strip()[-len(spelling) :]
                    break
            if found is not None:
                break
    if found is None:
        return None, None
    return _with_schedule(found, schedule)


def _with_schedule(sampler: Sampler, said: str | None) -> tuple[str, str | None]:
    if said is None or said.lower() in _OWN_SCHEDULE:
        return sampler.key, None
    known = _schedule_named(said.lower())
    if known is not None:
        if known.key in sampler.schedules:
            return f"{sampler.key}_{known.key}", None
        return sampler.key, (
            f"HalfSafe does not run {sampler.name} with the schedule {known.name} (diffusers' "
            f"{sampler.name} takes no such option); the closest it runs is {sampler.name} "
            "with its own schedule."
        )
    lowered = said.lower()
    closest = UNRUN_SCHEDULES.get(lowered, UNRUN_SCHEDULES.get(lowered.replace("_", " ")))
    if closest in sampler.schedules:
        key, runs = f"{sampler.key}_{closest}", words(f"{sampler.key}_{closest}")
    else:
        key, runs = sampler.key, f"{sampler.name} with its own schedule"
    return key, f"HalfSafe does not run the schedule {said}; the closest it runs is {runs}."


def _schedule_spellings() -> list[str]:
    """Every schedule's words as a sampler's suffix may spell them, longest first (so that
    "align your steps gits" is not read as its shorter relatives)."""
    spellings = {*UNRUN_SCHEDULES, *_OWN_SCHEDULE}
    for schedule in SCHEDULES:
        spellings.update((schedule.key, schedule.name.lower(), schedule.comfy))
    return sorted(spellings, key=len, reverse=True)


def _schedule_named(said: str) -> Schedule | None:
    for schedule in SCHEDULES:
        if said in (schedule.key, schedule.name.lower(), schedule.comfy):
            return schedule
    return None


def refusal(sampler_words: str | None) -> str | None:
    """One sentence for a sampler a tool names that HalfSafe does not run, naming the
    closest one it does; None when HalfSafe runs it (or no sampler is named)."""
    if not sampler_words or key_for(sampler_words) is not None:
        return None
    # ComfyUI's sampler as `explain` records it: "dpmpp_sde_gpu (karras)".
    said = sampler_words.strip().lower().split(" (")[0]
    for suffix in ("", *(f" {s.name.lower()}" for s in SCHEDULES)):
        base = said[: -len(suffix)] if suffix and said.endswith(suffix) else said
        if base in CLOSEST:
            closest = BY_KEY[CLOSEST[base]].name
            return (
                f"HalfSafe does not run the sampler {sampler_words.strip()}; the closest it "
                f"runs is {closest}."
            )
    return f"HalfSafe does not run the sampler {sampler_words.strip()}."


def _sampler_named(said: str) -> Sampler | None:
    for sampler in SAMPLERS:
        if said in (sampler.key, sampler.name.lower(), *sampler.comfy):
            return sampler
    return None


def make(
    key: str,
    config: Mapping[str, Any],
    prediction_type: str | None = None,
    *,
    zero_terminal_snr: bool = False,
) -> Any:
    """The diffusers scheduler for the setting `key`, from a model's scheduler `config`, for
    its `prediction_type` ("epsilon", "v_prediction"; None keeps the config's). A model
    trained with zero terminal SNR gets rescaled betas and trailing timesteps; a sampler that
    cannot take them is one sentence."""
    import diffusers

    try:
        sampler, schedule = split(key)
    except KeyError:
        raise HalfSafeError(f"Unknown sampler {key!r}: use one of {', '.join(KEYS)}.") from None
    options: dict[str, Any] = dict(sampler.options)
    if schedule is not None:
        options.update(schedule.options)
    if prediction_type:
        options["prediction_type"] = prediction_type
    if zero_terminal_snr:
        if not sampler.zero_snr:
            raise HalfSafeError(
                f"The sampler {sampler.name} cannot run this model's zero-terminal-SNR "
                "schedule (diffusers' scheduler for it has no rescaled betas): choose Euler, "
                "DPM++ 2M or DDIM."
            )
        options.update(rescale_betas_zero_snr=True, timestep_spacing="trailing")
    scheduler_class = getattr(diffusers, sampler.scheduler)
    if sampler.scheduler in _TENSORS_TO_NUMPY:
        scheduler_class = _numpy_sigma_to_t(scheduler_class)
    return scheduler_class.from_config(config, **options)


def seeded(scheduler: Any, seeds: list[int]) -> Any:
    """`scheduler` with the fresh noise of a sampler that draws it from a Brownian tree (DPM++
    SDE) seeded by the images' `seeds`, one tree per image in batch order, as A1111 seeds it:
    the same seed makes the same image again on the same device, alone or in a batch. The
    tree is drawn on the latents' device, as diffusers and A1111 draw it (on a CPU it costs
    more than the rest of the step). Other schedulers draw their noise from the job's
    generators and are left as they are. Returns `scheduler`."""
    if hasattr(scheduler, "noise_sampler_seed"):
        scheduler.noise_sampler_seed = list(seeds)
    return scheduler


# diffusers 0.42.1's KDPM2 schedulers (DPM2, DPM2 a) hand torch tensors to NumPy in
# `_sigma_to_t` while they set their interpolated timesteps: NumPy 2 hands the result back
# through torch's older `__array_wrap__`, a DeprecationWarning today and a TypeError once NumPy
# drops it. HalfSafe's scheduler is diffusers' own with that one method given NumPy arrays.
_TENSORS_TO_NUMPY = ("KDPM2DiscreteScheduler", "KDPM2AncestralDiscreteScheduler")


@functools.cache
def _numpy_sigma_to_t(base: type) -> type:
    import numpy as np

    def _sigma_to_t(self, sigma, log_sigmas):
        return base._sigma_to_t(self, np.asarray(sigma), np.asarray(log_sigmas))

    # Named as diffusers' class, so that its config and the words that name it stay the same.
    return type(base.__name__, (base,), {"_sigma_to_t": _sigma_to_t, "__module__": __name__})
