"""Which PyTorch build the bootstrap picks, from recorded nvidia-smi and rocminfo outputs."""

from __future__ import annotations

import pytest
from installer_bootstrap import bootstrap as bs
from installer_bootstrap import fixture_text as read_fixture

REQUIREMENT = "torch>=2.6,<3"


@pytest.fixture
def fixture_text():
    return read_fixture


def nvidia_facts(fixture_text, name, compute_caps="", system="Linux"):
    info = bs.parse_nvidia_smi(fixture_text(name))
    assert info is not None, name
    capabilities = bs.parse_compute_capabilities(compute_caps)
    return bs.MachineFacts(
        system=system,
        nvidia=bs.NvidiaInfo(info.driver, info.max_cuda, info.gpus, capabilities),
    )


@pytest.mark.parametrize(
    ("fixture", "driver", "cuda", "gpus"),
    [
        ("nvidia-smi-470-gtx1080ti.txt", "470.103.01", (11, 4), ("NVIDIA GeForce ...",)),
        ("nvidia-smi-535-rtx3060.txt", "535.129.03", (12, 2), ("NVIDIA GeForce RTX 3060",)),
        ("nvidia-smi-550-t4.txt", "550.54.15", (12, 4), ("Tesla T4",)),
        ("nvidia-smi-570-rtx4090.txt", "570.124.04", (12, 8), ("NVIDIA GeForce RTX 4090",)),
        ("nvidia-smi-576-windows-rtx4060.txt", "576.88", (12, 9), ("NVIDIA GeForce RTX 4060 ...",)),
        ("nvidia-smi-580-gtx1080ti.txt", "580.82.09", (13, 0), ("NVIDIA GeForce GTX 1080 Ti",)),
        (
            "nvidia-smi-595-2xh100.txt",
            "595.45.04",
            (13, 2),
            ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"),
        ),
    ],
)
def test_nvidia_smi_tables_are_read(fixture_text, fixture, driver, cuda, gpus):
    info = bs.parse_nvidia_smi(fixture_text(fixture))
    assert (info.driver, info.max_cuda, info.gpus) == (driver, cuda, gpus)


def test_nvidia_smi_without_a_driver_means_no_nvidia_gpu(fixture_text):
    assert bs.parse_nvidia_smi(fixture_text("nvidia-smi-no-driver.txt")) is None
    facts = bs.MachineFacts(system="Linux", nvidia=None)
    assert bs.choose_torch(facts, REQUIREMENT, {}).tag == "cpu"


@pytest.mark.parametrize(
    ("fixture", "compute_caps", "system", "tag"),
    [
        # CUDA 12.2 driver: only the CUDA 11.8 build runs on it.
        ("nvidia-smi-535-rtx3060.txt", "8.6\n", "Linux", "cu118"),
        ("nvidia-smi-550-t4.txt", "7.5\n", "Linux", "cu124"),
        # CUDA 12.8 driver, Ada card: 12.6 still gets new releases, 12.8 stopped at torch 2.11.
        ("nvidia-smi-570-rtx4090.txt", "8.9\n", "Linux", "cu126"),
        # Blackwell needs CUDA 12.8 or newer; 12.6 has no kernels for it.
        ("nvidia-smi-570-rtx5090.txt", "12.0\n", "Linux", "cu128"),
        ("nvidia-smi-576-windows-rtx4060.txt", "8.9\n", "Windows", "cu126"),
        # CUDA 13 driver, but a Pascal card: CUDA 13 builds cannot run on it.
        ("nvidia-smi-580-gtx1080ti.txt", "6.1\n", "Linux", "cu126"),
        ("nvidia-smi-595-2xh100.txt", "9.0\n9.0\n", "Linux", "cu132"),
    ],
)
def test_cuda_build_follows_the_driver_and_the_card(
    fixture_text, fixture, compute_caps, system, tag
):
    facts = nvidia_facts(fixture_text, fixture, compute_caps, system)
    choice = bs.choose_torch(facts, REQUIREMENT, {})
    assert choice.kind == "cuda"
    assert choice.tag == tag
    assert choice.index_url == f"https://download.pytorch.org/whl/{tag}"
    assert choice.requirement == REQUIREMENT
    assert "driver" in choice.reason


def test_card_generation_is_guessed_from_its_name_when_the_driver_cannot_say(fixture_text):
    facts = nvidia_facts(fixture_text, "nvidia-smi-580-gtx1080ti.txt", compute_caps="")
    assert bs.choose_torch(facts, REQUIREMENT, {}).tag == "cu126"
    unreadable = 'Field "compute_cap" is not a valid field to query.\n'
    assert bs.parse_compute_capabilities(unreadable) == ()


