"""Safetensors header checks, the pickle policy and the weight scan, against a corpus built here."""

from __future__ import annotations

import json
import math
import os
import struct

import pytest
import torch
from safetensors.torch import save_file

from app.core.checkpoint import (
    HEADER_LIMIT,
    Checkpoint,
    WeightScan,
    load_pickle_state_dict,
    model_hash,
    read_safetensors_header,
    scan_weights,
    stored_dtype,
)
from app.core.errors import BadFileError, PickleRefusedError
from tests.support.checkpoint_files import (
    pickle_with_payload,
    raw_safetensors,
    small_safetensors,
    torch_zip_with_payload,
)


def assert_one_sentence(error: BaseException, path) -> str:
    text = str(error)
    assert str(path) in text, text
    assert "\n" not in text and text.endswith("."), text
    assert "Traceback" not in text
    return text


# The header corpus ------------------------------------------------------------------------


def _f32(count: int) -> bytes:
    return struct.pack(f"<{count}f", *range(count))


HEADERS = {
    # name: (header or raw bytes, data, length override, words the sentence must contain)
    "not json": (b"{this is not json", b"", None, "not valid JSON"),
    "json list": ([1, 2, 3], b"", None, "not an object"),
    "json string": ("model", b"", None, "not an object"),
    "binary header": (b"\xff\xfe\x00\x01garbage", b"", None, "not text"),
    "offsets past the end": (
        {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}},
        _f32(2),
        None,
        "truncated",
    ),
    "overlapping": (
        {
            "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
        },
        _f32(3),
        None,
        "overlaps",
    ),
    "gap": ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, _f32(2), None, "gap"),
    "trailing bytes": (
        {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}},
        _f32(3),
        None,
        "after its last tensor",
    ),
    "dtype vs bytes": (
        {"a": {"dtype": "F16", "shape": [2, 2], "data_offsets": [0, 16]}},
        _f32(4),
        None,
        "needs 8 bytes",
    ),
    "shape vs bytes": (
        {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}},
        _f32(4),
        None,
        "needs 12 bytes",
    ),
    "unknown dtype": (
        {"a": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}},
        _f32(4),
        None,
        "unknown dtype",
    ),
    "negative shape": (
        {"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}},
        _f32(1),
        None,
        "invalid shape",
    ),
    "reversed offsets": (
        {"a": {"dtype": "F32", "shape": [0], "data_offsets": [4, 0]}},
        _f32(1),
        None,
        "invalid data offsets",
    ),
    "entry not object": ({"a": [0, 4]}, _f32(1), None, "not an object"),
    "bad metadata": ({"__metadata__": {"x": 1}}, b"", None, "__metadata__"),
    "duplicate name": (
        b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
        b'"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}',
        _f32(1),
        None,
        "twice",
    ),
    "length past the end": ({}, b"", 4096, "truncated"),
    "length over the limit": ({}, b"", HEADER_LIMIT + 1, "100 MB"),
}


@pytest.mark.parametrize("case", sorted(HEADERS))
def test_malformed_headers_are_refused_with_one_sentence(tmp_path, case):
    header, data, length, words = HEADERS[case]
    path = raw_safetensors(tmp_path / "model.safetensors", header, data, length=length)
    with pytest.raises(BadFileError) as caught:
        read_safetensors_header(path)
    text = assert_one_sentence(caught.value, path)
    assert words in text
    # The loader refuses it the same way, before safetensors or diffusers see it.
    with pytest.raises(BadFileError):
        Checkpoint(path)


