"""HalfSafe's nodes in ComfyUI's real server: started from its own main.py on 127.0.0.1 with
the node package linked into the custom_nodes folder of a base directory of its own (the
vendored ComfyUI folder is not changed), asked over its HTTP API what nodes it has, given a
workflow that checks a tiny planted SD1 UNet from its models folder, read back from its
history, then stopped. Every wait is bounded."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.support.comfyui_env import COMFYUI, NEEDS_COMFYUI, PACKAGE, PYTHON

ROOT = Path(__file__).resolve().parents[2]
LAYER = "diffusion_model.input_blocks.1.1.transformer_blocks.0.attn1.to_q"
ISLAND = "diffusion_model.input_blocks.1.1.transformer_blocks.0.attn1"
START_S, RUN_S, STOP_S = 180, 240, 20

pytestmark = NEEDS_COMFYUI

WORKFLOW = {
    "1": {
        "class_type": "UNETLoader",
        "inputs": {"unet_name": "tiny_sd1_unet.safetensors", "weight_dtype": "default"},
    },
    "2": {
        "class_type": "HalfSafeCheck",
        "inputs": {"model": ["1", 0], "width": 64, "height": 64, "steps": 4, "seed": 0},
    },
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Server:
    def __init__(self, port: int, process: subprocess.Popen, log: Path) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.process = process
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


@pytest.fixture
def server(tmp_path):
    base = tmp_path / "comfyui"
    (base / "custom_nodes").mkdir(parents=True)
    (base / "custom_nodes" / PACKAGE.name).symlink_to(PACKAGE, target_is_directory=True)
    port = free_port()
    log = tmp_path / "server.log"
    env = {
        **os.environ,
        "HALFSAFE_DATA_DIR": str(tmp_path / "data"),
        "HALFSAFE_CACHE_DIR": str(tmp_path / "cache"),
        "OMP_NUM_THREADS": "1",
    }
    with log.open("w") as out:
        process = subprocess.Popen(
            [PYTHON, str(Path(__file__).with_name("serve.py")), COMFYUI, str(base), str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp_path,
            start_new_session=True,  # its own process group, stopped whole
        )
    running = Server(port, process, log)
    try:
        yield running
    finally:
        running.stop()
    assert process.poll() is not None


def test_the_real_server_lists_the_nodes_and_runs_check_from_a_queued_workflow(server):
    info = server.wait_for("/object_info", START_S)
    for name in ("HalfSafeCheck", "HalfSafeFix", "HalfSafeNaNWatch"):
        assert name in info, sorted(info)[:20]
    check = info["HalfSafeCheck"]
    assert check["display_name"] == "HalfSafe Check"
    assert set(check["input"]["required"]) == {"model", "width", "height", "steps", "seed"}
    assert set(check["input"]["optional"]) == {"clip", "vae"}
    assert check["output"] == ["STRING", "IMAGE", "HALFSAFE_FIX"]
    assert set(info["HalfSafeFix"]["input"]["required"]) == {"model"}
    assert set(info["HalfSafeFix"]["input"]["optional"]) == {"fix", "vae"}
    # The VAE output comes after the others: existing workflows' links keep their indices.
    assert info["HalfSafeFix"]["output"] == ["MODEL", "STRING", "VAE"]
    assert info["HalfSafeNaNWatch"]["output"] == ["MODEL"]

    queued = server.post("/prompt", {"prompt": WORKFLOW, "client_id": "halfsafe-tests"})
    prompt_id = queued["prompt_id"]
    history = server.wait_for(f"/history/{prompt_id}", RUN_S, ready=lambda h: prompt_id in h)
    run = history[prompt_id]
    assert run["status"]["status_str"] == "success", run["status"]
    (report,) = run["outputs"]["2"]["text"]
    assert f"First bad layer: {LAYER} (HalfSafe: unet.down_blocks.0.attentions.0." in report
    assert f"Keep 1 layer(s) in fp32: {ISLAND}" in report
