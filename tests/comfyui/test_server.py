"""HalfSafe's nodes in ComfyUI's real server: started from its own main.py on 127.0.0.1 with
the node package linked into the custom_nodes folder of a base directory of its own (the
vendored ComfyUI folder is not changed), asked over its HTTP API what nodes it has, then given
one workflow a family that runs the three nodes and ComfyUI's own KSampler on a planted file
from its models folder, read back from its history, its output folder and its log, then
stopped. Every wait is bounded.

Each family's workflow samples the planted model four ways from the same zeros (server_inputs/:
the text and latent HalfSafe Check feeds a model without a CLIP, standing in for text encoders
too large for a CPU): as loaded, in fp16 (ComfyUI's `--fp16-unet`, as a user on a card without
bf16 runs it); in fp32 (ComfyUI's own compute-dtype node), the reference; through HalfSafe
Check into HalfSafe Fix and a NaN Watch; and under a NaN Watch with its repair on and no fix
connected. The latents come back through ComfyUI's SaveLatent, the words through its
PreviewAny.

The files: SD1's and SDXL's UNets written by ComfyUI's own class (serve.py, drive.py: SDXL at
its released depths and 320 channels throughout, as ComfyUI's detection takes it), Flux.1,
Flux.2 Klein and SD3.5 tiny (comfyui_dits.py), Krea 2, Anima and Qwen-Image as ComfyUI's
detection takes them (comfyui_families.py: Qwen-Image at its released width, one block). Z-Image
and Chroma, ComfyUI's at their released widths alone, are checked and fixed through ComfyUI's
own loader in test_dit_families.py: here a sampling of theirs would take minutes a family and
ask what Flux.1's (a model whose code hides the overflow too) and Qwen-Image's already ask."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.comfyui_env import COMFYUI, NEEDS_COMFYUI, PACKAGE, PYTHON

ROOT = Path(__file__).resolve().parents[2]
START_S, RUN_S, STOP_S = 180, 600, 20
SIZE, STEPS = 64, 2

pytestmark = NEEDS_COMFYUI


SERVED_FILES = ("krea2", "anima", "qwenimage")  # of comfyui_families.FAMILY_FILES


@dataclass(frozen=True)
class Planted:
    file: str  # in the server's models/diffusion_models
    layer: str  # the planted layer, in ComfyUI's names
    island: str  # the module HalfSafe Check proves in fp32, in ComfyUI's names
    hidden: bool  # the model's own code turns fp16's inf and NaN into finite values


def planted_files() -> dict[str, Planted]:
    from tests.support.comfyui_dits import TINY_DITS
    from tests.support.comfyui_families import FAMILY_FILES

    files = {
        "sd1": Planted(
            "tiny_sd1_unet.safetensors",
            "input_blocks.1.1.transformer_blocks.0.attn1.to_q",
            "input_blocks.1.1.transformer_blocks.0.attn1",
            False,
        )
    }
    files["sdxl"] = Planted(
        "sdxl_planted.safetensors",
        "input_blocks.4.1.transformer_blocks.0.attn1.to_q",
        "input_blocks.4.1.transformer_blocks.0.attn1",
        False,
    )
    for family, dit in TINY_DITS.items():  # the island: the planted layer's block
        block = ".".join(dit.comfyui_layer.split(".")[:2])
        hidden = family.startswith("flux")
        files[family] = Planted(
            f"tiny_{family}_planted.safetensors", dit.comfyui_layer, block, hidden
        )
    for family in SERVED_FILES:  # none of whose code hides the overflow
        made = FAMILY_FILES[family]
        files[family] = Planted(
            f"{family}_planted.safetensors", made.comfyui_layer, made.island, False
        )
    return files


FAMILIES = ["sd1", "sdxl", "flux", "flux2klein", "sd3", "krea2", "anima", "qwenimage"]


def workflow(file: str) -> dict:
    """The four samplings of one planted file, with the nodes' words shown by PreviewAny."""
    loader = {"class_type": "UNETLoader", "inputs": {"unet_name": file, "weight_dtype": "default"}}
    zeros = {"class_type": "HalfSafeTestZeroText", "inputs": {"model": ["1", 0]}}
    zeros["inputs"].update(width=SIZE, height=SIZE)

    def sample(model: list, name: str) -> dict:
        inputs = {"model": model, "seed": 0, "steps": STEPS, "cfg": 1.0, "denoise": 1.0}
        inputs.update(sampler_name="euler", scheduler="normal")
        inputs.update(positive=["2", 0], negative=["2", 0], latent_image=["2", 1])
        return {"class_type": "KSampler", "inputs": inputs}

    def save(samples: str, name: str) -> dict:
        prefix = f"latents/{Path(file).stem}_{name}"
        return {"class_type": "SaveLatent", "inputs": {"samples": [samples, 0], "filename_prefix": prefix}}  # fmt: skip

    def show(node: str, output: int) -> dict:
        return {"class_type": "PreviewAny", "inputs": {"source": [node, output]}}

    check = {"model": ["1", 0], "width": SIZE, "height": SIZE, "steps": STEPS, "seed": 0}
    return {
        "1": loader,
        "2": zeros,
        "3": sample(["1", 0], "plain"),
        "4": save("3", "plain"),
        "5": {"class_type": "ModelComputeDtype", "inputs": {"model": ["1", 0], "dtype": "fp32"}},
        "6": sample(["5", 0], "reference"),
        "7": save("6", "reference"),
        "8": {"class_type": "HalfSafeCheck", "inputs": check},
        "9": {"class_type": "HalfSafeFix", "inputs": {"model": ["1", 0], "fix": ["8", 2]}},
        "10": {"class_type": "HalfSafeNaNWatch", "inputs": {"model": ["9", 0], "repair": False}},
        "11": sample(["10", 0], "fixed"),
        "12": save("11", "fixed"),
        "13": {"class_type": "HalfSafeNaNWatch", "inputs": {"model": ["1", 0], "repair": True}},
        "14": sample(["13", 0], "repaired"),
        "15": save("14", "repaired"),
        "16": show("8", 2),  # the proved fix
        "17": show("9", 1),  # what HalfSafe Fix applied
    }


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Server:
    def __init__(self, port: int, process: subprocess.Popen, base: Path, log: Path) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.process = process
        self.base = base
        self.log = log

    def get(self, path: str):
        with urllib.request.urlopen(self.url + path, timeout=30) as answer:
            return json.loads(answer.read())

    def post(self, path: str, body: dict):
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read())

    def wait_for(self, path: str, seconds: float, ready=bool):
        """GET `path` until `ready` of its answer is true (the server still running)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            assert self.process.poll() is None, self.log.read_text()[-4000:]
            try:
                answer = self.get(path)
                if ready(answer):
                    return answer
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(1)
        raise AssertionError(f"no answer at {path} in {seconds} s:\n{self.log.read_text()[-4000:]}")

    def run(self, prompt: dict) -> dict:
        """Queue `prompt`, wait for it, and give back its history entry."""
        queued = self.post("/prompt", {"prompt": prompt, "client_id": "halfsafe-tests"})
        prompt_id = queued["prompt_id"]
        history = self.wait_for(f"/history/{prompt_id}", RUN_S, ready=lambda h: prompt_id in h)
        return history[prompt_id]

    def latent(self, run: dict, node: str):
        """The latent SaveLatent node `node` wrote in this run."""
        from safetensors.torch import load_file

        (saved,) = run["outputs"][node]["latents"]
        path = self.base / "output" / saved["subfolder"] / saved["filename"]
        return load_file(str(path))["latent_tensor"].float()

    def stop(self) -> int:
        """Stop the server's process group (SIGINT as Ctrl+C, then SIGKILL); its status."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
            try:
                self.process.wait(STOP_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(STOP_S)
        return self.process.returncode


def write_planted(folder: Path) -> None:
    """Every family's planted file but SD1's (serve.py writes that one with ComfyUI's class),
    in a process of its own: the released widths' weights go back to the system before the
    server loads them."""
    code = (
        "import sys\n"
        "from tests.support.comfyui_dits import TINY_DITS, write_tiny_dit\n"
        "from tests.support.comfyui_families import write_family_file\n"
        "for f in TINY_DITS: write_tiny_dit(f, sys.argv[1], True)\n"
        "for f in sys.argv[2:]: write_family_file(f, sys.argv[1], True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(folder), *SERVED_FILES],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-4000:]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("server")
    base = root / "comfyui"
    nodes = base / "custom_nodes"
    nodes.mkdir(parents=True)
    (nodes / PACKAGE.name).symlink_to(PACKAGE, target_is_directory=True)
    inputs = Path(__file__).with_name("server_inputs")
    (nodes / "halfsafe_test_inputs").symlink_to(inputs, target_is_directory=True)
    models = base / "models" / "diffusion_models"
    models.mkdir(parents=True)
    write_planted(models)
    port = free_port()
    log = root / "server.log"
    env = {
        **os.environ,
        "HALFSAFE_DATA_DIR": str(root / "data"),
        "HALFSAFE_CACHE_DIR": str(root / "cache"),
        "OMP_NUM_THREADS": "1",
    }
    serve = [PYTHON, str(Path(__file__).with_name("serve.py")), COMFYUI, str(base), str(port)]
    with log.open("w") as out:
        process = subprocess.Popen(
            [*serve, "--fp16-unet"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=root,
            start_new_session=True,  # its own process group, stopped whole
        )
    running = Server(port, process, base, log)
    try:
        running.wait_for("/object_info", START_S)
        yield running
    finally:
        running.stop()
        for file in models.iterdir():  # up to 2.2 GB a file: not kept for the session's end
            file.unlink()
    assert process.poll() is not None


def test_the_real_server_lists_the_nodes(server):
    info = server.get("/object_info")
    for name in ("HalfSafeCheck", "HalfSafeFix", "HalfSafeNaNWatch"):
        assert name in info, sorted(info)[:20]
    check = info["HalfSafeCheck"]
    assert check["display_name"] == "HalfSafe Check"
    assert set(check["input"]["required"]) == {"model", "width", "height", "steps", "seed"}
    assert set(check["input"]["optional"]) == {"clip", "vae"}
    assert check["output"] == ["STRING", "IMAGE", "HALFSAFE_FIX"]
    assert set(info["HalfSafeFix"]["input"]["required"]) == {"model"}
    assert set(info["HalfSafeFix"]["input"]["optional"]) == {"fix", "vae", "clip"}
    # The VAE and CLIP outputs come after the others: existing workflows' links keep their
    # indices.
    assert info["HalfSafeFix"]["output"] == ["MODEL", "STRING", "VAE", "CLIP"]
    assert info["HalfSafeNaNWatch"]["output"] == ["MODEL"]


def db(latent, reference) -> float:
    from app.core.fixing.quality import compare

    return compare(latent, reference).value


@pytest.mark.parametrize("family", FAMILIES)
def test_a_queued_workflow_checks_fixes_and_watches_the_family(server, family):
    import torch

    planted = planted_files()[family]
    start = server.log.stat().st_size
    run = server.run(workflow(planted.file))
    assert run["status"]["status_str"] == "success", run["status"]
    said = server.log.read_text()[start:]

    # HalfSafe Check: the planted layer named in ComfyUI's names, its island proved.
    (report,) = run["outputs"]["8"]["text"]
    assert f"First bad layer: diffusion_model.{planted.layer}" in report
    fix = json.loads(run["outputs"]["16"]["text"][0])
    assert fix["islands"] == {planted.island: "fp32"} and fix["component"] is None
    threshold = fix["quality"]["threshold"]
    assert fix["quality"]["value"] >= threshold

    # HalfSafe Fix: that island alone patched, the rest as loaded.
    (applied,) = run["outputs"]["17"]["text"]
    kept = f"HalfSafe Fix: 1 layer(s) kept wider (diffusion_model.{planted.island} in fp32)."
    assert applied == kept

    reference = server.latent(run, "7")
    plain, fixed, repaired = (server.latent(run, n) for n in ("4", "12", "15"))
    assert torch.isfinite(reference).all()
    # As loaded, the sampling is black (non-finite), or finite where the model's own code
    # replaced fp16's inf and NaN, and then far from fp32's.
    assert bool(torch.isfinite(plain).all()) == planted.hidden
    # With the check's fix: fp32's sampling, within the fix's proved quality.
    assert torch.isfinite(fixed).all() and db(fixed, reference) >= threshold
    if planted.hidden:  # and further from it than the fixed sampling by far
        assert db(plain, reference) < db(fixed, reference) - 20
    # The watch with its repair on: the failed run named and sampled again with a fix.
    step = f"HalfSafe NaN Watch: step 1 of {STEPS} went non-finite in the diffusion model"
    assert f"{step}; first bad layer diffusion_model.{planted.layer}." in said, said[-3000:]
    # That run alone went non-finite: the watch on the fixed model (every block and part of it
    # read) and the repaired run's watch said nothing. (The log holds each line twice: plain,
    # and coloured for the console.)
    assert said.count("root:HalfSafe NaN Watch: step") == 1, said[-3000:]
    assert "Repaired: sampled again" in said
    assert torch.isfinite(repaired).all() and db(repaired, reference) >= threshold
    assert not math.isnan(db(repaired, reference))