def test_missing_empty_tiny_and_truncated_files(tmp_path):
    missing = tmp_path / "missing.safetensors"
    with pytest.raises(BadFileError, match="does not exist"):
        read_safetensors_header(missing)

    empty = tmp_path / "empty.safetensors"
    empty.write_bytes(b"")
    with pytest.raises(BadFileError, match="empty") as caught:
        read_safetensors_header(empty)
    assert_one_sentence(caught.value, empty)

    tiny = tmp_path / "tiny.safetensors"
    tiny.write_bytes(b"\x01\x02\x03")
    with pytest.raises(BadFileError, match="too short"):
        read_safetensors_header(tiny)

    good = small_safetensors(tmp_path / "good.safetensors")
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(good.read_bytes()[:-5])
    with pytest.raises(BadFileError, match="truncated") as caught:
        read_safetensors_header(truncated)
    assert_one_sentence(caught.value, truncated)


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (
            "These are my notes about models.\nsd15: 7 steps\n" * 40,
            "this is a text file, not a safetensors file (it begins 'These are my notes "
            "about models.')",
        ),
        ("\x1b[32mhalfsafe: Verdict: Healthy\x1b[0m\n" * 9, "not a safetensors file ("),
        ("short note, wrong name" * 3, "it begins 'short note, wrong nameshort not…'"),
        (b"\x00\x01\x02\x03\xff\xfe\xfd\xfc" * 4, "not a safetensors file ("),
    ],
    ids=["notes", "escape codes", "one long line", "binary"],
)
def test_a_file_that_is_no_safetensors_file_is_said_to_be_so(tmp_path, content, said):
    """A text file renamed .safetensors: its first 8 bytes read as a header length give a
    number of megabytes past any disk. What the file is, in one sentence, is said instead; its
    start is quoted only when it is plain printable text."""
    path = tmp_path / "model.safetensors"
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    else:
        path.write_bytes(content)
    with pytest.raises(BadFileError) as caught:
        read_safetensors_header(path)
    text = assert_one_sentence(caught.value, path)
    assert said in text
    assert "MB" not in text and "header length" not in text
    assert "\x1b" not in text and "Verdict" not in text


def test_a_folder_named_like_a_file_is_not_a_regular_file(tmp_path):
    folder = tmp_path / "model.safetensors"
    folder.mkdir()
    with pytest.raises(BadFileError, match="not a regular file"):
        read_safetensors_header(folder)


def test_unreadable_file(tmp_path, monkeypatch):
    path = small_safetensors(tmp_path / "locked.safetensors")
    real_open = os.open  # files are opened at the descriptor level (only regular files)

    def refusing_open(file, *args, **kwargs):
        if os.fspath(file) == str(path):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing_open)
    with pytest.raises(BadFileError, match="cannot be read.*Permission denied") as caught:
        read_safetensors_header(path)
    assert_one_sentence(caught.value, path)


@pytest.mark.skipif(
    os.name != "posix" or os.geteuid() == 0,
    reason="file permissions do not bind root or non-POSIX systems",
)
def test_unreadable_file_by_permissions(tmp_path):
    path = small_safetensors(tmp_path / "locked.safetensors")
    path.chmod(0)
    try:
        with pytest.raises(BadFileError, match="cannot be read"):
            read_safetensors_header(path)
    finally:
        path.chmod(0o644)


def test_valid_header_reads_shapes_dtypes_and_metadata(tmp_path):
    path = small_safetensors(
        tmp_path / "good.safetensors", metadata={"ss_v_parameterization": "True"}
    )
    header = read_safetensors_header(path)
    assert header.shapes() == {"a": (2, 3), "b": (4,)}
    assert header.dtypes() == {"a": "F32", "b": "F16"}
    assert header.metadata == {"ss_v_parameterization": "True"}
    assert header.file_size == path.stat().st_size
    with Checkpoint(path) as checkpoint:
        assert torch.equal(checkpoint.get("a"), torch.arange(6, dtype=torch.float32).reshape(2, 3))
        assert checkpoint.get("b").dtype == torch.float16


def test_checkpoint_tensors_are_copy_on_write_views(tmp_path):
    path = small_safetensors(tmp_path / "good.safetensors")
    before = path.read_bytes()
    checkpoint = Checkpoint(path)
    tensor = checkpoint.get("a")
    checkpoint.close()
    tensor.add_(100)  # writing to a loaded weight must never reach the user's file
    assert path.read_bytes() == before
    assert Checkpoint(path).get("a")[0, 0] == 0
    assert tensor[0, 0] == 100


