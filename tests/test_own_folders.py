"""Any folder a reader brings: the bench folders, the object crop, the mirror test and per-class flips, the
pre-flight report of the decisions, guidance over part of the path, and the guidance chosen for a run's folder."""

from __future__ import annotations

import json
import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from dit_core.data import ImageFolderDataset
from dit_core.data.bench import ASYMMETRIC, CLASSES, generate_bench, read_manifest, render_file
from dit_core.data.images import center_crop_arr, flips_label, resize_to
from dit_core.data.objects import CUT_SHARE, locate, object_crop, object_window
from dit_core.data.probe import MIRROR_THRESHOLD, FolderProbe, apply_probe, changed_by_mirror, probe_folder
from dit_core.train import make_config
from dit_core.train.config import ConfigError
from dit_core.train.preflight import DatasetFacts, decisions, preflight

TINY = dict(model="DiT-S/2", depth=2, hidden_size=32, num_heads=2, image_size=8, channels=3, batch_size=8,
            num_workers=0, tensorboard=False, progress=False, sample_at_end=False, log_every=1000, lr=1e-3,
            ema_decay=0.9, diffusion_steps=100, mixed_precision="fp32", objective="flow", learn_sigma=False,
            sample_sampler="euler", sample_steps=3, max_minutes=0, compile="false")


class _Procs:
    is_main, distributed = True, False


# ----------------------------------------------------------------------------------------------------------
# The bench
# ----------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def glyphs(tmp_path_factory):
    return generate_bench(tmp_path_factory.mktemp("bench") / "glyphs", "glyphs", seed=5, per_class=24)


def test_bench_folder_is_deterministic_varied_and_records_its_objects(glyphs, tmp_path):
    m = read_manifest(glyphs)
    assert m["classes"] == list(CLASSES["glyphs"]) and m["mirror_asymmetric"] == ["L", "Z"]
    assert m["total"] == 96 and sum(m["formats"].values()) == 96 and {"png", "jpg"} <= set(m["formats"])
    sizes = [tuple(o["size"]) for o in m["objects"].values()]
    assert sum(w != h for w, h in sizes) > 48  # most files are not square
    assert any(w > h for w, h in sizes) and any(h > w for w, h in sizes)
    # every file is on disk with the size the manifest says, its object inside it
    for name, o in list(m["objects"].items())[:20]:
        with Image.open(glyphs / name) as img:
            assert list(img.size) == o["size"]
        x0, y0, x1, y1 = o["box"]
        assert 0 <= x0 < x1 <= o["size"][0] and 0 <= y0 < y1 <= o["size"][1]
    # the same seed gives the same bytes; another seed other files; a second call leaves the folder alone
    again = generate_bench(tmp_path / "again", "glyphs", seed=5, per_class=24)
    first = sorted(glyphs.rglob("*_0003.*"))
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in sorted(again.rglob("*_0003.*"))]
    assert render_file("glyphs", "L", 6, 3)[1] != render_file("glyphs", "L", 5, 3)[1]
    assert generate_bench(glyphs, "glyphs", seed=5, per_class=24) == glyphs
    with pytest.raises(FileExistsError):
        generate_bench(glyphs, "glyphs", seed=6, per_class=24)
    with pytest.raises(ValueError, match="kind must be one of"):
        generate_bench(tmp_path / "x", "letters")


def test_dit_data_bench_writes_a_folder(tmp_path, capsys):
    from dit_core.cli.data import main

    assert main(["bench", str(tmp_path / "t"), "--kind", "textures", "--seed", "2", "--per-class", "3"]) == 0
    assert "slant" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "t").iterdir() if p.is_dir()) == list(CLASSES["textures"])


# ----------------------------------------------------------------------------------------------------------
# The crop that keeps the object
# ----------------------------------------------------------------------------------------------------------


def _picture(w, h, box, bg=(30, 90, 200), fg=(250, 220, 20)):
    img = Image.new("RGB", (w, h), bg)
    ImageDraw.Draw(img).rectangle(box, fill=fg)
    return img


