"""Job results for GUI tests (health reports, generations, devices), built from core's own types, so the
window shows what it would show for a real job: the headline and every word come from core,
never from a test's copy.

The figures are those of an SDXL checkpoint on an RTX 3060 (fp16 everywhere, the VAE
overflowing in its third up-sampling block), the case users meet most.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from app.core.components import Status, Verdict
from app.core.fixing.fix_ranking import CandidateResult
from app.core.fixing.quality import Quality
from app.core.generation.records import GenerationRequest, GenerationResult, ImageResult
from app.core.hardware import DeviceInfo, HardwareReport, Quirk
from app.core.hardware.records import QuirkMatch
from app.core.hardware.selftest import OpResult, SelfTestResult
from app.core.health import (
    Advice,
    ComponentReport,
    Fix,
    FixCost,
    HealthReport,
    PrecisionOutcome,
    StepCost,
)
from app.core.health.report import BlockPeak, CheckResult
from app.core.identities import DeviceIdentity, ModelIdentity
from app.core.precision import PrecisionPlan
from app.core.run.stage_cost import StageCost
from app.core.settings import FIELDS, PRECISION_KEYS

SDXL = ModelIdentity(
    source="/models/sdxl.safetensors",
    name="sdxl",
    architecture="sdxl",
    format="single_file",
)
RTX_3060 = DeviceIdentity(kind="cuda", name="NVIDIA GeForce RTX 3060")
FP16 = {"text_encoder": "fp16", "text_encoder_2": "fp16", "unet": "fp16", "vae": "fp16"}
MARKDOWN = "# HalfSafe health check: sdxl\n\n- Verdict: **fixable**\n"

VAE_LAYER = "decoder.up_blocks.2.resnets.1.conv2"
ISLAND_SETTINGS = {"fp32_modules": ["vae:decoder.a.conv1", "vae:decoder.a.norm2"]}


def plan(**changes: Any) -> PrecisionPlan:
    """The plan of a check on the RTX 3060: fp16 everywhere unless `changes` say otherwise
    (`dtypes=` merges into fp16's, every other field replaces)."""
    dtypes = {**FP16, **changes.pop("dtypes", {})}
    return PrecisionPlan(device="cuda", dtypes=dtypes, **changes)


def _component(name: str, status: Status, max_abs: float, **values: Any) -> ComponentReport:
    headroom = 65504 / max_abs if max_abs else None
    return ComponentReport(
        name=name,
        dtype="fp16",
        status=status,
        max_abs=max_abs,
        headroom=headroom,
        first_bad_module=values.pop("first_bad_module", None),
        seconds=0.1,
        precisions={"fp16": PrecisionOutcome(status, True)},
        **values,
    )


def components() -> dict[str, ComponentReport]:
    """The text encoder fine, the UNet close to the limit, the VAE overflowing."""
    return {
        "text_encoder": _component(
            "text_encoder",
            Status.OK,
            310.0,
            blocks=[
                BlockPeak("text_model.embeddings", 2.0, False),
                BlockPeak("text_model.encoder", 310.0, False),
            ],
        ),
        "unet": _component(
            "unet",
            Status.AT_RISK,
            41000.0,
            blocks=[
                BlockPeak("down_blocks.0", 800.0, False),
                BlockPeak("mid_block", 41000.0, False),
            ],
        ),
        "vae": _component(
            "vae",
            Status.OVERFLOW,
            131000.0,
            first_bad_module=VAE_LAYER,
            blocks=[
                BlockPeak("post_quant_conv", 30.0, False),
                BlockPeak("decoder.mid_block", 9000.0, False),
                BlockPeak("decoder.up_blocks.2", None, True),
            ],
        ),
    }


def report(**changes: Any) -> HealthReport:
    """A report of the SDXL checkpoint on the RTX 3060; `changes` replace its fields."""
    values: dict[str, Any] = {
        "model": SDXL,
        "device": RTX_3060,
        "plan": plan(),
        "size": 1024,
        "weights_non_finite": [],
        "components": components(),
        "verdict": Verdict.HEALTHY,
        "fix": None,
        "seconds": 2.4,
    }
    values.update(changes)
    return HealthReport(**values)


def vae_fp32_fix() -> Fix:
    """The VAE in fp32, verified and timed against no-half."""
    return Fix(
        plan=plan(dtypes={"vae": "fp32"}),
        settings={"vae_precision": "fp32"},
        summary="The VAE overflowed; fix: run the VAE in fp32. Verified by re-running it.",
        verified=True,
        quality=Quality(200.0),
        steps=["run the VAE in fp32"],
        cost=FixCost(
            fix=StepCost(61.0, (59.5, 63.0), rounds=5, peak_memory_mb=7100.0, weights_mb=5300.0),
            no_half=StepCost(
                118.0, (116.0, 121.5), rounds=5, peak_memory_mb=12900.0, weights_mb=10500.0
            ),
        ),
    )


def fixable() -> HealthReport:
    return report(verdict=Verdict.FIXABLE, fix=vae_fp32_fix())


def healthy_with_advice() -> HealthReport:
    """Safe as checked in fp32, with the VAE predicted to overflow in fp16."""
    fp32 = {name: "fp32" for name in FP16}
    return report(
        plan=plan(dtypes=fp32),
        components={
            name: replace(c, status=Status.OK, first_bad_module=None)
            for name, c in components().items()
        },
        advice=Advice(["vae"], {"precision": "fp16", "vae_precision": "fp32"}, measured=False),
    )


def broken(tensor: str = "first_stage_model.decoder.conv_in.weight") -> HealthReport:
    return report(verdict=Verdict.BROKEN, weights_non_finite=[tensor])


def _candidate(kind: str, words: str, settings: dict, modules: int, **values: Any):
    return CandidateResult(
        component="vae",
        kind=kind,
        words=words,
        settings=settings,
        modules=modules,
        finite=values.pop("finite", True),
        quality=values.pop("quality"),
        **values,
    )


def islands() -> HealthReport:
    """Fixed by keeping two VAE layers in fp32; the whole VAE in fp32 verified too, a clamp
    rejected: every candidate listed with its cost."""
    islands_plan = plan(modules={"vae": {"decoder.a.conv1": "fp32", "decoder.a.norm2": "fp32"}})
    fix = replace(
        vae_fp32_fix(),
        plan=islands_plan,
        settings=dict(ISLAND_SETTINGS),
        summary="The VAE overflowed; fix: keep 2 layers of the VAE in fp32. Verified.",
        steps=["keep 2 layers of the VAE in fp32"],
        candidates=[
            _candidate(
                "islands",
                "keep 2 layers of the VAE in fp32",
                dict(ISLAND_SETTINGS),
                2,
                quality=Quality(55.3),
                chosen=True,
                cost=StageCost(5310.0, step_ms=40.0, step_ms_range=(39.0, 41.0)),
            ),
            _candidate(
                "component_fp32",
                "run the VAE in fp32",
                {"vae_precision": "fp32"},
                0,
                quality=Quality(200.0),
                cost=StageCost(5460.0, step_ms=80.0, step_ms_range=(79.0, 82.0)),
            ),
            _candidate(
                "clamp",
                # As the check words it: the layer named, a name with no space to wrap at.
                "clamp the fp16 output of 1 layer (decoder.up_blocks.0.resnets.0.conv1) of the "
                "VAE to +-65504",
                {"clamp_modules": ["vae:decoder.a.conv1"]},
                1,
                quality=Quality(4.2),
                cost=StageCost(5300.0),
            ),
        ],
        baselines={
            "vae": {
                "as_tested": StageCost(5300.0, step_ms=39.0, step_ms_range=(38.0, 40.0)),
                "no_half": StageCost(10500.0, step_ms=81.0, step_ms_range=(80.0, 83.0)),
            }
        },
    )
    return report(verdict=Verdict.FIXABLE, fix=fix)


def result(health: HealthReport, markdown: str = MARKDOWN) -> CheckResult:
    """What the engine sends back for a check."""
    return CheckResult(health, markdown)


def image(path: str, status: str = "ok", **values: Any) -> ImageResult:
    """One generated image as the engine sends it (seed 1234 unless given)."""
    return ImageResult(seed=values.pop("seed", 1234), status=status, path=path, **values)


def generation(document: dict[str, Any]) -> GenerationResult:
    """A generation's result on the RTX 3060, typed, from its parts: `images` (see `image`),
    `settings`, `seconds`, and optionally `warnings`, `model` (the SDXL checkpoint unless
    given), `save_error` and `job_fix` (a `JobFix`: the fix the job ran with for that job)."""
    return GenerationResult(
        images=list(document["images"]),
        settings=dict(document.get("settings") or {}),
        seconds=float(document.get("seconds", 1.0)),
        request=GenerationRequest(prompt="a lighthouse at dusk"),
        model=document.get("model") or SDXL,
        device=RTX_3060,
        warnings=list(document.get("warnings") or []),
        save_error=str(document.get("save_error") or ""),
        job_fix=document.get("job_fix"),
    )


def gtx_1660_super() -> HardwareReport:
    """A GTX 1660 SUPER whose fp16 convolutions fail the self-test: fp32 recommended."""
    recommended = {key: FIELDS[key].default for key in PRECISION_KEYS}
    recommended.update(
        precision="fp32",
        unet_precision="fp32",
        vae_precision="fp32",
        text_encoder_precision="fp32",
        text_encoder_2_precision="fp32",
        text_encoder_3_precision="fp32",
        no_half=True,
        no_half_vae=True,
        attention_backend="efficient",
        allow_tf32=False,
        auto_fix="auto",
    )
    card = DeviceInfo(
        kind="cuda",
        index=0,
        name="NVIDIA GeForce GTX 1660 SUPER",
        capability=(7, 5),
        memory_total_mb=6144,
        driver="570.1",
        fp16="unreliable",
        bf16="unsupported",
        tf32=False,
        quirks=(
            Quirk(
                id="nvidia-turing-gtx16-fp16-nan",
                summary="GTX 16xx cards can return NaN from fp16 convolutions.",
                source="https://github.com/pytorch/pytorch/issues/58123",
                match=QuirkMatch(name="GTX 16"),
                effects={"fp16": "unreliable"},
            ),
        ),
        recommended=recommended,
        reasons={
            "precision": "This card returns NaN from fp16 convolutions",
            "attention_backend": "The fastest backend that passed the self-test",
        },
        self_test=SelfTestResult(
            fp16="fail", bf16="skipped", details=[OpResult("conv2d 4->320", "fp16", "fail")]
        ),
    )
    return HardwareReport(halfsafe="0.1.0", torch="2.13.0", cuda="12.8", devices=[card])


def on_a_cpu(report: HardwareReport, **recommended: Any) -> HardwareReport:
    """`report` with its device made a CPU (no quirks), `recommended` laid over its values."""
    device = report.devices[0]
    cpu = replace(
        device,
        kind="cpu",
        index=None,
        name="AMD EPYC",
        capability=None,
        quirks=(),
        backend="cpu",
        recommended={**device.recommended, **recommended},
    )
    return replace(report, devices=[cpu])
