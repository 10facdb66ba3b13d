"""Whole jobs at real size through the `halfsafe` command: the peak RAM (RSS) of a check and a
generation, each in a process of its own, against the bound files + 1.5 GiB + the largest
stage's activations, and the same jobs under a 6 GB budget (`--max-vram 6`), whose verdicts,
first bad layers, fixes and images must be those of the jobs without one.

Models, random weights at the published shapes (memory does not depend on the values), written
as their users keep them:
- SDXL as one fp16 `.safetensors` in the original (A1111) layout, the file most SDXL users
  download; the real SDXL shapes (UNet 2.6B, both CLIPs, the VAE).
- A Flux.1-width transformer (3072 wide, 24 heads of 128; 2 double + 4 single blocks of Flux.1
  dev's 19 + 38, as `stored_memory.py` writes it) as GGUF Q4_0 (and, with `--forms`, bf16,
  fp8 scaled and int8 ConvRot) in ComfyUI's layout: diffusion_models/ beside text_encoders/clip_l.safetensors
  (CLIP-L whole, fp16), text_encoders/t5xxl.safetensors (T5-XXL at its real width, 4096 wide
  with 64 heads and a 10240-wide gated feed-forward, at `--t5-blocks` of its 24 blocks, fp16)
  and vae/ae.safetensors (the Flux VAE whole, fp32 as BFL ships it).
Each model is written twice: healthy, and with an fp16 overflow planted in the denoiser (one
layer's weights scaled so that its output passes 65504 in fp16 and stays finite in fp32, as
the tests plant them): SDXL's `down_blocks.1.attentions.0.transformer_blocks.0.ff.net.0.proj`,
the Flux transformer's `single_transformer_blocks.1.proj_out`.

Jobs, each `python -m app.cli ... --json --device cpu --precision fp16` in its own process with
fresh settings, profile and cache folders, without a budget and with `--max-vram 6`: a check of
the healthy and of the planted file (`--size`), and a generation of each (`--steps`, same size,
`--auto-fix auto`). The peak RSS is the process's own high-water mark (`wait4`'s ru_maxrss).

The bound's activations are estimated from the shapes at the job's size: four times the
largest tensor one layer of the stage makes in fp32 (its input, its output and two
intermediates alive at once), taken over the stages (text encoders at their token counts, the
denoiser's batch with CFG, the VAE decode at full size). At the small sizes used here it is tens
of MiB: the 1.5 GiB working set carries the bound.

About 45 minutes on a 2-core CPU with the defaults, and 24 GiB of RAM: a failing SDXL check
without a budget holds about 18 GiB there (on a CPU the check's device copies are RAM). Needs
about 25 GB of disk for the files (`--keep DIR` writes them there and reuses them).

Usage: python benchmarks/whole_job_memory.py [--models sdxl,flux] [--forms gguf_Q4_0,bf16,...]
       [--jobs check,generate] [--size 128] [--steps 2] [--t5-blocks 6] [--keep DIR]
       [--json FILE]
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, emit, machine, machine_line, names, status

HERE = Path(__file__).resolve().parent
GIB = 2**30
MIB = 2**20
WORKING_SET = 1.5 * GIB
MODELS = ("sdxl", "flux")
FORMS = ("gguf_Q4_0", "bf16", "fp8_scaled", "int8_convrot")
JOBS = ("check", "generate")
KINDS = ("healthy", "planted")
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "whole-job-memory-cpu.json"

SDXL_PLANT = ("down_blocks.1.attentions.0.transformer_blocks.0.ff.net.0.proj", 1e5)
# 3e4: past 65504 in fp16, while the decoded weights stay under the 1e4 that HalfSafe's scan
# takes for a broken quantisation (1e5 made the check call the file broken, rightly).
FLUX_PLANT = ("single_blocks.1.linear2.weight", 3e4)  # single_transformer_blocks.1.proj_out
FLUX_PLANT_WORDS = "single_transformer_blocks.1.proj_out"
T5_FULL_BLOCKS = 24


# --- writing the models (in a process of their own, so that none of it stays resident) ------


def write_sdxl(root: Path) -> dict[str, Path]:
    """SDXL as one fp16 single file, healthy and planted."""
    import torch

    from tests.support.model_files import build_random_pipeline, save_single_file

    folder = root / "sdxl" / "checkpoints"
    files = {k: folder / f"sdxl-{k}.safetensors" for k in ("healthy", "planted")}
    if all(path.is_file() for path in files.values()):
        return files  # written by an earlier run into the same --keep folder
    folder.mkdir(parents=True, exist_ok=True)
    with status("SDXL: random weights at the published shapes, fp16"):
        pipeline = build_random_pipeline("sdxl", dtype="fp16", seed=0)
    with status("SDXL: writing the healthy single file"):
        save_single_file(pipeline, files["healthy"])
    layer, factor = SDXL_PLANT
    with torch.no_grad():
        pipeline.unet.get_submodule(layer).weight.mul_(factor)
    with status(f"SDXL: writing the file with {layer} scaled by {factor:g}"):
        save_single_file(pipeline, files["planted"])
    return files


def flux_companions(t5_blocks: int):
    """A Flux.1 pipeline with real-width companions and a tiny transformer (not written)."""
    import diffusers
    import torch
    import transformers

    from app.core.checkpoint.assembly import empty
    from app.core.models.configs import config_folder, read_json
    from app.core.paths import resource
    from tests.support.model_files import _fill_from_pool
    from tests.support.tiny_models import (
        FLUX_SCHEDULER_CONFIG,
        clip_tokenizer,
        t5_tokenizer,
        tiny_flux_transformer,
    )

    generator = torch.Generator().manual_seed(1)
    pool = torch.randn(1 << 20, generator=generator).mul_(0.02)

    def filled(model, dtype):
        _fill_from_pool(model, pool.to(dtype))
        return model.eval()

    clip = read_json(config_folder("sd1") / "text_encoder" / "config.json")
    t5 = {**read_json(resource("configs", "flux", "text_encoder_2", "config.json"))}
    t5["num_layers"] = t5_blocks
    vae = read_json(resource("configs", "flux", "vae", "config.json"))
    return diffusers.FluxPipeline(
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(**FLUX_SCHEDULER_CONFIG),
        vae=filled(empty(diffusers.AutoencoderKL.from_config, vae), torch.float32),
        text_encoder=filled(
            empty(transformers.CLIPTextModel, transformers.CLIPTextConfig(**clip)), torch.float16
        ),
        tokenizer=clip_tokenizer(),
        text_encoder_2=filled(
            empty(transformers.T5EncoderModel, transformers.T5Config(**t5)), torch.float16
        ),
        tokenizer_2=t5_tokenizer(),
        transformer=tiny_flux_transformer(0),
    )


def write_flux(root: Path, forms: list[str], t5_blocks: int) -> dict:
    """The Flux-width transformer in each form, healthy and planted, with its companions in
    ComfyUI's layout under root/flux."""
    from quantized_load import random_bfl_state, write_form
    from stored_memory import transformer_config

    from tests.support.model_files import save_split_files

    models = root / "flux"
    with status(f"Flux companions: CLIP-L, T5-XXL width ({t5_blocks} blocks), the Flux VAE"):
        written = save_split_files(flux_companions(t5_blocks), models)
        written.pop("transformer").unlink()
    gc.collect()
    with status("Flux-width transformer: random weights"):
        state = random_bfl_state(transformer_config())
    files: dict = {"companions": {k: str(v) for k, v in written.items()}}
    name, factor = FLUX_PLANT
    for kind in ("healthy", "planted"):
        if kind == "planted":
            state[name] = state[name] * factor
        for form in forms:
            suffix = ".gguf" if form.startswith("gguf") else ".safetensors"
            path = models / "diffusion_models" / f"flux-width-{form}-{kind}{suffix}"
            with status(f"writing the {form} transformer ({kind})"):
                files[f"{form}:{kind}"] = str(write_form(form, state, path))
    return files


