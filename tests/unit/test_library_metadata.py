"""What a model or LoRA file's header says about it (base model, trigger words, resolution),
its preview picture, and the LoRAs in the Lora folders; hostile headers and pictures cost one
sentence, never a crash or unbounded memory."""

from __future__ import annotations

import json
import tracemalloc

import pytest

from app.core.errors import BadFileError
from app.core.families.registry import family_of_architecture
from app.core.library import metadata
from app.core.library.metadata import (
    MAX_CARD_HEADER_BYTES,
    ModelCard,
    base_architecture,
    card_from_metadata,
    preview_file,
    read_card,
    read_preview,
)
from app.core.lora.library import list_loras, lora_folders
from tests.support.model_cards import (
    KOHYA_SDXL,
    MODELSPEC_SD1,
    lora_file,
    metadata_header,
    png_file,
    raw_header,
)


def test_a_kohya_lora_says_its_base_model_trigger_words_and_resolution(tmp_path):
    card = read_card(lora_file(tmp_path / "inkwash.safetensors", KOHYA_SDXL))
    assert card.base_model == "sdxl"
    assert card.trained_on == "sd_xl_base_1.0.safetensors"
    assert card.title == "inkwash"
    # Counted over both training folders: 1girl 42, inkwash style 40, mountain 25.
    assert card.trigger_words == ("1girl", "inkwash style", "mountain")
    assert card.resolution == (1024, 1024)
    assert (card.rank, card.alpha) == (32, 16.0)
    assert card.problem is None


def test_modelspec_trigger_phrases_come_first_and_its_title_wins(tmp_path):
    card = read_card(lora_file(tmp_path / "paper.safetensors", MODELSPEC_SD1))
    assert card.base_model == "sd1"
    assert card.title == "Paper Cut"
    assert card.trigger_words == ("papercut", "layered paper")
    assert card.resolution == (512, 512)


@pytest.mark.parametrize(
    ("stated", "architecture"),
    [
        ("sd_v1", "sd1"),
        ("sd_v2", "sd2"),
        ("stable-diffusion-v2-768-v", "sd2"),
        ("sdxl_base_v1-0", "sdxl"),
        ("stable-diffusion-xl-v1-base/lora", "sdxl"),
        ("stable-diffusion-xl-v1-refiner", "sdxl-refiner"),
        ("sd3", "sd3"),
        ("stable-diffusion-3.5-large/lora", "sd3"),
        ("flux1", "flux"),
        ("flux-1-dev/lora", "flux-dev"),
        ("Flux.1-schnell", "flux-schnell"),
        ("flux-2-klein", "flux2-klein"),
        ("chroma", "chroma"),
        ("qwen-image/lora", "qwenimage"),
        ("qwen_image_edit", "qwenimage-edit"),
        ("z-image-turbo", "zimage-turbo"),
        ("Z_Image_Base/lora", "zimage-base"),
        ("z-image", "zimage"),  # either of them: the family's own name
        ("krea-2", "krea2"),
        ("qwen_image_2.1", "qwenimage21"),
    ],
)
def test_trainers_base_model_words_map_to_families_halfsafe_knows(stated, architecture):
    assert base_architecture(stated) == architecture
    assert family_of_architecture(architecture) is not None


def test_each_familys_trainer_words_name_its_own_architectures():
    """The words trainers write live with each family: the architecture each pattern means is
    one the same family runs, so a family added with its words needs no table elsewhere."""
    from app.core.families import FAMILIES

    for family in FAMILIES:
        for _pattern, architecture in family.trainer_words:
            assert family_of_architecture(architecture) is family, (family.title, architecture)
    assert all(family.trainer_words for family in FAMILIES)


def test_unknown_base_model_words_are_kept_as_written():
    card = card_from_metadata({"ss_base_model_version": "hunyuan_video"})
    assert card.base_model is None and card.base_model_stated == "hunyuan_video"


@pytest.mark.parametrize(
    "values",
    [
        {"ss_tag_frequency": json.dumps(["not", "a", "map"])},
        {"ss_tag_frequency": json.dumps({"a": {"tag": "many", "ok": True, "x": None}})},
        {"ss_tag_frequency": json.dumps({"a": ["tag"]})},
        {"ss_tag_frequency": "[" * 100_000 + "]" * 100_000},
        {"ss_tag_frequency": "{not json"},
        {"ss_tag_frequency": 7, "ss_resolution": ["512"], "modelspec.title": {"x": 1}},
        {"ss_resolution": "(999999999, 2)", "ss_network_dim": "nan", "ss_network_alpha": "inf"},
    ],
)
def test_metadata_of_the_wrong_shape_is_passed_over(values):
    card = card_from_metadata(values)
    assert card.trigger_words == () and card.resolution is None
    assert card.rank is None and card.alpha is None and card.title is None


def test_overlong_words_and_control_characters_are_not_shown():
    card = card_from_metadata(
        {
            "modelspec.trigger_phrase": "x" * 5000 + ", ok\x00word",
            "modelspec.title": "T\x1b[31mitle" + "y" * 1000,
        }
    )
    assert card.trigger_words == ("ok word",)
    assert card.title is not None and len(card.title) <= metadata.MAX_TEXT_CHARS
    assert "\x1b" not in card.title