def _content(path, **kwargs) -> str:
    scan = scan_weights(path, identify=True, **kwargs)
    assert scan.content is not None
    return scan.content


def _flip_one_byte(path, offset_from_end: int = 1) -> None:
    data = bytearray(path.read_bytes())
    data[-offset_from_end] ^= 0x01
    path.write_bytes(bytes(data))


def test_content_digest_changes_with_one_byte_of_one_tensor(tmp_path):
    path = small_safetensors(tmp_path / "one.safetensors")
    header_before = read_safetensors_header(path).raw
    before = _content(path)
    _flip_one_byte(path)  # the last byte of the last tensor's data
    assert read_safetensors_header(path).raw == header_before  # same layout, same header
    assert _content(path) != before


def test_content_digest_ignores_where_and_how_the_tensors_are_stored(tmp_path):
    one = small_safetensors(tmp_path / "one.safetensors", metadata={"note": "first"})
    key = _content(one)
    moved = tmp_path / "elsewhere" / "renamed.safetensors"
    moved.parent.mkdir()
    one.rename(moved)
    os.utime(moved, ns=(5, 5))
    assert _content(moved) == key  # moved, renamed, touched
    tensors = {
        "b": torch.ones(4, dtype=torch.float16),
        "a": torch.arange(6, dtype=torch.float32).reshape(2, 3),
    }
    assert _content(small_safetensors(tmp_path / "other-order.safetensors", tensors)) == key
    assert scan_weights(tensors, identify=True).content == key  # in memory, in another order
    pickled = tmp_path / "same.ckpt"
    torch.save(tensors, str(pickled))
    assert _content(pickled, allow_pickle=True) == key
    assert scan_weights(moved).content is None  # only computed when asked for


@pytest.mark.parametrize(
    "changed",
    [
        {"a": torch.arange(6, dtype=torch.float32).reshape(3, 2)},  # shape
        {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3).view(torch.int32)},  # dtype
        {"c": torch.arange(6, dtype=torch.float32).reshape(2, 3)},  # name
    ],
)
def test_content_digest_covers_name_dtype_and_shape(changed):
    # Each change keeps every byte of the data: only the name, dtype or shape tells them apart.
    base = {
        "a": torch.arange(6, dtype=torch.float32).reshape(2, 3),
        "b": torch.ones(4, dtype=torch.float16),
    }
    other = {**{k: v for k, v in base.items() if k != "a"}, **changed}
    assert scan_weights(base, identify=True).content != scan_weights(other, identify=True).content


def test_merged_scans_keep_both_digests_apart():
    a = scan_weights({"w": torch.zeros(2)}, identify=True)
    b = scan_weights({"w": torch.ones(2)}, identify=True)
    assert a.merged(b).content not in (None, a.content, b.content)
    assert a.merged(b).content != b.merged(a).content
    assert a.merged(WeightScan([], 0, 0, 0.0)).content is None


def test_stored_dtype_names():
    assert stored_dtype(["F16", "F16", "I64"]) == "fp16"
    assert stored_dtype(["BF16"]) == "bf16"
    assert stored_dtype(["F32", "F16"]) == "mixed"
    assert stored_dtype(["I64"]) == "none"


# The pickle policy ------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".ckpt", ".pt", ".bin", ".pth"])
def test_pickles_are_refused_without_permission_and_the_payload_never_runs(tmp_path, suffix):
    marker = tmp_path / "payload-ran"
    path = pickle_with_payload(tmp_path / f"model{suffix}", marker)
    with pytest.raises(PickleRefusedError) as caught:
        Checkpoint(path)
    text = assert_one_sentence(caught.value, path)
    assert "run any code" in text and "--allow-pickle" in text
    assert not marker.exists()