def test_driver_too_old_for_any_build_falls_back_to_cpu_and_says_so(fixture_text):
    facts = nvidia_facts(fixture_text, "nvidia-smi-470-gtx1080ti.txt", compute_caps="")
    choice = bs.choose_torch(facts, REQUIREMENT, {})
    assert choice.tag == "cpu"
    assert choice.index_url == "https://download.pytorch.org/whl/cpu"
    assert "470.103.01" in choice.warning and "nvidia.com" in choice.warning


@pytest.mark.parametrize(
    ("driver", "windows", "cuda"),
    [
        ("595.45.04", False, (13, 2)),
        ("590.48.01", False, (13, 0)),
        ("581.42", True, (13, 0)),
        ("570.86.10", False, (12, 8)),
        ("572.16", True, (12, 8)),
        ("560.76", True, (12, 6)),
        ("555.42.06", False, (12, 4)),
        ("550.54.13", False, (11, 8)),
        ("470.256.02", False, None),
    ],
)
def test_driver_table_gives_the_newest_cuda_a_driver_runs(driver, windows, cuda):
    assert bs.max_cuda_for_driver(driver, windows) == cuda


def test_driver_without_a_cuda_field_uses_the_table():
    facts = bs.MachineFacts(
        system="Linux",
        nvidia=bs.NvidiaInfo(driver="580.65.06", max_cuda=None, capabilities=((8, 9),)),
    )
    assert bs.choose_torch(facts, REQUIREMENT, {}).tag == "cu130"


def test_rocminfo_lists_gpu_agents_only(fixture_text):
    assert bs.parse_rocminfo(fixture_text("rocminfo-rx7900xtx.txt")) == (
        "AMD Radeon RX 7900 XTX (gfx1100)",
    )
    assert bs.parse_rocminfo(fixture_text("rocminfo-cpu-only.txt")) == ()


def test_amd_gpu_on_linux_gets_the_rocm_build(fixture_text):
    gpus = bs.parse_rocminfo(fixture_text("rocminfo-rx7900xtx.txt"))
    newest = bs.choose_torch(bs.MachineFacts(system="Linux", amd_gpus=gpus), REQUIREMENT, {})
    assert (newest.kind, newest.tag) == ("rocm", "rocm7.2")
    assert newest.index_url == "https://download.pytorch.org/whl/rocm7.2"
    assert "RX 7900 XTX" in newest.reason

    # A system ROCm 6.4 install: stay at or below it.
    pinned = bs.choose_torch(
        bs.MachineFacts(
            system="Linux", amd_gpus=gpus, rocm_version=bs.parse_rocm_version("6.4.1-120")
        ),
        REQUIREMENT,
        {},
    )
    assert pinned.tag == "rocm6.4"


def test_rocm_without_a_gpu_and_amd_on_windows_get_the_cpu_build(fixture_text):
    cpu_only = bs.parse_rocminfo(fixture_text("rocminfo-cpu-only.txt"))
    assert (
        bs.choose_torch(bs.MachineFacts(system="Linux", amd_gpus=cpu_only), REQUIREMENT, {}).tag
        == "cpu"
    )
    windows = bs.MachineFacts(system="Windows", amd_gpus=("AMD Radeon RX 7900 XTX (gfx1100)",))
    assert bs.choose_torch(windows, REQUIREMENT, {}).tag == "cpu"


def test_macos_gets_the_standard_build_from_pypi():
    choice = bs.choose_torch(bs.MachineFacts(system="Darwin"), REQUIREMENT, {})
    assert choice.kind == "default"
    assert choice.index_url is None
    assert choice.requirement == REQUIREMENT


def test_no_gpu_gets_the_cpu_index():
    choice = bs.choose_torch(bs.MachineFacts(system="Linux"), REQUIREMENT, {})
    assert (choice.kind, choice.index_url) == ("cpu", "https://download.pytorch.org/whl/cpu")


def test_spec_override_replaces_the_choice_and_leaves_the_index_to_pip(fixture_text):
    facts = nvidia_facts(fixture_text, "nvidia-smi-570-rtx4090.txt", "8.9\n")
    choice = bs.choose_torch(facts, REQUIREMENT, {"HALFSAFE_TORCH_SPEC": "torch==2.13.0"})
    assert (choice.kind, choice.requirement, choice.index_url) == (
        "override",
        "torch==2.13.0",
        None,
    )

    with_index = bs.choose_torch(
        facts,
        REQUIREMENT,
        {"HALFSAFE_TORCH_SPEC": "torch==2.13.0", "HALFSAFE_TORCH_INDEX": "https://example.org/whl"},
    )
    assert with_index.index_url == "https://example.org/whl"


def test_index_override_keeps_the_automatic_choice(fixture_text):
    facts = nvidia_facts(fixture_text, "nvidia-smi-570-rtx4090.txt", "8.9\n")
    choice = bs.choose_torch(
        facts, REQUIREMENT, {"HALFSAFE_TORCH_INDEX": "https://mirror.example/cu126"}
    )
    assert (choice.tag, choice.index_url) == ("cu126", "https://mirror.example/cu126")