def test_object_window_moves_to_an_off_centre_object_and_centres_it():
    img = _picture(200, 100, (10, 40, 30, 60))  # a small square near the left end of a wide file
    left, top, side = object_window(img)
    assert (top, side) == (0, 100) and left == 0  # the window slides left as far as the file allows
    img = _picture(300, 100, (220, 40, 240, 60))  # outside the centre square, not at the end: centred on it
    left, _, side = object_window(img)
    assert abs(left + side / 2 - 230) <= 4
    found = locate(img)
    assert found.centre_cut and found.box is not None and abs(found.box[0] - 220) <= 3 and abs(found.box[2] - 241) <= 3
    assert not locate(_picture(300, 100, (160, 40, 180, 60))).centre_cut  # inside the centre square: kept there
    tall = _picture(80, 200, (30, 170, 50, 190))
    assert object_window(tall) == (0, 120, 80)


def test_object_window_keeps_the_centre_crop_where_nothing_stands_out():
    assert object_window(Image.new("RGB", (200, 100), (90, 90, 90))) == (50, 0, 100)  # plain
    assert object_window(_picture(200, 100, (90, 40, 110, 60))) == (50, 0, 100)      # a central object
    noise = Image.fromarray(np.random.default_rng(0).integers(0, 255, (100, 200, 3), dtype=np.uint8))
    assert object_window(noise) == (50, 0, 100)  # texture everywhere: no window holds clearly more
    square = _picture(64, 64, (2, 2, 12, 12))
    assert object_window(square) == (0, 0, 64)
    assert np.array_equal(np.asarray(object_crop(square, 16)), np.asarray(center_crop_arr(square, 16)))


def test_centre_cut_and_object_crop_on_the_bench_agree_with_the_manifest(glyphs):
    m = read_manifest(glyphs)
    truth, probe_cut, kept = [], [], []
    for name, o in m["objects"].items():
        w, h = o["size"]
        side = min(w, h)
        x0, y0, x1, y1 = o["box"]
        cx0, cy0 = (w - side) // 2, (h - side) // 2
        inside = max(0, min(x1, cx0 + side) - max(x0, cx0)) * max(0, min(y1, cy0 + side) - max(y0, cy0))
        truth.append(1 - inside / ((x1 - x0) * (y1 - y0)) > CUT_SHARE)
        img = Image.open(glyphs / name).convert("RGB")
        found = locate(img)
        probe_cut.append(found.centre_cut)
        left, top, s = found.window
        kept.append(x0 >= left - 1 and x1 <= left + s + 1 and y0 >= top - 1 and y1 <= top + s + 1)
    truth, probe_cut = np.array(truth), np.array(probe_cut)
    assert truth.mean() > 0.1  # the bench's files do lose their objects to a centre crop
    assert (truth == probe_cut).mean() >= 0.9
    assert np.mean(kept) >= 0.95  # the object crop keeps (nearly) every object whole


def test_resize_to_object_and_the_dataset_crop(glyphs):
    ds = ImageFolderDataset(glyphs, 16, flip=False, center_crop="object")
    x, _ = ds[0]
    assert x.shape == (3, 16, 16)
    with pytest.raises(ValueError, match="center_crop must be one of"):
        ImageFolderDataset(glyphs, 16, center_crop="middle")
    img = _picture(90, 60, (0, 0, 10, 10))
    assert resize_to(img, 12, "object").size == (12, 12)


# ----------------------------------------------------------------------------------------------------------
# Flips decided from the folder
# ----------------------------------------------------------------------------------------------------------


def test_mirror_test_flips_the_symmetric_classes_only(glyphs):
    ds = ImageFolderDataset(glyphs, 16, flip=False, center_crop="object")
    probe = probe_folder(ds)
    assert set(probe.mirror) == {"A", "L", "T", "Z"}
    for name in ("L", "Z"):  # 8 held-out files a class and their mirror images: 16 tests
        assert probe.mirror[name] >= MIRROR_THRESHOLD and probe.mirror_tested[name] == 16, probe.mirror
    assert sorted(probe.asymmetric()) == ["L", "Z"], probe.mirror
    assert probe.flip_setting() == frozenset({0, 2})
    # the decision weighs the share by the files tested: 12 of 16 is not clearly above chance, 15 of 16 is
    assert not changed_by_mirror(0.75, 16) and changed_by_mirror(15 / 16, 16) and changed_by_mirror(0.8, 400)
    assert not changed_by_mirror(0.6, 10_000)
    assert 0.1 < probe.centre_cut < 0.6 and 0.3 < probe.object_size < 0.9
    assert FolderProbe.from_dict(json.loads(json.dumps(probe.to_dict()))) == probe