@pytest.mark.parametrize("builder", [pickle_with_payload, torch_zip_with_payload])
def test_allowed_pickles_use_the_weights_only_loader_and_the_payload_never_runs(tmp_path, builder):
    marker = tmp_path / "payload-ran"
    path = builder(tmp_path / "model.ckpt", marker)
    assert not marker.exists()
    # Control: the payload is real; a full unpickle would run it.
    if builder is pickle_with_payload:
        import pickle

        pickle.loads(path.read_bytes())["hook"].close()
        assert marker.exists()
        marker.unlink()
    with pytest.raises(BadFileError, match="weights-only loader refused") as caught:
        Checkpoint(path, allow_pickle=True)
    assert_one_sentence(caught.value, path)
    with pytest.raises(BadFileError):
        load_pickle_state_dict(path)
    assert not marker.exists()


def test_a_pickle_disguised_as_safetensors_is_refused(tmp_path):
    marker = tmp_path / "payload-ran"
    path = torch_zip_with_payload(tmp_path / "model.safetensors", marker)
    with pytest.raises(PickleRefusedError):
        Checkpoint(path)
    with pytest.raises(PickleRefusedError, match="under a .safetensors name"):
        read_safetensors_header(path)
    assert not marker.exists()


def test_allowed_plain_pickle_loads_its_tensors(tmp_path):
    path = tmp_path / "model.ckpt"
    weights = {"w": torch.arange(4.0), "b": torch.ones(2, dtype=torch.float16)}
    torch.save({"state_dict": weights, "global_step": 10}, str(path))
    with Checkpoint(path, allow_pickle=True) as checkpoint:
        assert checkpoint.shapes == {"w": (4,), "b": (2,)}
        assert checkpoint.dtypes == {"w": "F32", "b": "F16"}
        assert torch.equal(checkpoint.get("w"), weights["w"])


@pytest.mark.parametrize("allow_pickle", [False, True])
def test_random_bytes_under_a_pickle_suffix_are_not_called_code(tmp_path, allow_pickle):
    path = tmp_path / "model.ckpt"
    path.write_bytes(bytes(range(7, 250)) * 40)
    with pytest.raises(BadFileError) as caught:
        Checkpoint(path, allow_pickle=allow_pickle)
    assert not isinstance(caught.value, PickleRefusedError)
    text = assert_one_sentence(caught.value, path)
    assert "neither a zip archive nor a pickle" in text
    assert "code" not in text and "--allow-pickle" not in text


def test_damaged_pickle_is_a_bad_file(tmp_path):
    path = tmp_path / "model.ckpt"
    torch.save({"w": torch.zeros(1000)}, str(path))
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(BadFileError) as caught:
        Checkpoint(path, allow_pickle=True)
    assert_one_sentence(caught.value, path)


# The weight scan --------------------------------------------------------------------------


def test_scan_lists_exactly_the_tensors_holding_nan_or_inf(tmp_path):
    tensors = {
        "clean.fp16": torch.randn(64, 64).half(),
        "clean.bf16": torch.randn(300).bfloat16(),
        "nan.fp32": torch.tensor([1.0, float("nan"), 2.0]),
        "inf.fp16": torch.tensor([1.0, float("inf")], dtype=torch.float16),
        "neg_inf.bf16": torch.tensor([-float("inf")], dtype=torch.bfloat16),
        "big_but_finite.fp16": torch.full((10_000,), 60000.0, dtype=torch.float16),
        "ints": torch.arange(10),
        "empty": torch.zeros(0),
    }
    path = tmp_path / "weights.safetensors"
    save_file(tensors, str(path))
    expected = ["inf.fp16", "nan.fp32", "neg_inf.bf16"]

    scan = scan_weights(path)
    assert sorted(scan.non_finite) == expected
    assert scan.tensors == len(tensors)
    assert scan.bytes == sum(t.numel() * t.element_size() for t in tensors.values())
    assert scan.seconds > 0 and scan.mb_per_s > 0
    assert sorted(scan_weights(tensors).non_finite) == expected


