"""dit_core.data: ImageFolder reading, the ADM center crop, the dataset check, and the digits export."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from dit_core.cli.data import main as dit_data
from dit_core.data import (
    ImageFolderDataset,
    center_crop_arr,
    check_dataset,
    export_digits,
    format_report,
    load_image,
)
from dit_core.data.check import SKIPPED_KINDS, plant_bad_files


def _write(path: Path, arr: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(path)
    return path


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory) -> Path:
    return export_digits(tmp_path_factory.mktemp("digits") / "digits")


@pytest.fixture()
def bad_dataset(tmp_path) -> tuple[Path, dict[str, str]]:
    """A small RGB ImageFolder (3 classes x 4 images, 24x40 px) with one file of every bad kind planted."""
    rng = np.random.default_rng(0)
    root = tmp_path / "bad"
    for cls in ("cat", "dog", "eel"):
        for i in range(4):
            _write(root / "train" / cls / f"{i}.png", rng.integers(0, 256, (24, 40, 3), dtype=np.uint8))
    return root, plant_bad_files(root, size=16)


# ------------------------------------------------------------------------------------------ center crop
def _reference_crop(img: Image.Image, size: int) -> np.ndarray:
    """The ADM recipe spelled out step by step for the sizes used below."""
    while min(img.size) >= 2 * size:
        img = img.resize((img.size[0] // 2, img.size[1] // 2), Image.BOX)
    s = size / min(img.size)
    img = img.resize((round(img.size[0] * s), round(img.size[1] * s)), Image.BICUBIC)
    a = np.asarray(img)
    y, x = (a.shape[0] - size) // 2, (a.shape[1] - size) // 2
    return a[y : y + size, x : x + size]


@pytest.mark.parametrize("wh", [(640, 480), (300, 1000), (33, 20), (256, 256), (7, 9)])
def test_center_crop_arr_gives_square_of_image_size(wh):
    rng = np.random.default_rng(1)
    img = Image.fromarray(rng.integers(0, 256, (wh[1], wh[0], 3), dtype=np.uint8))
    out = center_crop_arr(img, 32)
    assert out.size == (32, 32)
    np.testing.assert_array_equal(np.asarray(out), _reference_crop(img, 32))


def test_center_crop_box_halving_averages_and_keeps_the_centre():
    # Left half black, right half white, 512x256: after halving (BOX) and bicubic to short side 64 the
    # center 64x64 crop straddles the edge, so both colours survive in the middle columns.
    arr = np.zeros((256, 512), dtype=np.uint8)
    arr[:, 256:] = 255
    out = np.asarray(center_crop_arr(Image.fromarray(arr), 64))
    assert out.shape == (64, 64)
    assert out[:, :28].max() < 10 and out[:, 36:].min() > 245
    # A uniform image stays uniform through BOX halving and bicubic.
    flat = np.asarray(center_crop_arr(Image.fromarray(np.full((1000, 700, 3), 77, np.uint8)), 64))
    assert (flat == 77).all()


def test_center_crop_rejects_bad_size():
    with pytest.raises(ValueError, match="image_size"):
        center_crop_arr(Image.new("RGB", (10, 10)), 0)


# ------------------------------------------------------------------------------------------ the dataset
def test_imagefolder_classes_sorted_and_split_picked(tmp_path):
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for cls in ("zebra", "ant", "Bee"):
            for i in range(2 if split == "train" else 1):
                _write(tmp_path / split / cls / f"{i}.png", rng.integers(0, 256, (20, 30, 3), dtype=np.uint8))
    ds = ImageFolderDataset(tmp_path, 16)
    assert ds.classes == ["Bee", "ant", "zebra"]  # sorted by name as torchvision does (upper case first)
    assert ds.class_to_idx == {"Bee": 0, "ant": 1, "zebra": 2}
    assert ds.num_classes == 3 and len(ds) == 6 and ds.root == tmp_path / "train"
    assert [label for _, label in ds.samples] == [0, 0, 1, 1, 2, 2]
    val = ImageFolderDataset(tmp_path, 16, split="val")
    assert len(val) == 3 and val.root == tmp_path / "val"
    x, y = ds[3]
    assert x.shape == (3, 16, 16) and x.dtype == torch.float32 and y == 1
    assert -1.0 <= x.min() and x.max() <= 1.0
    with pytest.raises(FileNotFoundError, match="split 'test' not found"):
        ImageFolderDataset(tmp_path, 16, split="test")


def test_imagefolder_values_and_flip(tmp_path):
    arr = np.zeros((8, 8, 3), dtype=np.uint8)
    arr[:, :4] = 255  # white left half
    _write(tmp_path / "a" / "0.png", arr)
    plain = ImageFolderDataset(tmp_path, None, flip=False)
    x, _ = plain[0]
    assert x[:, :, :4].eq(1.0).all() and x[:, :, 4:].eq(-1.0).all()
    flipping = ImageFolderDataset(tmp_path, None, flip=True)
    torch.manual_seed(0)
    seen = {bool(flipping[0][0][0, 0, 0] > 0) for _ in range(40)}
    assert seen == {True, False}  # both orientations occur
    gray = ImageFolderDataset(tmp_path, 4, mode="L", flip=False)
    assert gray[0][0].shape == (1, 4, 4) and gray.sample_shape == (1, 4, 4)


def test_imagefolder_errors_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ImageFolderDataset(tmp_path / "missing", 32)
    (tmp_path / "flat").mkdir()
    _write(tmp_path / "flat" / "img.png", np.zeros((4, 4), np.uint8))
    with pytest.raises(FileNotFoundError, match=r"root/<class>/<image>"):
        ImageFolderDataset(tmp_path / "flat", 32)
    with pytest.raises(ValueError, match="mode"):
        ImageFolderDataset(tmp_path, 32, mode="RGBA")


def test_load_image_scales_16_bit_instead_of_clipping(tmp_path):
    arr = np.array([[0, 32768, 65535, 1000]], dtype=np.uint16)
    p = tmp_path / "deep.png"
    Image.fromarray(arr).save(p)
    out = np.asarray(load_image(p, "L"))
    np.testing.assert_array_equal(out, [[0, 128, 255, 4]])  # PIL's convert() would give [0, 255, 255, 255]


# ------------------------------------------------------------------------------------------ the check
def test_check_finds_every_planted_bad_file(bad_dataset):
    root, planted = bad_dataset
    report = check_dataset(root, image_size=16)
    found = {(p.path, p.kind) for p in report.problems}
    missing = {path: kind for path, kind in planted.items() if (path, kind) not in found}
    assert not missing, f"the check missed: {missing}"
    # nothing reported that was not planted (the 12 good images are clean)
    assert {p.path for p in report.problems} <= set(planted)
    # 4 good images per class plus the planted ones that can be decoded
    assert report.splits == {"train": {"cat": 7, "dog": 7, "eel": 6}}
    assert len(report.skipped) == 3 and {p.kind for p in report.skipped} <= SKIPPED_KINDS
    assert not report.ok
    assert any(p.endswith("notes.txt") for p in report.ignored)
    assert any("._zz_resource_fork.jpg" in p for p in report.ignored)
    text = format_report(report)
    for kind in set(planted.values()):
        assert f"[{kind}]" in text
    assert "will be skipped" in text
    json.dumps(report.to_dict())  # serialisable for --json


def test_check_with_worker_processes_agrees(bad_dataset, monkeypatch):
    import dit_core.data.check as check_module

    monkeypatch.setattr(check_module, "PARALLEL_MIN_FILES", 1)  # use the pool even for 22 files
    root, _ = bad_dataset
    serial = check_dataset(root, image_size=16)
    parallel = check_dataset(root, image_size=16, workers=2)
    assert sorted((p.path, p.kind) for p in serial.problems) == sorted((p.path, p.kind) for p in parallel.problems)


def test_full_pass_over_bad_dataset_completes(bad_dataset):
    root, planted = bad_dataset
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = ImageFolderDataset(root, 16)
    assert any("zero-byte" in str(w.message) for w in caught)
    assert not any(p.endswith("zz_zero_byte.jpg") for p, _ in ds.samples)  # dropped at scan time
    assert len(ds) == 12 + len(planted) - 1
    seen = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for epoch in range(2):
            for x, y in torch.utils.data.DataLoader(ds, batch_size=5, shuffle=True, num_workers=0):
                assert x.shape[1:] == (3, 16, 16) and torch.isfinite(x).all()
                assert x.min() >= -1 and x.max() <= 1
                seen += len(y)
    assert seen == 2 * len(ds)
    skipped = {str(w.message).split()[3] for w in caught if "skipping unreadable image" in str(w.message)}
    assert skipped == {p for p, k in planted.items() if k in ("truncated", "not-an-image")}
    # the substitute is deterministic: the next readable image in index order
    bad = next(i for i, (p, _) in enumerate(ds.samples) if p.endswith("zz_truncated.jpg"))
    ds.flip = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.equal(ds[bad][0], ds[bad + 1][0])


def test_check_reports_empty_class_and_class_mismatch(tmp_path):
    _write(tmp_path / "train" / "a" / "0.png", np.zeros((8, 8, 3), np.uint8))
    (tmp_path / "train" / "b").mkdir(parents=True)
    _write(tmp_path / "val" / "a" / "0.png", np.zeros((8, 8, 3), np.uint8))
    kinds = {p.kind for p in check_dataset(tmp_path).problems}
    assert {"empty-class", "class-mismatch"} <= kinds


def test_dit_data_check_cli(bad_dataset, capsys):
    root, _ = bad_dataset
    assert dit_data(["check", str(root), "--image-size", "16", "--workers", "0"]) == 0
    out = capsys.readouterr().out
    assert "[truncated]" in out and "what the loader does" in out
    assert dit_data(["check", str(root), "--strict", "--json", "--workers", "0"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["by_kind"]["zero-byte"] == 1
    assert dit_data(["check", str(root / "nope")]) == 2


# ------------------------------------------------------------------------------------------ digits
def test_digits_export_counts_and_pixels(digits_dir):
    from sklearn.datasets import load_digits

    manifest = json.loads((digits_dir / "digits.json").read_text())
    files = {s: sorted((digits_dir / s).glob("*/*.png")) for s in ("train", "val")}
    assert len(files["train"]) + len(files["val"]) == 1797
    assert abs(len(files["val"]) / 1797 - 0.2) < 0.01
    assert sorted(p.name for p in (digits_dir / "train").iterdir()) == [str(d) for d in range(10)]
    for split in ("train", "val"):
        for d in range(10):
            assert len(list((digits_dir / split / str(d)).glob("*.png"))) == manifest["counts"][split][str(d)]
    # every class is split 80/20 (stratified)
    for d in range(10):
        n_val, n_train = manifest["counts"]["val"][str(d)], manifest["counts"]["train"][str(d)]
        assert abs(n_val / (n_val + n_train) - 0.2) < 0.02
    # files trace back to load_digits: name = index, folder = label, pixels = round(v * 255 / 16)
    digits = load_digits()
    for p in files["val"][:20]:
        i = int(p.stem)
        assert int(p.parent.name) == digits.target[i]
        expected = np.rint(digits.images[i] * 255 / 16).astype(np.uint8)
        np.testing.assert_array_equal(np.asarray(Image.open(p)), expected)
    ds = ImageFolderDataset(digits_dir, None, mode="L")
    assert ds.num_classes == 10 and len(ds) == len(files["train"]) and ds[0][0].shape == (1, 8, 8)


def test_digits_export_is_idempotent_and_refuses_other_params(digits_dir, tmp_path):
    stamp = {p: p.stat().st_mtime_ns for p in digits_dir.rglob("*")}
    assert export_digits(digits_dir) == digits_dir
    assert {p: p.stat().st_mtime_ns for p in digits_dir.rglob("*")} == stamp  # nothing rewritten
    with pytest.raises(FileExistsError, match="overwrite"):
        export_digits(digits_dir, seed=1)
    other = export_digits(tmp_path / "d16", image_size=16, val_fraction=0.1, seed=3)
    assert Image.open(next(other.glob("train/*/*.png"))).size == (16, 16)
    assert len(list(other.glob("val/*/*.png"))) == pytest.approx(180, abs=5)
    again = export_digits(other, image_size=16, val_fraction=0.5, seed=3, overwrite=True)
    assert len(list(again.glob("*/*/*.png"))) == 1797 and len(list(again.glob("val/*/*.png"))) > 850
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "mine.txt").write_text("user data")
    with pytest.raises(FileExistsError, match="other files"):
        export_digits(tmp_path / "taken")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folders left


def test_digits_export_is_atomic(tmp_path, monkeypatch):
    calls = {"n": 0}
    real_save = Image.Image.save

    def failing_save(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 50:
            raise OSError("disk full (simulated)")
        return real_save(self, *args, **kwargs)

    monkeypatch.setattr(Image.Image, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        export_digits(tmp_path / "digits")
    assert os.listdir(tmp_path) == []  # neither a half-written export nor the temporary folder


def test_dit_data_digits_cli(tmp_path, capsys):
    assert dit_data(["digits", str(tmp_path / "d"), "--image-size", "12"]) == 0
    assert "1438 train, 359 val" in capsys.readouterr().out
    assert dit_data(["digits", str(tmp_path / "d"), "--seed", "5"]) == 2
