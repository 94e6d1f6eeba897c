"""Pre-flight: each check fires on a configuration that cannot work and stays quiet on the shipped profiles."""

import dataclasses

import pytest

from dit_core.train.config import make_config, profiles
from dit_core.train.preflight import DatasetFacts, Finding, errors, format_findings, preflight

# The data each shipped profile is made for.
DIGITS = DatasetFacts(num_images=1437, num_classes=10, sample_shape=(1, 8, 8))
SHAPES = DatasetFacts(num_images=900, num_classes=3, sample_shape=(3, 16, 16))
IMAGENET = DatasetFacts(num_images=1_281_167, num_classes=1000, sample_shape=(4, 32, 32), is_latent=True)
FACTS = {"digits": DIGITS, "small-images": SHAPES}


def facts_for(profile: str) -> DatasetFacts:
    return FACTS.get(profile, IMAGENET)  # the GPU profiles train on ImageNet latents


def keys(findings: list[Finding]) -> list[str]:
    return [f.key for f in findings]


@pytest.mark.parametrize("profile", profiles())
def test_quiet_on_every_shipped_profile(profile):
    cfg = make_config(profile)
    assert preflight(cfg, facts_for(profile)) == []


def test_the_issue_s_run_gets_the_ema_warning_with_its_numbers():
    # dit-train --data-path FOLDER --image-size 32 --model DiT-S/4 --max-steps 150 --batch-size 32 --lr 3e-4
    cfg = make_config(None, {"image_size": 32, "model": "DiT-S/4", "max_steps": 150, "batch_size": 32, "lr": 3e-4})
    found = preflight(cfg, DatasetFacts(360, 3, (3, 32, 32)))
    assert keys(found) == ["ema_decay"]
    (f,) = found
    assert f.level == "warning"
    assert "98.5 %" in f.message and "10,000" in f.message
    assert "--ema-warmup true" in f.fix and "--ema-decay 0.9666" in f.fix


def test_ema_quiet_with_warmup_or_a_short_horizon():
    base = {"max_steps": 1000, "batch_size": 32}
    assert "ema_decay" not in keys(preflight(make_config(None, {**base, "ema_warmup": True}), SHAPES))
    assert "ema_decay" not in keys(preflight(make_config(None, {**base, "ema_decay": 0.99}), SHAPES))
    assert "ema_decay" in keys(preflight(make_config(None, {**base, "ema_decay": 0.999}), SHAPES))


def test_ema_fix_of_a_very_short_run_names_a_decay_that_exists():
    # 1 - 5/steps is 0 or negative for 5 steps or fewer: the fix offers no EMA then, not a negative decay
    (f,) = preflight(make_config(None, {"max_steps": 2, "batch_size": 32}), DatasetFacts(32, 3, (3, 32, 32)))[:1]
    assert f.key == "ema_decay" and "--ema-decay 0 (the EMA is then the model itself)" in f.fix
    assert "--ema-decay -" not in f.fix


def test_batch_larger_than_the_dataset():
    cfg = make_config("small-images", {"batch_size": 128})
    found = preflight(cfg, DatasetFacts(100, 3, (3, 32, 32)))
    (f,) = [f for f in found if f.key == "batch_size"]
    assert f.level == "warning" and "--batch-size 64" in f.fix


def test_too_few_passes_over_the_data():
    cfg = make_config("small-images", {"max_steps": 20})
    (f,) = [f for f in preflight(cfg, SHAPES) if f.key == "max_steps"]
    assert "only ~" in f.message and "--max-steps" in f.fix