def write_models(root: Path, models: list[str], forms: list[str], t5_blocks: int) -> dict:
    files: dict = {}
    if "sdxl" in models:
        files["sdxl"] = {k: str(v) for k, v in write_sdxl(root).items()}
        gc.collect()
    if "flux" in models:
        files["flux"] = write_flux(root, forms, t5_blocks)
    return files


# --- running the jobs ----------------------------------------------------------------------


def run_job(command: list[str], scratch: Path, gpu: bool) -> dict:
    """One `halfsafe` command in a process of its own (niced, fresh HalfSafe folders): its
    peak RSS, wall time, exit status and --json document; with `gpu`, through
    `device_peak.py`, also the allocator's peak over the whole command."""
    for part in ("config", "data", "cache"):
        shutil.rmtree(scratch / part, ignore_errors=True)
    env = {
        **os.environ,
        "HALFSAFE_CONFIG_DIR": str(scratch / "config"),
        "HALFSAFE_DATA_DIR": str(scratch / "data"),
        "HALFSAFE_CACHE_DIR": str(scratch / "cache"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    out, err = scratch / "stdout.json", scratch / "stderr.txt"
    peak_file = scratch / "device-peak.json"
    peak_file.unlink(missing_ok=True)
    runner = [str(HERE / "device_peak.py"), str(peak_file)] if gpu else ["-m", "app.cli"]
    argv = ["nice", "-n", "10", sys.executable, *runner, *command]
    started = time.perf_counter()
    with out.open("wb") as stdout, err.open("wb") as stderr:
        child = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=stdout, stderr=stderr)
        _, code, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(code)
    seconds = time.perf_counter() - started
    try:
        document = json.loads(out.read_text())
    except ValueError:
        document = None
    try:
        device = json.loads(peak_file.read_text()) if gpu else None
    except (OSError, ValueError):
        device = None
    return {
        "argv": command,
        "exit": child.returncode,
        "device_allocated_bytes": device and device["allocated_bytes"],
        "device_reserved_bytes": device and device["reserved_bytes"],
        "seconds": round(seconds, 1),
        "peak_rss_bytes": usage.ru_maxrss * 1024,  # Linux: KiB
        "document": document,
        "stderr_tail": err.read_text(errors="replace")[-2000:],
    }


def outcome(job: str, document: dict | None, scratch: Path) -> dict:
    """What must not change with a budget: a check's verdict, each component's status and
    first bad layer and the fix; a generation's status, component, layer, fixes and pixels."""
    if document is None:
        return {"error": "no JSON"}
    if job == "check":
        fix = document.get("fix")
        return {
            "verdict": document.get("verdict"),
            "components": {
                name: [c.get("status"), c.get("first_bad_module")]
                for name, c in document.get("components", {}).items()
            },
            "fix": None
            if fix is None
            else {
                "dtypes": {k: v for k, v in fix.items() if isinstance(v, str) and k != "summary"},
                "modules": fix.get("modules"),
                "verified": fix.get("verified"),
            },
        }
    images = []
    for image in document.get("images", []):
        images.append(
            {
                "status": image.get("status"),
                "component": image.get("component"),
                "first_bad_module": image.get("first_bad_module"),
                "fixes_applied": image.get("fixes_applied"),
                "pixels": _pixels(image.get("path")),
                "vae_tiling": (image.get("settings") or {}).get("vae_tiling"),
            }
        )
    return {"images": images}


def _pixels(path: str | None) -> str | None:
    """A digest of the image's pixels (the PNG's text chunks name the budget, so its bytes
    differ)."""
    if not path or not Path(path).is_file():
        return None
    from PIL import Image

    with Image.open(path) as image:
        return hashlib.sha256(image.convert("RGB").tobytes()).hexdigest()[:16]


def command(
    job: str, model: str, size: int, steps: int, budget: float | None, out: Path, device: str
) -> list:
    words = [job, model, "--json", "--device", device, "--precision", "fp16"]
    if job == "check":
        words += ["--size", str(size)]
    else:
        words += ["--width", str(size), "--height", str(size), "--steps", str(steps)]
        words += ["--seed", "1234", "--auto-fix", "auto", "--out", str(out)]
    if budget is not None:
        words += ["--max-vram", f"{budget:g}"]
    return words


# --- the bound -------------------------------------------------------------------------------


def activations_bytes(model: str, size: int, t5_blocks: int) -> tuple[int, str]:
    """Four times the largest fp32 tensor one layer of any stage makes at `size` px, from the
    shapes (see the module docstring), and which layer that is."""
    fp32 = 4
    latent = size // 8
    if model == "sdxl":
        candidates = {
            # CLIP-G: 77 tokens, 1280 wide, a 5120-wide MLP, 20 heads of scores
            "text_encoder_2 MLP": 77 * 5120,
            "text_encoder_2 scores": 20 * 77 * 77,
            # UNet, CFG batch of 2: level 0 convolutions (320 channels at the latent size),
            # level 1 attention (640 wide, 10 heads, GEGLU 2 x 2560) at half of it
            "unet level 0 conv": 2 * 320 * latent**2,
            "unet level 1 GEGLU": 2 * (latent // 2) ** 2 * 5120,
            "unet level 1 scores": 2 * 10 * ((latent // 2) ** 2) ** 2,
            "unet level 2 scores": 2 * 20 * ((latent // 4) ** 2) ** 2,
            # VAE decode: 256 channels at full size before its last block narrows to 128
            "vae last up block": 256 * size**2,
        }
    else:
        tokens = 512 + (size // 16) ** 2
        candidates = {
            "text_encoder_2 (T5) feed-forward": 2 * 512 * 10240,
            "text_encoder_2 (T5) scores": 64 * 512 * 512,
            "transformer single block MLP": tokens * (3 * 3072 + 12288),
            "transformer scores": 24 * tokens * tokens,
            "vae last up block": 256 * size**2,
        }
    largest = max(candidates, key=lambda k: candidates[k])
    return 4 * fp32 * candidates[largest], largest


# --- the run ---------------------------------------------------------------------------------


def cases(files: dict, models: list[str], forms: list[str], kinds: list[str]) -> list[dict]:
    """(model and form, kind, the file the command gets, the files its job reads), in the
    order `models` names them."""
    found = []
    if "sdxl" in models:
        for kind in kinds:
            path = files["sdxl"][kind]
            found.append(
                {
                    "model": "sdxl",
                    "form": "SDXL fp16 single file",
                    "kind": kind,
                    "path": path,
                    "files_bytes": Path(path).stat().st_size,
                }
            )
    if "flux" in models:
        companions = sum(Path(p).stat().st_size for p in files["flux"]["companions"].values())
        for form in forms:
            for kind in kinds:
                path = files["flux"][f"{form}:{kind}"]
                found.append(
                    {
                        "model": "flux",
                        "form": f"Flux-width {form} + companions",
                        "kind": kind,
                        "path": path,
                        "files_bytes": Path(path).stat().st_size + companions,
                        "transformer_bytes": Path(path).stat().st_size,
                    }
                )
    return sorted(found, key=lambda case: models.index(case["model"]))


def run(args) -> dict:
    models = names(args.models, MODELS)
    forms = names(args.forms, FORMS[:1])
    jobs = names(args.jobs, JOBS)
    budgets = [None if b == "none" else float(b) for b in names(args.budgets, ("none", "6"))]
    document: dict = {
        "machine": machine(args.device),
        "device": args.device,
        "size": args.size,
        "steps": args.steps,
        "t5_blocks": args.t5_blocks,
        "budgets_gb": [b for b in budgets if b is not None],
        "runs": [],
    }
    holder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="halfsafe-whole-"))
    try:
        listing = holder / "files.json"
        if not listing.is_file():
            holder.mkdir(parents=True, exist_ok=True)
            with status("writing the models (a process of its own)"):
                subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--write",
                        str(holder),
                        "--models",
                        ",".join(models),
                        "--forms",
                        ",".join(forms),
                        "--t5-blocks",
                        str(args.t5_blocks),
                    ],
                    check=True,
                )
        files = json.loads(listing.read_text())
        document["files"] = files
        scratch = holder / "jobs"
        scratch.mkdir(exist_ok=True)
        for case in cases(files, models, forms, names(args.kinds, KINDS)):
            activations, layer = activations_bytes(case["model"], args.size, args.t5_blocks)
            for job in jobs:
                for budget in budgets:
                    words = f"{case['form']} {case['kind']}: {job}, budget {'none' if budget is None else f'{budget:g}'}"
                    out = scratch / f"{case['model']}-{case['kind']}-{job}-{budget or 0:g}.png"
                    with status(words):
                        result = run_job(
                            command(
                                job, case["path"], args.size, args.steps, budget, out, args.device
                            ),
                            scratch,
                            gpu=args.device.startswith("cuda"),
                        )
                    result.update(
                        {
                            **{k: v for k, v in case.items() if k != "path"},
                            "job": job,
                            "budget_gb": budget,
                            "activations_bytes": activations,
                            "activations_layer": layer,
                            "bound_bytes": case["files_bytes"] + int(WORKING_SET) + activations,
                            "outcome": outcome(job, result["document"], scratch),
                            "memory_line": _memory_line(result["document"]),
                        }
                    )
                    result["within"] = result["peak_rss_bytes"] <= result["bound_bytes"]
                    if result["device_allocated_bytes"] is not None:
                        print(
                            f"  device peak (allocator) "
                            f"{result['device_allocated_bytes'] / GIB:.2f} GiB, reserved "
                            f"{result['device_reserved_bytes'] / GIB:.2f} GiB",
                            file=sys.stderr,
                            flush=True,
                        )
                    print(
                        f"  peak RSS {result['peak_rss_bytes'] / GIB:.2f} GiB, bound "
                        f"{result['bound_bytes'] / GIB:.2f}, exit {result['exit']}, "
                        f"{result['seconds']} s",
                        file=sys.stderr,
                        flush=True,
                    )
                    done = (result["document"] or {}).get("work")
                    if done:  # a check's work, counted, and its own seconds after loading
                        print(
                            f"  the check {result['document'].get('seconds')} s after loading; "
                            f"work {json.dumps(done)}",
                            file=sys.stderr,
                            flush=True,
                        )
                    document["runs"].append(result)
                    if args.json and not args.append:
                        # Each job as it ends, so that a run stopped early keeps what it has.
                        Path(args.json).write_text(json.dumps(document, indent=1))
    finally:
        if not args.keep:
            shutil.rmtree(holder, ignore_errors=True)
    _agreement(document)
    return document


def _memory_line(document: dict | None):
    """The plan's memory record, where the --json document carries one."""
    if not document:
        return None
    for key in ("memory", "memory_plan", "plan"):
        if key in document:
            return document[key]
    return None


def _key(run: dict) -> tuple:
    return (run["form"], run["kind"], run["job"], run["budget_gb"])


def _agreement(document: dict) -> None:
    """Mark each budgeted run with whether it agrees with its run without a budget."""
    plain = {
        (r["form"], r["kind"], r["job"]): r for r in document["runs"] if r["budget_gb"] is None
    }
    for run in document["runs"]:
        if run["budget_gb"] is None:
            continue
        twin = plain.get((run["form"], run["kind"], run["job"]))
        run["agrees"] = twin is not None and _same(twin["outcome"], run["outcome"])
        if twin is not None:
            twin["agrees"] = run["agrees"]


def _same(plain: dict, budgeted: dict) -> bool:
    """Whether a budgeted job's outcome is its unbudgeted twin's. A budget that made the VAE
    decode in tiles changes the pixels by design (diffusers blends overlapping tiles): those
    two must agree in all else."""
    if plain == budgeted:
        return True

    def untiled(outcome: dict) -> list:
        return [
            {k: v for k, v in image.items() if k not in ("pixels", "vae_tiling")}
            for image in outcome.get("images", [])
        ]

    tiled = [i.get("vae_tiling") for i in budgeted.get("images", [])]
    return "on" in tiled and untiled(plain) == untiled(budgeted)


def _layers(component: str, modules: dict[str, str]) -> str:
    """A fix's layers in a few words: each one where there are few, else how many by dtype."""
    if len(modules) <= 3:
        return f"{component} " + ", ".join(f"{m} in {d}" for m, d in modules.items())
    counts = {d: sum(1 for v in modules.values() if v == d) for d in sorted(set(modules.values()))}
    return ", ".join(f"{n} {component} layers in {d}" for d, n in counts.items())


def said(run: dict) -> str:
    """The outcome in a few words."""
    found = run["outcome"]
    if "error" in found:
        return f"exit {run['exit']}: no JSON"
    if run["job"] == "check":
        bad = [f"{c}: {layer}" for c, (_, layer) in found["components"].items() if layer]
        fix = found["fix"]
        if fix is None:
            fixed = "no fix"
        else:
            islands = [
                _layers(component, modules)
                for component, modules in (fix["modules"] or {}).items()
                if modules
            ]
            whole = fix["dtypes"].get("precision_words") or json.dumps(fix["dtypes"])
            fixed = "fix: " + ("; ".join(islands) if islands else whole)
        return f"{found['verdict']}; {'; '.join(bad) or 'no bad layer'}; {fixed}"
    words = []
    for image in found["images"]:
        fixes = ", ".join(image["fixes_applied"] or []) or "no fix"
        at = f" at {image['component']}" if image["component"] else ""
        words.append(f"{image['status']}{at}; {fixes}; pixels {image['pixels']}")
    return " | ".join(words) or "no image"


def _device_peak(run: dict) -> str:
    """The plan's device peak (a check's `memory.peak_placed_mb`: what a GPU would hold of the
    weights; on a CPU the copies among it are RAM) and what the budget changed."""
    memory = run.get("memory_line")
    notes = []
    if run.get("device_allocated_bytes") is not None:
        notes.append(f"measured {run['device_allocated_bytes'] / GIB:.2f} GiB")
    if not isinstance(memory, dict) or memory.get("peak_placed_mb") is None:
        return "; ".join(notes) or "-"
    notes.append(f"planned {memory['peak_placed_mb'] / 1024:.2f} GiB")
    if memory.get("placements") is not None:
        notes.append(f"{memory['placements']} copies made in {memory['placing_s']:.1f} s")
    if memory.get("computed_in_place"):
        notes.append("in place: " + ", ".join(memory["computed_in_place"]))
    if memory.get("streamed"):
        notes.append("streamed: " + ", ".join(memory["streamed"]))
    return "; ".join(notes)


def table(document: dict) -> str:
    lines = [
        machine_line(document["machine"]) + f", {document['machine']['memory_gib']} GiB RAM",
        f"Each job: python -m app.cli ... --json --device {document.get('device', 'cpu')} "
        f"--precision fp16, in its own "
        f"process; check --size {document['size']}, generate {document['size']} px, "
        f"{document['steps']} steps; T5-XXL at {document['t5_blocks']} of {T5_FULL_BLOCKS} blocks",
        "",
        "| model / form | file | job | budget | peak RSS | files | bound | within | device peak | "
        "time | outcome | same as no budget |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in document["runs"]:
        agrees = run.get("agrees")
        budget = "none" if run["budget_gb"] is None else f"{run['budget_gb']:g} GB"
        lines.append(
            f"| {run['form']} | {run['kind']} | {run['job']} | "
            f"{budget} | "
            f"{run['peak_rss_bytes'] / GIB:.2f} GiB | {run['files_bytes'] / GIB:.2f} GiB | "
            f"{run['bound_bytes'] / GIB:.2f} GiB | {'yes' if run['within'] else 'NO'} | "
            f"{_device_peak(run)} | {run['seconds']:.0f} s | {said(run)} | "
            f"{'-' if agrees is None else 'yes' if agrees else 'NO'} |"
        )
    lines.append("")
    seen = set()
    for run in document["runs"]:
        if run["model"] not in seen:
            seen.add(run["model"])
            lines.append(
                f"Activations in the bound ({run['model']}): "
                f"{run['activations_bytes'] / MIB:.0f} MiB, 4 x the fp32 output of "
                f"{run['activations_layer']} at {document['size']} px."
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--forms", help=f"the Flux transformer's forms, of {', '.join(FORMS)}")
    parser.add_argument("--jobs", help=f"comma-separated, of {', '.join(JOBS)}")
    parser.add_argument("--kinds", help="healthy, planted or both (default)")
    parser.add_argument(
        "--budgets",
        help="comma-separated: none and GB figures for --max-vram (default: none,6)",
    )
    parser.add_argument("--append", action="store_true", help="add the runs to --json's runs")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--size", type=int, default=128, help="px, a multiple of 16")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--t5-blocks", type=int, default=6, help="of T5-XXL's 24")
    parser.add_argument("--keep", help="write the models here and keep them (reused if there)")
    parser.add_argument("--write", help=argparse.SUPPRESS)
    parser.add_argument("--show", help="print the table of a JSON file this script wrote")
    parser.add_argument("--json", default=str(DEFAULT_JSON))
    args = parser.parse_args()
    if args.show:
        print(table(json.loads(Path(args.show).read_text())))
        return
    if args.write:
        root = Path(args.write)
        files = write_models(
            root, names(args.models, MODELS), names(args.forms, FORMS[:1]), args.t5_blocks
        )
        (root / "files.json").write_text(json.dumps(files, indent=2))
        return
    document = run(args)
    if args.append and Path(args.json).is_file():
        # A new run replaces an earlier one of the same file, job and budget.
        earlier = json.loads(Path(args.json).read_text())
        new = {_key(run) for run in document["runs"]}
        kept = [run for run in earlier["runs"] if _key(run) not in new]
        document["runs"] = kept + document["runs"]
        document["files"] = {**earlier.get("files", {}), **document.get("files", {})}
        _agreement(document)
    emit(document, table(document), args.json)
    if any(run.get("agrees") is False for run in document["runs"]):
        print("Budget and no budget DISAGREE: see the table.", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