def test_per_class_flips_in_the_dataset_and_the_preloaded_batches(glyphs):
    from dit_core.train.batches import SeededItems, flipped_batch, preload, unflipped

    ds = ImageFolderDataset(glyphs, 8, flip=frozenset({0}), center_crop="object")
    assert flips_label(ds.flip, 0) and not flips_label(ds.flip, 1) and flips_label(True, 3) and not flips_label(False, 0)
    seeds = list(range(40))
    items = [(i % len(ds), s) for i, s in zip(range(0, 96, 3), seeds)]
    x_all, y_all = preload(unflipped(ds), torch.device("cpu"))
    x, y = flipped_batch(x_all, y_all, items, ds.flip)
    loader = SeededItems(ds)
    xs = torch.stack([loader[item][0] for item in items])
    assert torch.equal(x, xs)  # the preloaded path flips exactly as the loader
    plain = x_all[[i for i, _ in items]]
    changed = (x != plain).flatten(1).any(1)
    assert changed[y == 0].any() and not changed[y != 0].any()


def test_flip_key_reads_auto_on_and_off_and_crop_is_checked():
    from dit_core.cli.train import parse_args

    for word, value in (("on", True), ("off", False), ("auto", "auto")):  # dit-train --flip on|off|auto
        profile, over = parse_args(["--config", "small-images", "--flip", word])
        assert make_config(profile, over).flip == value
    assert make_config("small-images", {"flip": "auto"}).flip == "auto"
    assert make_config("small-images", {"flip": "on"}).flip is True
    assert make_config("small-images", {"flip": "off"}).flip is False
    assert make_config("digits").flip is False  # profiles with a bool keep working
    assert make_config(None).crop == "adm"  # the ImageNet path keeps the ADM crop
    with pytest.raises(ConfigError, match="flip"):
        make_config(None, {"flip": "sometimes"})
    with pytest.raises(ConfigError, match="crop must be one of"):
        make_config(None, {"crop": "middle"})


def test_apply_probe_decides_once_and_keeps_it_for_a_resumed_run(glyphs, tmp_path):
    cfg = make_config(None, {"flip": "auto", "crop": "object", "image_size": 16})
    ds = ImageFolderDataset(glyphs, 16, flip=True, center_crop="object")
    apply_probe(cfg, ds, tmp_path, _Procs())
    assert ds.flip == frozenset({0, 2}) and (tmp_path / "probe.json").is_file()
    stamp = (tmp_path / "probe.json").stat().st_mtime_ns
    again = apply_probe(cfg, ImageFolderDataset(glyphs, 16, flip=True, center_crop="object"), tmp_path, _Procs())
    assert again.flip == frozenset({0, 2}) and (tmp_path / "probe.json").stat().st_mtime_ns == stamp
    # flip true with the ADM crop, as before: no probe, nothing changes
    plain = ImageFolderDataset(glyphs, 16, flip=True)
    assert apply_probe(make_config(None, {"image_size": 16}), plain, tmp_path / "p", _Procs()).flip is True
    assert not (tmp_path / "p" / "probe.json").exists()


def test_preflight_states_the_decisions_and_warns_on_settings_against_the_folder(glyphs, tmp_path):
    ds = ImageFolderDataset(glyphs, 16, flip=True, center_crop="object")
    apply_probe(make_config(None, {"flip": "auto", "crop": "object"}), ds, tmp_path, _Procs())
    facts = DatasetFacts.of(ds)
    cfg = make_config("small-images", {"flip": "auto", "crop": "object"})
    lines = decisions(cfg, facts)
    assert lines[0].startswith("flip: on for A and T") and "off for L and Z" in lines[0]
    assert any(line.startswith("crop: a square of the short side placed where the object is") for line in lines)
    assert all(f.key not in ("flip", "crop") for f in preflight(cfg, facts))
    by_hand = make_config("small-images", {"flip": True, "crop": "adm"})
    keys = [f.key for f in preflight(by_hand, facts)]
    assert "flip" in keys and "crop" in keys
    flip = next(f for f in preflight(by_hand, facts) if f.key == "flip")
    assert "L and Z" in flip.message and "--flip auto" in flip.fix
    assert decisions(cfg, DatasetFacts(96, 4, (3, 16, 16))) == []  # no probe, nothing to say