def test_a_run_far_shorter_than_the_profile_s_reference_steps():
    # the profile's figures were measured at reference_steps; a fixed run of a third of them is flagged
    ref = make_config("small-images").reference_steps
    assert ref > 0
    (f,) = [f for f in preflight(make_config("small-images", {"max_minutes": 0, "max_steps": ref // 3}), SHAPES)
            if f.key == "reference_steps"]
    assert f.level == "warning" and f"--max-steps {ref:,}" in f.fix and "33 %" in f.message
    # a time budget's plan (dit_core.train.loop re-runs the check with it): the fix scales the minutes
    cfg = make_config("small-images", {"max_minutes": 9.5, "max_steps": 1241, "reference_steps": 3400})
    (f,) = [f for f in preflight(cfg, SHAPES, budgeted=True) if f.key == "reference_steps"]
    assert "9.5 min" in f.message and "1,241 steps" in f.message and "--max-minutes 27" in f.fix
    # the same length as a cap the user set (a budget that did not decide it): the fix is the steps
    (f,) = [f for f in preflight(cfg, SHAPES) if f.key == "reference_steps"]
    assert "1,241 steps" in f.message and "min" not in f.message and "--max-steps 3,400" in f.fix
    # three quarters or more of the reference, or no reference: quiet
    for overrides in ({"max_steps": int(0.75 * ref) + 1}, {"max_steps": 500, "reference_steps": 0}):
        assert "reference_steps" not in keys(preflight(make_config("small-images", overrides), SHAPES))
    with pytest.raises(Exception, match="reference_steps"):
        make_config("small-images", {"reference_steps": -1})


def test_high_lr_without_warmup_and_absurd_lr():
    cfg = make_config("small-images", {"warmup_steps": 0})
    assert keys(preflight(cfg, SHAPES)) == ["warmup_steps"]
    assert "warmup_steps" not in keys(preflight(make_config(None, {"lr": 3e-4, "warmup_steps": 0}), IMAGENET))
    assert "lr" in keys(preflight(make_config("small-images", {"lr": 0.05}), SHAPES))


def test_warmup_longer_than_the_run_and_min_lr_above_lr():
    found = preflight(make_config("small-images", {"warmup_steps": 5000, "max_steps": 3400}), SHAPES)
    assert "warmup_steps" in keys(found)
    found = preflight(make_config("small-images", {"min_lr": 1.0}), SHAPES)
    assert keys(found) == ["min_lr"]


def test_guidance_without_label_dropout():
    cfg = make_config("small-images", {"class_dropout_prob": 0})
    (f,) = [f for f in preflight(cfg, SHAPES) if f.key == "class_dropout_prob"]
    assert "null class" in f.message and "--class-dropout-prob 0.1" in f.fix
    # unguided grids, or an unconditional model, need no null class
    assert preflight(make_config("small-images", {"class_dropout_prob": 0, "sample_cfg_scale": 1}), SHAPES) == []
    assert preflight(make_config("small-images", {"class_dropout_prob": 0, "class_cond": False}), SHAPES) == []


def test_patch_size_that_does_not_divide_the_input_is_an_error():
    found = preflight(make_config("small-images", {"image_size": 36, "patch_size": 8}), DatasetFacts(900, 3, (3, 36, 36)))
    (f,) = errors(found)
    assert f.key == "patch_size" and "--patch-size 4, or --image-size 32 or 40" in f.fix
    latent = DatasetFacts(1000, 10, (4, 30, 30), is_latent=True)  # 240 px images
    found = preflight(make_config("a100-80gb", {"image_size": 240, "patch_size": 4}), latent)
    (f,) = errors(found)
    assert "image_size / 8" in f.message and "--image-size" not in f.fix and "--patch-size 2" in f.fix


def test_image_size_that_the_latents_do_not_have():
    found = preflight(make_config("a100-80gb", {"image_size": 512}), IMAGENET)
    assert keys(found) == ["image_size"] and "256 px" in found[0].message


def test_grids_never_shown_and_grids_of_missing_classes():
    (f,) = preflight(make_config("small-images", {"sample_every": 10**6}), SHAPES)
    assert f.key == "sample_every" and "no grid" in f.message
    (f,) = preflight(make_config("small-images", {"sample_classes": [0, 5]}), SHAPES)
    assert f.level == "error" and f.key == "sample_classes" and "[5]" in f.message


def test_format_puts_errors_first_and_names_the_key():
    found = [Finding("warning", "ema_decay", "slow EMA.", "--ema-warmup true"),
             Finding("error", "patch_size", "no patches.", "--patch-size 2")]
    text = format_findings(found)
    assert text.index("[patch_size]") < text.index("[ema_decay]")
    assert "fix: --ema-warmup true" in text and str(found[1]).startswith("error: no patches.")


def test_facts_of_a_dataset():
    import torch

    class Folder(torch.utils.data.Dataset):
        num_classes, sample_shape = 3, (3, 32, 32)

        def __len__(self):
            return 50

        def __getitem__(self, i):
            return torch.zeros(3, 32, 32), 0

    facts = DatasetFacts.of(torch.utils.data.Subset(Folder(), range(20)))
    assert facts == DatasetFacts(20, 3, (3, 32, 32), False)


def test_patch_wider_than_the_token():
    found = preflight(make_config("small-images", {"patch_size": 8, "hidden_size": 128}), SHAPES)
    (f,) = [f for f in found if f.key == "hidden_size"]
    assert "192 numbers" in f.message and "--patch-size 4" in f.fix and "--hidden-size 384" in f.fix
    assert "hidden_size" not in keys(preflight(make_config("small-images", {"patch_size": 8, "hidden_size": 384}), SHAPES))


def test_grey_folders_and_small_images(tmp_path):
    from dit_core.data import ImageFolderDataset
    from dit_core.data.shapes import generate_shapes

    folder = generate_shapes(tmp_path / "grey", per_class=4, mode="L")
    facts = DatasetFacts.of(ImageFolderDataset(folder, 32, flip=False))
    assert facts.grey_share == 1.0 and facts.median_side >= 48 and facts.num_images == 12
    (f,) = preflight(make_config("small-images"), dataclasses.replace(facts, num_images=900))
    assert f.key == "channels" and f.fix == "--channels 1."
    small = DatasetFacts(900, 3, (3, 64, 64), grey_share=0.0, median_side=40)
    found = preflight(make_config("small-images", {"image_size": 64}), small)
    assert [f.key for f in found] == ["image_size"] and "--image-size 32." == found[0].fix
    assert preflight(make_config("small-images", {"channels": 1}),
                     DatasetFacts(900, 3, (1, 32, 32), grey_share=0.0, median_side=64))[0].key == "channels"


# -- the check in dit-train itself: printed before the first step, errors stop the run ----------------------

RUN_ARGS = ["--model", "DiT-S/2", "--depth", "1", "--hidden-size", "32", "--num-heads", "2", "--image-size", "8",
            "--channels", "3", "--flip", "false", "--batch-size", "8", "--num-workers", "0", "--tensorboard", "false",
            "--progress", "false", "--sample-at-end", "false", "--diffusion-steps", "100"]


@pytest.fixture(scope="module")
def small_folder(tmp_path_factory):
    from dit_core.data.shapes import generate_shapes

    return generate_shapes(tmp_path_factory.mktemp("preflight") / "shapes", per_class=4)


def test_dit_train_prints_the_ema_warning_before_the_first_step(tmp_path, small_folder, capsys):
    from dit_core.cli.train import main

    # the paper's EMA (0.9999, no warm-up) on a 150-step run; --debug trains 5 of them, the check sees all 150
    code = main(["--data-path", str(small_folder), "--out", str(tmp_path / "run"), *RUN_ARGS, "--max-steps", "150",
                 "--ema-decay", "0.9999", "--ema-warmup", "false", "--lr", "1e-4", "--debug", "true"])
    out = capsys.readouterr().out
    assert code == 0
    warning = out.index("pre-flight warning [ema_decay]")
    assert "98.5 %" in out and "fix: --ema-warmup true" in out
    assert warning < out.index("step ")  # before the training log
    assert (tmp_path / "run" / "checkpoints" / "last.pt").is_file()  # a warning does not stop the run


def test_dit_train_quiet_on_a_sound_run(tmp_path, small_folder, capsys):
    from dit_core.cli.train import main

    code = main(["--data-path", str(small_folder), "--out", str(tmp_path / "run"), *RUN_ARGS, "--max-steps", "100",
                 "--batch-size", "4", "--ema-warmup", "true", "--lr", "1e-4", "--debug", "true"])
    assert code == 0 and "pre-flight" not in capsys.readouterr().out


def test_dit_train_stops_on_a_certain_failure_before_training(tmp_path, small_folder, capsys):
    from dit_core.cli.train import main

    code = main(["--data-path", str(small_folder), "--out", str(tmp_path / "run"), *RUN_ARGS, "--max-steps", "10",
                 "--image-size", "10", "--model", "DiT-S/4"])
    err = capsys.readouterr().err
    assert code == 2 and "pre-flight" in err and "[patch_size]" in err and "fix: --patch-size 2" in err
    assert not (tmp_path / "run" / "checkpoints").exists()