def test_a_header_too_large_for_a_card_is_one_sentence_and_not_read(tmp_path):
    # The length field names 1 TB; only its 8 bytes are read.
    path = raw_header(tmp_path / "huge.safetensors", b"{}", length=1 << 40)
    tracemalloc.start()
    card = read_card(path)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert card.problem is not None and "huge.safetensors" in card.problem
    assert "not read" in card.problem
    assert peak < 1 << 20


def test_a_real_header_past_the_card_bound_is_not_parsed(tmp_path):
    text = metadata_header({"ss_tag_frequency": "x" * (MAX_CARD_HEADER_BYTES + 10)})
    card = read_card(raw_header(tmp_path / "big.safetensors", text))
    assert card.problem is not None and "not read" in card.problem


@pytest.mark.parametrize(
    ("header", "words"),
    [
        (metadata_header({"ss_network_dim": 32}), "not a map of text to text"),
        (metadata_header(["a", "list"]), "not a map of text to text"),
        (b"[" * 200_000 + b"]" * 200_000, "not valid JSON"),
        (b'{"__metadata__": {"title": "\xff\xfe"}}', "not text"),
        (b"not json at all", "not valid JSON"),
    ],
)
def test_a_hostile_header_is_one_sentence(tmp_path, header, words):
    card = read_card(raw_header(tmp_path / "hostile.safetensors", header))
    assert card.problem is not None and words in card.problem
    assert "hostile.safetensors" in card.problem
    assert card.trigger_words == () and card.base_model is None


def test_a_truncated_file_and_a_folder_named_as_a_model_are_one_sentence(tmp_path):
    short = tmp_path / "short.safetensors"
    short.write_bytes(b"\x01\x02")
    assert "too short" in (read_card(short).problem or "")
    folder = tmp_path / "folder.safetensors"
    folder.mkdir()
    assert read_card(folder).problem is not None


def test_pickles_and_gguf_files_are_not_opened(tmp_path):
    for name in ("old.ckpt", "model.gguf", "x.pt"):
        path = tmp_path / name
        path.write_bytes(b"\x80\x02 anything")
        assert read_card(path) == ModelCard()


def test_a_card_is_read_again_only_when_the_file_changed(tmp_path, monkeypatch):
    path = lora_file(tmp_path / "a.safetensors", KOHYA_SDXL)
    reads = []
    real = metadata._read_card
    monkeypatch.setattr(metadata, "_read_card", lambda p: reads.append(p) or real(p))
    read_card(path)
    read_card(path)
    assert len(reads) == 1
    lora_file(path, MODELSPEC_SD1)  # rewritten: another size
    assert read_card(path).title == "Paper Cut"
    assert len(reads) == 2


def test_the_preview_beside_a_model_is_found_in_the_tools_order(tmp_path):
    model = lora_file(tmp_path / "ink.safetensors")
    assert preview_file(model) is None
    png_file(tmp_path / "ink.png")
    assert preview_file(model) == tmp_path / "ink.png"
    png_file(tmp_path / "ink.preview.png")
    assert preview_file(model) == tmp_path / "ink.preview.png"
    (tmp_path / "other.preview.png").mkdir()  # a folder is no picture
    assert preview_file(tmp_path / "other.safetensors") is None


def test_a_preview_is_made_small_and_only_from_a_picture(tmp_path):
    small = read_preview(png_file(tmp_path / "a.png", (400, 200)), 96)
    assert small.size == (96, 48) and small.mode == "RGBA"
    not_a_picture = tmp_path / "b.preview.png"
    not_a_picture.write_bytes(b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n")
    with pytest.raises(BadFileError, match="not a PNG, JPEG or WebP"):
        read_preview(not_a_picture, 96)
    text = tmp_path / "c.jpg"
    text.write_text("just words")
    with pytest.raises(BadFileError):
        read_preview(text, 96)


def test_a_preview_claiming_a_giant_picture_is_refused_before_decoding(tmp_path):
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", 60_000, 60_000, 8, 2, 0, 0, 0)
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b""))
    with pytest.raises(BadFileError):
        read_preview(bomb, 96)


def test_loras_are_listed_from_the_lora_folders_beside_the_model_folders(tmp_path):
    a1111 = tmp_path / "webui" / "models"
    (a1111 / "Stable-diffusion").mkdir(parents=True)
    lora_file(a1111 / "Lora" / "styles" / "ink.safetensors", KOHYA_SDXL)
    lora_file(a1111 / "LyCORIS" / "paper.safetensors", MODELSPEC_SD1)
    (a1111 / "Lora" / "notes.txt").write_text("not a LoRA")
    comfy = tmp_path / "comfy" / "models"
    (comfy / "checkpoints").mkdir(parents=True)
    raw_header(comfy / "loras" / "broken.safetensors", b"[" * 1000)
    roots = [str(a1111 / "Stable-diffusion"), str(comfy / "checkpoints")]
    folders = lora_folders([tmp_path / r for r in roots])
    assert {f.name for f in folders} == {"Lora", "LyCORIS", "loras"}
    found = list_loras(roots, include_defaults=False)
    assert [f.path.rsplit("/", 1)[-1] for f in found] == [
        "broken.safetensors",
        "ink.safetensors",
        "paper.safetensors",
    ]
    broken, ink, paper = found
    assert broken.card.problem is not None and ink.card.base_model == "sdxl"
    assert paper.card.trigger_words == ("papercut", "layered paper")
