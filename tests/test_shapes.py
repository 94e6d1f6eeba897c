"""The shapes folder (a reader's "own images", generated) and its judge: deterministic files in varied formats
that the loader reads, a classifier trained on real shapes that recognises them, and the shared scoring path."""

import hashlib
import json

import numpy as np
import pytest
import torch

from dit_core.data import ImageFolderDataset, check_dataset
from dit_core.data.shapes import DEFAULT_CLASSES, MANIFEST, SHAPES, generate_shapes, real_shapes, render_shape
from dit_core.eval import classwise
from dit_core.eval.shapes import classifier, class_accuracy

# Measured: the judge's held-out accuracy is 99.7 % (3 classes, 32 px RGB), 100 % for 5 classes, 64 px and grey.
CEILING = 0.98


def digest(folder):
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(folder)).encode() + path.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return generate_shapes(tmp_path_factory.mktemp("shapes") / "shapes", per_class=40)


def test_folder_layout_formats_and_manifest(folder):
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["total"] == 120 and manifest["classes"] == list(DEFAULT_CLASSES)
    assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == sorted(DEFAULT_CLASSES)
    suffixes = {p.suffix for p in folder.rglob("*.*") if p.name != MANIFEST}
    assert {".png", ".jpg"} <= suffixes and suffixes <= {".png", ".jpg", ".webp", ".bmp"}
    assert sum(manifest["formats"].values()) == 120 and len(manifest["sides"]) > 1
    report = check_dataset(folder, image_size=32, progress=False, workers=1)
    assert report.readable == 120 and not [p for p in report.problems if p.skipped]
    ds = ImageFolderDataset(folder, 32, flip=False)
    assert ds.classes == sorted(DEFAULT_CLASSES) and len(ds) == 120
    x, label = ds[0]
    assert x.shape == (3, 32, 32) and -1 <= float(x.min()) < float(x.max()) <= 1


def test_deterministic_idempotent_and_atomic(folder, tmp_path):
    again = generate_shapes(tmp_path / "again", per_class=40)
    assert digest(again) == digest(folder)
    mtime = (again / MANIFEST).stat().st_mtime_ns
    assert generate_shapes(again, per_class=40) == again and (again / MANIFEST).stat().st_mtime_ns == mtime
    with pytest.raises(FileExistsError, match="other parameters"):
        generate_shapes(again, per_class=41)
    generate_shapes(again, per_class=41, overwrite=True)
    assert len(list((again / "circle").iterdir())) == 41
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left behind
    # an image depends on (seed, shape, index) only: more classes or another class order leave it unchanged
    more = generate_shapes(tmp_path / "more", per_class=2, classes=("star", "circle"))
    assert (more / "circle" / "circle_0001.png").read_bytes() == (folder / "circle" / "circle_0001.png").read_bytes() \
        if (folder / "circle" / "circle_0001.png").exists() else True
    a, _ = render_shape("circle", 0, 1)
    b, _ = render_shape("circle", 0, 1)
    c, _ = render_shape("circle", 1, 1)
    assert np.array_equal(np.asarray(a), np.asarray(b)) and not np.array_equal(np.asarray(a), np.asarray(c))


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="classes must be some of"):
        generate_shapes(tmp_path / "x", classes=("hexagon",))
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="holds other files"):
        generate_shapes(tmp_path / "busy")


def test_real_shapes_match_the_files_as_the_trainer_reads_them(folder):
    x, y = real_shapes(DEFAULT_CLASSES, per_class=40, seed=0, image_size=32, rotation="upright")
    ds = ImageFolderDataset(folder, 32, flip=False)
    files = torch.stack([ds[i][0] for i in range(len(ds))])
    assert torch.equal(x, files) and y.tolist() == ds.targets


def test_classifier_ceiling_and_what_it_says_about_noise():
    judge = classifier()
    assert judge.val_accuracy >= CEILING
    x, y = real_shapes(DEFAULT_CLASSES, per_class=50, seed=0, image_size=32)  # the training folder's images
    assert class_accuracy(x, y) >= CEILING
    noise = torch.rand(150, 3, 32, 32) * 2 - 1
    real = classwise.score(x, y, judge)
    fake = classwise.score(noise, y, judge)
    assert real["class_accuracy"] >= CEILING and fake["class_accuracy"] < 0.5
    assert real["frechet_distance"] < 3 * real["real_floor"] + 0.05
    assert fake["frechet_distance"] > 100 * real["frechet_distance"]
    assert set(real["per_class_accuracy"]) == set(DEFAULT_CLASSES)