def test_teacher_flips_only_the_classes_it_is_given():
    from dit_core.teachers import fit_pixel_teacher

    x = torch.zeros(8, 1, 8, 8)
    x[:, :, :, :2] = 1.0  # a bar on the left: a mirror moves it right
    y = torch.tensor([0, 1] * 4)
    for flip in (frozenset({0}), True, False):
        net = fit_pixel_teacher(x, y, 2, steps=3, flip=flip)
        assert net.train_accuracy >= 0.0  # trains with a set of labels as with a bool


# ----------------------------------------------------------------------------------------------------------
# Guidance over part of the path, and chosen for the folder
# ----------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_run(glyphs, tmp_path_factory):
    from dit_core.train import train

    out = tmp_path_factory.mktemp("run") / "run"
    cfg = make_config(None, {**TINY, "data_path": str(glyphs), "out": str(out), "max_steps": 30, "flip": "auto",
                             "crop": "object", "guidance_search": True})
    summary = train(cfg)
    return out, summary


def test_interval_guidance_matches_constant_guidance_and_none(tiny_run):
    from dit_core.diffusion import process_of
    from dit_core.sample import check_interval, generate, load_model

    out, _ = tiny_run
    model, info = load_model(out / "checkpoints" / "last.pt")
    process = process_of(info, model.learn_sigma)
    kw = dict(sampler="euler", steps=4, seed=3)
    labels = [0, 1, 2, 3]
    guided = generate(model, process, labels, cfg_scale=3.0, **kw)
    plain = generate(model, process, labels, cfg_scale=1.0, **kw)
    assert torch.equal(generate(model, process, labels, cfg_scale=3.0, guidance_interval=(0, 1), **kw), guided)
    # Euler on 4 intervals evaluates at t = 1, 0.75, 0.5, 0.25: none lies in [0.05, 0.2]
    assert torch.equal(generate(model, process, labels, cfg_scale=3.0, guidance_interval=(0.05, 0.2), **kw), plain)
    part = generate(model, process, labels, cfg_scale=3.0, guidance_interval=(0.0, 0.6), **kw)
    assert not torch.equal(part, guided) and not torch.equal(part, plain)
    with pytest.raises(ValueError, match="0 <= lo < hi <= 1"):
        check_interval((0.7, 0.2))


def test_the_run_chose_its_guidance_and_sampling_uses_it(tiny_run):
    from dit_core.eval.guidance import CANDIDATES
    from dit_core.sample import load_model

    out, summary = tiny_run
    record = json.loads((out / "guidance.json").read_text())
    assert len(record["candidates"]) == len(CANDIDATES) and 0 <= record["ceiling"] <= 1
    assert summary["guidance"] == record["chosen"]
    assert json.loads((out / "probe.json").read_text())["flipped"] == [0, 2]
    _, info = load_model(out)
    assert info["cfg_scale"] == record["chosen"]["cfg_scale"] and info["guidance_source"].endswith("guidance.json")
    assert info["guidance_interval"] == record["chosen"]["interval"]


