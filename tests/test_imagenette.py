"""Imagenette with ImageNet-1k labels: the archive's layout, streamed extraction that appears only when complete,
the label map, and its use by latents, training grids and sampling. Offline: the archives are made here from
generated JPEGs in Imagenette's layout (dit_core.data.imagenette.make_archive)."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest
import torch

from dit_core.cli.data import main as dit_data
from dit_core.data import ImageFolderDataset, LabelMap, present_labels, read_label_map, write_label_map
from dit_core.data import imagenette
from dit_core.data.imagenette import CLASSES, make_archive, prepare_imagenette

WNIDS = [w for w, _, _ in CLASSES]


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> Path:
    return make_archive(tmp_path_factory.mktemp("archive") / "imagenette2-320.tgz", 3, 2, short_side=40)


@pytest.fixture(scope="module")
def prepared(archive, tmp_path_factory) -> Path:
    return prepare_imagenette(tmp_path_factory.mktemp("data") / "imagenette", archive=archive, checksum=False,
                              progress=False)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != imagenette.MARKER}


def test_archive_has_imagenettes_layout(archive):
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert f"{imagenette.ARCHIVE_ROOT}/noisy_imagenette.csv" in names
    assert "imagenette2-320/train/n01440764/n01440764_1.JPEG" in names
    assert "imagenette2-320/val/n03888257/ILSVRC2012_val_00000020.JPEG" in names
    assert sum(n.endswith(".JPEG") for n in names) == 10 * (3 + 2)


def test_prepared_folder_labels_are_imagenet_indices(prepared):
    assert sorted(p.name for p in prepared.iterdir()) == ["imagenette.json", "label_map.json", "noisy_imagenette.csv",
                                                          "train", "val"]
    manifest = json.loads((prepared / "imagenette.json").read_text())
    assert manifest["counts"] == {"train": 30, "val": 20} and manifest["archive"]["checksum_verified"] is False
    train = ImageFolderDataset(prepared, 32)
    assert train.num_classes == 1000 and train.class_folders == WNIDS
    assert train.class_to_idx == {w: i for w, _, i in CLASSES}
    assert train.classes[0] == "tench" and train.classes[701] == "parachute" and train.classes[1] == ""
    assert present_labels(train) == [0, 217, 482, 491, 497, 566, 569, 571, 574, 701]
    val = ImageFolderDataset(prepared, 32, split="val")
    assert sorted(set(val.targets)) == present_labels(train)  # the split finds the map in the root
    x, y = train[3]
    assert x.shape == (3, 32, 32) and y == 217
    assert present_labels(torch.utils.data.Subset(train, [0, 3])) == [0, 217]


def test_killed_extraction_leaves_no_dataset_and_resumes_to_the_same_one(archive, prepared, tmp_path, monkeypatch):
    out = tmp_path / "imagenette"
    real_copy, calls = shutil.copyfileobj, []

    def dies_after_12(src, dst, length=0):
        if len(calls) == 12:
            raise KeyboardInterrupt  # a kill in the middle of the archive
        calls.append(1)
        return real_copy(src, dst, length)

    monkeypatch.setattr(imagenette.shutil, "copyfileobj", dies_after_12)
    with pytest.raises(KeyboardInterrupt):
        prepare_imagenette(out, archive=archive, checksum=False, progress=False)
    assert not out.exists()  # no half dataset that looks complete
    staging = tmp_path / ".imagenette.partial"
    assert staging.is_dir() and not (staging / imagenette.MARKER).exists()
    monkeypatch.setattr(imagenette.shutil, "copyfileobj", real_copy)
    calls.clear()
    prepare_imagenette(out, archive=archive, checksum=False, progress=False)
    assert not staging.exists() and _tree(out) == _tree(prepared)
    assert prepare_imagenette(out, archive=tmp_path / "gone.tgz") == out  # prepared: nothing is read again


def test_members_named_with_a_leading_dot_slash_are_accepted(archive, prepared, tmp_path):
    """The same archive repacked with ``./`` before every name and a ``./`` folder entry first (what
    ``tar -C dir -czf x.tgz .`` writes): the same prepared folder."""
    dotted = tmp_path / "dotted.tgz"
    with tarfile.open(archive) as src, tarfile.open(dotted, "w:gz") as dst:
        top = tarfile.TarInfo("./")
        top.type = tarfile.DIRTYPE
        dst.addfile(top)
        for member in src:
            data = src.extractfile(member).read() if member.isfile() else None
            member.name = "./" + member.name
            dst.addfile(member, io.BytesIO(data) if data is not None else None)
    with tarfile.open(dotted) as tar:
        assert tar.getnames()[0] == "." and all(n.startswith("./") for n in tar.getnames()[1:])
    out = prepare_imagenette(tmp_path / "out", archive=dotted, checksum=False, progress=False)
    assert _tree(out) == _tree(prepared)
    assert json.loads((out / "imagenette.json").read_text())["counts"] == {"train": 30, "val": 20}
    assert imagenette._member_target(".//abs/x.JPEG") is None and imagenette._member_target("./../x.JPEG") is None


def test_hostile_or_foreign_members_are_not_written(tmp_path):
    path = tmp_path / "evil.tgz"
    with tarfile.open(path, "w:gz") as tar:
        good = (tmp_path / "a.jpg")
        from PIL import Image

        Image.new("RGB", (40, 40), "red").save(good)
        for name in ["../evil.JPEG", "/abs/evil.JPEG", "imagenette2-320/train/n99999999/x.JPEG",
                     "imagenette2-320/train/n01440764/../../../x.JPEG", "imagenette2-320/extra.txt"]:
            data = b"evil"
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for split in ("train", "val"):
            for w in WNIDS:
                tar.add(good, arcname=f"imagenette2-320/{split}/{w}/{w}_1.JPEG")
    out = prepare_imagenette(tmp_path / "out", archive=path, checksum=False, progress=False)
    assert not (tmp_path / "evil.JPEG").exists() and not Path("/abs/evil.JPEG").exists()
    assert not (tmp_path / "x.JPEG").exists()
    files = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert not any("n99999999" in f or "evil" in f or "extra" in f for f in files)


def test_an_archive_in_another_layout_is_refused(tmp_path):
    path = tmp_path / "other.tgz"
    with tarfile.open(path, "w:gz") as tar:
        data = b"hello"
        info = tarfile.TarInfo("photos/cat/1.jpg")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(ValueError, match="not an Imagenette archive"):
        prepare_imagenette(tmp_path / "out", archive=path, checksum=False, progress=False)
    assert not (tmp_path / "out").exists()
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "file.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a prepared Imagenette"):
        prepare_imagenette(tmp_path / "busy", archive=path, checksum=False)


def test_dit_data_imagenette_cli(archive, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DIT_CACHE", str(tmp_path / "cache"))
    assert dit_data(["imagenette", str(tmp_path / "a"), "--no-download"]) == 2
    err = capsys.readouterr().err
    assert "downloading was not asked for" in err and str(tmp_path / "cache" / "imagenette2-320.tgz") in err
    assert dit_data(["imagenette", str(tmp_path / "b"), "--archive", str(archive)]) == 2  # not the published file
    assert "sha256" in capsys.readouterr().err
    assert dit_data(["imagenette", str(tmp_path / "c"), "--archive", str(archive), "--no-checksum",
                     "--no-progress"]) == 0
    assert "30 train, 20 val images" in capsys.readouterr().out
    # a download by name, here from a file:// mirror (the same code as the S3 URL)
    assert dit_data(["imagenette", str(tmp_path / "d"), "--url", archive.as_uri(), "--no-checksum",
                     "--no-progress"]) == 0
    assert (tmp_path / "cache" / "imagenette2-320.tgz").is_file()


# ----------------------------------------------------------------------------------------------- label maps
def test_label_map_errors_are_clear(tmp_path):
    root = tmp_path / "data"
    for name in ("cat", "dog"):
        (root / name).mkdir(parents=True)
        from PIL import Image

        Image.new("RGB", (8, 8)).save(root / name / "0.png")
    write_label_map(root, LabelMap(num_classes=5, index={"cat": 4}))
    with pytest.raises(ValueError, match=r"\['dog'\] .* have no entry in the label map"):
        ImageFolderDataset(root, 8)
    write_label_map(root, LabelMap(num_classes=5, index={"cat": 4, "dog": 2}, names={"dog": "Dog"}))
    ds = ImageFolderDataset(root, 8)
    assert ds.classes == ["", "", "Dog", "", "cat"] and sorted(ds.targets) == [2, 4]
    with pytest.raises(ValueError, match="share label 2"):
        LabelMap(num_classes=5, index={"cat": 2, "dog": 2})
    with pytest.raises(ValueError, match="outside 0..4"):
        LabelMap(num_classes=5, index={"cat": 5})
    (root / "label_map.json").write_text(json.dumps({"cat": 1}))
    with pytest.raises(ValueError, match="is not a label map"):
        read_label_map(root)


# ----------------------------------------------------------------------------- latents, training, sampling
@pytest.fixture(scope="module")
def latents(prepared, tmp_path_factory):
    pytest.importorskip("diffusers")
    from dit_book.track import standins
    from dit_core.latents import extract_latents

    vae = standins(tmp_path_factory.mktemp("standins"))["vae"]
    out = tmp_path_factory.mktemp("latents") / "nette"
    result = extract_latents(prepared, out, vae=str(vae), image_size=32, batch_size=8, num_workers=0,
                             progress=False, precision="fp32")
    assert result["complete"]
    return out


def test_latents_keep_the_imagenet_labels(latents):
    from dit_core.latents import LatentDataset, verify

    ds = LatentDataset(latents)
    assert ds.num_classes == 1000 and ds.classes[566] == "French horn"
    assert present_labels(ds) == [i for _, _, i in CLASSES]
    assert verify(latents) == []


def test_training_and_sampling_use_the_label_map(latents, tmp_path, monkeypatch):
    import dit_core.sample
    from dit_core.sample import generate, load_model
    from dit_core.train import make_config, train

    asked = []
    monkeypatch.setattr(dit_core.sample, "generate", lambda model, diffusion, labels, **kw: asked.append(labels)
                        or generate(model, diffusion, labels, **kw))

    cfg = make_config("imagenette-b2", dict(
        latents_path=str(latents), image_size=32, depth=1, hidden_size=32, num_heads=2, batch_size=8, grad_accum=1,
        max_steps=2, num_workers=0, mixed_precision="fp32", tf32=False, tensorboard=False, progress=False,
        sample_per_class=1, sample_steps=2, out=str(tmp_path / "run"), device="cpu", log_every=1))
    summary = train(cfg)
    assert Path(summary["samples"]).is_file()
    assert asked == [[i for _, _, i in CLASSES]]  # the grid shows the classes the data has, not classes 0..9
    model, info = load_model(tmp_path / "run", device="cpu")
    assert model.num_classes == 1000 and info["label_names"][217] == "English springer"
    assert info["space"] == "latent"
    record = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert 0.0 <= record["data_wait_share"] <= 1.0 and record["memory_gb"] > 0
    images = generate(model, None, [0, 701], steps=2, sampler="ddim", cfg_scale=1.5)
    assert images.shape == (2, 4, 4, 4)  # latents (no VAE given): the official checkpoint's class numbers work