def test_automatic_choices_off_macos_always_name_a_pytorch_index(fixture_text):
    """An unpinned torch from PyPI would be PyPI's default CUDA build, gigabytes of it: never ask for that."""
    facts = [bs.MachineFacts(system="Linux"), bs.MachineFacts(system="Windows")]
    for name in (
        "nvidia-smi-470-gtx1080ti.txt",
        "nvidia-smi-570-rtx4090.txt",
        "nvidia-smi-595-2xh100.txt",
    ):
        facts.append(nvidia_facts(fixture_text, name))
    for fact in facts:
        assert bs.choose_torch(fact, REQUIREMENT, {}).index_url.startswith(
            "https://download.pytorch.org/whl/"
        )


@pytest.mark.parametrize(
    ("installed", "tag", "accepted"),
    [
        ("2.13.0+cu126", "cu126", True),
        ("2.9.1+cu128", "cu126", True),  # an older CUDA build that the driver still runs
        ("2.13.0+cu130", "cu126", False),  # needs a newer driver than this one has
        ("2.13.0+cpu", "cu126", False),  # would leave the GPU unused
        ("2.13.0", "cu126", False),  # PyPI's own build: which CUDA is unknown
        ("2.5.1+cu124", "cu126", False),  # older than the app needs
        (None, "cu126", False),
    ],
)
def test_installed_torch_is_kept_only_when_it_fits(fixture_text, installed, tag, accepted):
    facts = nvidia_facts(fixture_text, "nvidia-smi-570-rtx4090.txt", "8.9\n")
    choice = bs.choose_torch(facts, REQUIREMENT, {})
    assert choice.tag == tag
    assert choice.accepts(installed) is accepted


def test_cpu_and_override_choices_keep_any_build_that_matches_the_version():
    cpu = bs.choose_torch(bs.MachineFacts(system="Linux"), REQUIREMENT, {})
    assert cpu.accepts("2.13.0+cpu") and cpu.accepts("2.13.0+cu126")
    pinned = bs.choose_torch(
        bs.MachineFacts(system="Linux"), REQUIREMENT, {"HALFSAFE_TORCH_SPEC": "torch==2.13.0"}
    )
    assert pinned.accepts("2.13.0+cpu")
    assert not pinned.accepts("2.12.1+cpu")
    url = bs.choose_torch(
        bs.MachineFacts(system="Linux"),
        REQUIREMENT,
        {"HALFSAFE_TORCH_SPEC": "torch @ file:///w/t.whl"},
    )
    assert not url.accepts("2.13.0+cpu")  # cannot tell: install it


@pytest.mark.parametrize(
    ("requirement", "version", "result"),
    [
        ("torch>=2.6,<3", "2.13.0+cpu", True),
        ("torch>=2.6,<3", "2.5.1", False),
        ("torch>=2.6,<3", "3.0.0", False),
        ("torch==2.13.0", "2.13.0+cpu", True),
        ("torch==2.13.0", "2.13.1", False),
        ("torch==2.13.0+cpu", "2.13.0+cu126", False),
        ("torch==2.13.*", "2.13.4+cu130", True),
        ("torch==2.13.*", "2.14.0", False),
        ("torch!=2.9.0", "2.9.0", False),
        ("torch~=2.12", "2.13.0", True),
        ("torch~=2.12.0", "2.13.0", False),
        ("torch", "2.13.0", True),
        ("torch @ https://example.org/torch.whl", "2.13.0", None),
        ("numpy>=1", "2.0", None),
    ],
)
def test_requirement_matching(requirement, version, result):
    assert bs.requirement_matches(requirement, version) is result


def test_torch_requirement_comes_from_pyproject():
    assert bs.torch_requirement(bs.APP_DIR).startswith("torch")
    assert bs.requirement_matches(bs.torch_requirement(bs.APP_DIR), "2.13.0+cpu") is True


@pytest.mark.parametrize(
    ("name", "pre_turing"),
    [
        ("NVIDIA GeForce GTX 1080 Ti", True),
        ("Tesla V100-SXM2-16GB", True),
        ("Quadro P4000", True),
        ("NVIDIA GeForce MX150", True),
        ("NVIDIA GeForce GTX 1660 SUPER", False),  # Turing without tensor cores
        ("NVIDIA GeForce MX450", False),
        ("NVIDIA GeForce RTX 2060", False),
        ("NVIDIA GeForce RTX 5070 Ti", False),
    ],
)
def test_card_generation_guess_by_name(name, pre_turing):
    guessed = bs.guess_capabilities([name])
    assert (bool(guessed) and guessed[0] < (7, 5)) is pre_turing