def test_dit_sample_reports_the_chosen_guidance(tiny_run, tmp_path, capsys):
    from dit_core.cli.sample import main as sample_main

    out, _ = tiny_run
    chosen = json.loads((out / "guidance.json").read_text())["chosen"]
    assert sample_main(["--ckpt", str(out), "--per-class", "1", "--grid", str(tmp_path / "g.png"), "--json",
                        "--no-progress", "--steps", "2"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["cfg_scale"] == chosen["cfg_scale"] and said["guidance_interval"] == chosen["interval"]
    assert sample_main(["--ckpt", str(out), "--per-class", "1", "--grid", str(tmp_path / "g.png"), "--json",
                        "--no-progress", "--steps", "2", "--cfg-scale", "1.5"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["cfg_scale"] == 1.5 and said["guidance_interval"] is None
    assert sample_main(["--ckpt", str(out), "--per-class", "1", "--grid", str(tmp_path / "g.png"),
                        "--guidance-interval", "0.9,0.1"]) == 2


def test_pick_takes_the_most_varied_of_the_best_and_guards_against_collapse():
    from dit_core.eval.guidance import pick, spread_ratio

    rows = [dict(cfg_scale=1.5, accuracy=0.80, spread=0.95, frechet_distance=2.0),
            dict(cfg_scale=3.0, accuracy=0.91, spread=0.85, frechet_distance=1.0),
            dict(cfg_scale=4.0, accuracy=0.92, spread=0.80, frechet_distance=1.5),
            dict(cfg_scale=8.0, accuracy=0.99, spread=0.40, frechet_distance=3.0)]
    assert pick(rows)["cfg_scale"] == 3.0  # 8 collapses variety; 3 and 4 tie, 3 lies closer to the files
    assert pick([dict(cfg_scale=8.0, accuracy=0.9, spread=0.3, frechet_distance=1.0),
                 dict(cfg_scale=9.0, accuracy=0.95, spread=0.2, frechet_distance=1.0)])["cfg_scale"] == 8.0
    g = np.random.default_rng(0)
    real = g.normal(size=(200, 5))
    labels = np.repeat([0, 1], 100)
    assert spread_ratio(real * 0.5, labels, real, labels) == pytest.approx(0.5)


def test_bench_judge_names_classes_and_tells_mirrored_letters():
    from dit_core.eval.bench import BenchJudge, score, touches_frame

    judge = BenchJudge("glyphs", 16, "object", per_class=80, val_per_class=20, epochs=8)
    assert judge.classes == ["A", "L", "T", "Z", "L (mirrored)", "Z (mirrored)"]
    assert judge.val_accuracy >= 0.9 and judge.mirror_accuracy >= 0.9
    xv, yv = judge.real_images("val")
    got = score(xv, yv, judge)
    assert got["class_accuracy"] == pytest.approx(judge.val_accuracy)
    mirrored = score(xv.flip(-1), yv, judge)  # every file mirrored: the asymmetric letters are called mirrored
    assert mirrored["mirrored_rate"] >= 0.9 and mirrored["mirrored_rate_per_class"].keys() == {"L", "Z"}
    frame = torch.full((2, 3, 16, 16), -1.0)
    frame[0, :, 6:10, 6:10] = 1.0
    frame[1, :, 0:4, 6:10] = 1.0
    assert touches_frame(frame).tolist() == [False, True]
    assert set(ASYMMETRIC["glyphs"]) == {"L", "Z"}


def test_the_project_s_square_folder_trains_as_with_the_old_settings(tmp_path):
    """`dit-data shapes` (square files, classes a mirror leaves alone): flip auto keeps every flip and the object crop
    of a square file is the ADM crop, so the profile trains the same weights as with flip true and the ADM crop."""
    from dit_core.data.shapes import generate_shapes
    from dit_core.train import train

    folder = generate_shapes(tmp_path / "shapes", per_class=12)
    tiny = dict(depth=2, hidden_size=32, num_heads=2, repa_weight=0, batch_size=8, max_minutes=0,
                max_steps=4, compile="false", mixed_precision="fp32", cpu_processes=1, tensorboard=False,
                progress=False, sample_at_end=False, guidance_search=False, data_path=str(folder))
    train(make_config("small-images", {**tiny, "out": str(tmp_path / "new")}))
    train(make_config("small-images", {**tiny, "out": str(tmp_path / "old"), "flip": True, "crop": "adm"}))
    probe = json.loads((tmp_path / "new" / "probe.json").read_text())
    assert probe["flipped"] == [0, 1, 2] and probe["centre_cut"] == 0.0
    new, old = (torch.load(tmp_path / r / "checkpoints" / "last.pt", weights_only=True)["model"] for r in ("new", "old"))
    assert all(torch.equal(new[k], old[k]) for k in new)