def test_scan_of_a_pipeline_names_component_and_parameter():
    from tests.support.tiny_models import build_tiny_sd_pipeline

    pipeline = build_tiny_sd_pipeline()
    assert scan_weights(pipeline).non_finite == []
    with torch.no_grad():
        pipeline.vae.decoder.conv_out.weight[0, 0, 0, 0] = float("nan")
    assert scan_weights(pipeline).non_finite == ["vae.decoder.conv_out.weight"]


def test_scan_reports_progress_and_honours_cancel(tmp_path):
    from app.core.errors import CancelledError
    from app.core.jobs import CancelToken

    path = tmp_path / "weights.safetensors"
    save_file({f"t{i}": torch.zeros(1000) for i in range(5)}, str(path))
    seen = []
    scan_weights(path, on_progress=lambda stage, done, total: seen.append((stage, done, total)))
    assert seen and all(done <= total for _, done, total in seen)
    token = CancelToken()
    token.cancel()
    with pytest.raises(CancelledError):
        scan_weights(path, cancel=token)


def test_scan_refuses_pickles_unless_allowed(tmp_path):
    path = tmp_path / "weights.pt"
    torch.save({"w": torch.tensor([float("nan")])}, str(path))
    with pytest.raises(PickleRefusedError):
        scan_weights(path)
    assert scan_weights(path, allow_pickle=True).non_finite == ["w"]


def test_mb_per_s():
    assert WeightScan([], 1, 2_000_000, 0.5).mb_per_s == pytest.approx(4.0)
    assert WeightScan([], 0, 0, 0.0).mb_per_s == 0.0


def test_model_hash_is_a1111_short_sha256_and_cached(tmp_path, monkeypatch):
    import hashlib

    from app.core.checkpoint import hashing

    path = small_safetensors(tmp_path / "model.safetensors")
    expected = hashlib.sha256(path.read_bytes()).hexdigest()[:10]
    assert model_hash(path) == expected
    calls = []
    monkeypatch.setattr(hashing, "sha256_file", lambda *a, **k: calls.append(a) or "0" * 64)
    assert model_hash(path) == expected and calls == []  # cached by path, size and time
    os.utime(path, ns=(1, 1))
    assert model_hash(path) == "0" * 10 and len(calls) == 1  # changed file, hashed again


def test_header_limit_is_the_formats():
    assert HEADER_LIMIT == 100_000_000
    assert math.isclose(HEADER_LIMIT / 1e6, 100)


def test_corpus_leaves_the_process_working(tmp_path):
    for name, (header, data, length, _words) in HEADERS.items():
        path = raw_safetensors(
            tmp_path / f"{len(name)}-{abs(hash(name))}.safetensors", header, data, length=length
        )
        with pytest.raises(BadFileError):
            read_safetensors_header(path)
    good = small_safetensors(tmp_path / "good.safetensors")
    assert read_safetensors_header(good).shapes()["a"] == (2, 3)
    assert json.loads(read_safetensors_header(good).raw)["a"]["dtype"] == "F32"


def test_written_files_read_back_aligned_with_usual_permissions(tmp_path):
    from app.core.checkpoint import write_safetensors

    tensors = {
        "x": torch.arange(3, dtype=torch.int64),
        "y": torch.ones(2, 2, dtype=torch.bfloat16),
        "z": torch.zeros(0),
    }
    path = write_safetensors(tmp_path / "out.safetensors", tensors, {"k": "v"})
    header = read_safetensors_header(path)
    assert header.data_start % 8 == 0 and header.metadata == {"k": "v"}
    with Checkpoint(path) as checkpoint:
        for name, tensor in tensors.items():
            assert torch.equal(checkpoint.get(name), tensor)
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    assert [p.name for p in tmp_path.iterdir()] == ["out.safetensors"]  # no temp file left