def test_the_clean_test_passes_every_real_shape_and_fails_specks_and_holes():
    """The strict accuracy's second test: a real shape is one piece without holes; a ragged patch is not."""
    from dit_core.eval.shapes import is_clean

    judge = classifier()
    xv, yv = judge.real_images("val")
    assert is_clean(xv).all()  # every held-out real shape (300 images)
    block = -torch.ones(4, 3, 32, 32)
    block[:, :, 8:20, 8:20] = 1.0  # one filled square
    block[1, :, 12:16, 12:16] = -1.0  # a hole in it
    block[2, :, 26:29, 26:29] = 1.0  # a second piece
    block[3, :, 8:20:2, 8:20:2] = -1.0  # a sieve
    assert is_clean(block).tolist() == [True, False, False, False]
    assert judge.is_clean(block).tolist() == [True, False, False, False]
    noise = torch.rand(30, 3, 32, 32) * 2 - 1
    assert is_clean(noise).mean() < 0.2
    real = classwise.score(xv, yv, judge)
    assert real["clean_accuracy"] == real["class_accuracy"] >= CEILING
    specks = xv[:30].clone()
    specks[:, :, ::5, ::5] = torch.where(specks[:, :, :1, :1] > 0, -1.0, 1.0)  # a grid of far-coloured dots
    fake = classwise.score(specks, yv[:30], judge)
    assert fake["clean_accuracy"] < 0.2 and set(fake["per_class_clean_accuracy"]) <= set(DEFAULT_CLASSES)


def test_frechet_distance_orders_degradations():
    import torch.nn.functional as F

    judge = classifier()
    x, _ = real_shapes(DEFAULT_CLASSES, per_class=30, seed=0, image_size=32)
    g = torch.Generator().manual_seed(0)

    def fd(images):
        return classwise.score(images, None, judge)["frechet_distance"]

    def blur(images, k):
        return F.avg_pool2d(F.pad(images, (k // 2,) * 4, mode="replicate"), k, 1)

    blocks = F.interpolate(torch.rand(90, 3, 4, 4, generator=g) * 2 - 1, scale_factor=8, mode="nearest")
    distances = [fd(x), fd(blur(x, 3)), fd(blur(x, 5)), fd(blur(x, 9)), fd(blocks)]
    assert distances == sorted(distances), distances


def test_classifier_is_deterministic():
    from dit_core.eval.shapes import ShapesClassifier

    a, b = ShapesClassifier(per_class=30, val_per_class=10, epochs=1), ShapesClassifier(per_class=30, val_per_class=10,
                                                                                        epochs=1)
    x, _ = real_shapes(per_class=5, seed=3)
    assert np.array_equal(a.features(x), b.features(x))


def test_model_classes_are_mapped_by_name():
    assert classwise.map_labels(["square", "circle"], SHAPES) == [1, 0]
    with pytest.raises(ValueError, match="not \\['hexagon'\\]"):
        classwise.map_labels(["hexagon"], DEFAULT_CLASSES)


def test_digits_and_shapes_share_the_scoring_path():
    from dit_core.eval import digits as evaluate
    from dit_core.eval.digits import load_real_digits

    images, labels = load_real_digits("val")
    shared = classwise.score(images, labels, classwise.digits_judge())
    direct = evaluate.digits_metrics(images, labels)
    for key in ("class_accuracy", "frechet_distance", "real_floor", "classifier_val_accuracy"):
        assert shared[key] == pytest.approx(direct[key])


def test_sample_and_score_an_untrained_model():
    from dit_core.diffusion import create_diffusion
    from dit_core.models import DiT

    torch.manual_seed(0)
    model = DiT(input_size=32, patch_size=8, in_channels=3, hidden_size=32, depth=1, num_heads=2, num_classes=3)
    out = classwise.sample_and_score(model, create_diffusion("", noise_schedule="squaredcos_cap_v2"), classifier(),
                                     class_names=["circle", "square", "triangle"], per_class=2, steps=2)
    assert out["images"].shape == (6, 3, 32, 32) and out["labels"].tolist() == [0, 0, 1, 1, 2, 2]
    assert 0 <= out["class_accuracy"] <= 1 and out["frechet_distance"] > 0


def test_dit_data_shapes_command(tmp_path, capsys):
    from dit_core.cli.data import main as dit_data

    out = tmp_path / "mine"
    assert dit_data(["shapes", str(out), "--per-class", "3", "--classes", "star,circle", "--seed", "1"]) == 0
    assert "6 images, 2 classes (star, circle)" in capsys.readouterr().out
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["seed"] == 1 and manifest["classes"] == ["star", "circle"] and manifest["per_class"] == 3
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["circle", "star"]
    ds = ImageFolderDataset(out, 32, flip=False)
    assert len(ds) == 6 and ds.classes == ["circle", "star"]
    assert dit_data(["shapes", str(out), "--per-class", "3", "--classes", "star,circle", "--seed", "1"]) == 0  # kept
    assert dit_data(["shapes", str(out), "--per-class", "4", "--classes", "star,circle", "--seed", "1"]) == 2
    assert "other parameters" in capsys.readouterr().err
    assert dit_data(["shapes", str(tmp_path / "x"), "--classes", "hexagon"]) == 2
    assert "classes must be some of" in capsys.readouterr().err
    assert dit_data(["shapes", str(tmp_path / "grey"), "--per-class", "2", "--grayscale"]) == 0
    from PIL import Image

    assert {Image.open(p).mode for p in (tmp_path / "grey").rglob("*_*.*")} == {"L"}
    assert dit_data(["shapes", str(tmp_path / "turned"), "--per-class", "2", "--rotation", "any"]) == 0
    assert json.loads((tmp_path / "turned" / MANIFEST).read_text())["rotation"] == "any"


def test_grids_of_the_trainer_and_of_dit_sample_name_the_folders_classes(tmp_path, monkeypatch):
    """A reader's folder, as the digits: the class names in the sample grids are the folder names."""
    import dit_core.sample as sample_module
    from dit_core.cli.sample import main as dit_sample
    from dit_core.cli.train import main as dit_train

    folder = generate_shapes(tmp_path / "mine", per_class=2, classes=("star", "circle"))
    drawn = []
    real_save_grid = sample_module.save_grid

    def spy(images, path, nrow=None, labels=None, **kw):
        drawn.append(list(labels or []))
        return real_save_grid(images, path, nrow=nrow, labels=labels, **kw)

    monkeypatch.setattr(sample_module, "save_grid", spy)
    run = tmp_path / "run"
    assert dit_train(["--config", "small-images", "--data-path", str(folder), "--out", str(run), "--image-size", "8",
                      "--patch-size", "2", "--depth", "1", "--repa-depth", "1", "--hidden-size", "32", "--num-heads", "2", "--max-steps",
                      "2", "--sample-per-class", "1", "--sample-steps", "2", "--tensorboard", "false", "--progress",
                      "false", "--debug", "true"]) == 0
    assert drawn[-1] == ["circle", "star"]  # one row per class, in the label order (sorted folder names)
    assert dit_sample(["--ckpt", str(run), "--per-class", "2", "--steps", "2", "--grid", str(tmp_path / "g.png"),
                       "--no-progress"]) == 0
    assert drawn[-1] == ["circle", "circle", "star", "star"] and (tmp_path / "g.png").is_file()


def _fill_of_bounding_box(img) -> float:
    """The share of the shape's bounding box that the shape covers: 1 for an axis-aligned square."""
    a = np.asarray(img.convert("L"), dtype=np.float32)
    fg = np.abs(a - np.median(np.concatenate([a[0], a[-1], a[:, 0], a[:, -1]]))) > 30
    rows, cols = np.flatnonzero(fg.any(1)), np.flatnonzero(fg.any(0))
    return float(fg[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1].mean())


def test_upright_shapes_are_the_same_images_unturned(tmp_path):
    for i in range(6):
        turned, p_any = render_shape("square", 0, i)
        upright, p_up = render_shape("square", 0, i, rotation="upright")
        assert {k: v for k, v in p_any.items() if k != "angle"} == {k: v for k, v in p_up.items() if k != "angle"}
        assert _fill_of_bounding_box(upright) > 0.85
    # turned squares fill their bounding box less (a square at 45 degrees fills half of it)
    assert np.mean([_fill_of_bounding_box(render_shape("square", 0, i)[0]) for i in range(12)]) < 0.8
    tri = np.asarray(render_shape("triangle", 0, 0, mode="L", rotation="upright")[0], dtype=np.float32)
    rows = np.flatnonzero((np.abs(tri - tri[0, 0]) > 30).sum(1))
    widths = (np.abs(tri - tri[0, 0]) > 30).sum(1)[rows]
    assert widths[0] < widths[-1]  # a point at the top, the flat side at the bottom
    with pytest.raises(ValueError, match="rotation must be one of"):
        render_shape("square", 0, 0, rotation="sideways")
    up = generate_shapes(tmp_path / "up", per_class=2)
    assert json.loads((up / MANIFEST).read_text())["rotation"] == "upright"  # the default
    with pytest.raises(FileExistsError, match="rotation: 'upright', not 'any'"):
        generate_shapes(up, per_class=2, rotation="any")  # the same folder at any angle is another dataset
    x, _ = real_shapes(DEFAULT_CLASSES, per_class=2, seed=0, image_size=16, rotation="upright")
    files = torch.stack([ImageFolderDataset(up, 16, flip=False)[i][0] for i in range(6)])
    assert torch.equal(x, files)
