"""``dit-train`` says what its command line changed in a profile (dit_core.train.overrides): each key old -> new,
the model's size that ``--model`` replaced, that the profile's other settings were tuned for the profile's model,
and both models' parameter counts, printed and recorded in ``<out>/config.yaml`` under ``run: overrides``."""

from __future__ import annotations

import torch
import yaml

from dit_core.cli.train import main, resolve_args
from dit_core.train.overrides import find_overrides

TINY_PROFILE = dict(model="DiT-S/2", depth=2, hidden_size=32, num_heads=2, image_size=8, channels=1, flip=False,
                    batch_size=8, num_workers=0, tensorboard=False, progress=False, sample_at_end=False,
                    log_every=1000, lr=1e-3, diffusion_steps=100, mixed_precision="fp32", max_steps=2)


def test_model_name_on_the_digits_profile_says_what_it_replaced():
    cfg, overrides = resolve_args(["--config", "digits", "--model", "DiT-S/2"])
    changed = {c.key: (c.old, c.new, c.by) for c in overrides.changes}
    # the profile's size keys are dropped: DiT-S/2 at its own size
    assert changed == {"depth": (4, None, "--model"), "hidden_size": (128, None, "--model"),
                       "num_heads": (4, None, "--model")}
    assert overrides.tuned_model == {"model": "DiT-S/2", "depth": 4, "hidden_size": 128, "num_heads": 4}
    lines = overrides.lines(cfg)
    assert lines[0] == "dit-train: the command line changed 3 setting(s) of profile digits:"
    assert "  depth: 4 -> 12 (DiT-S/2's own) (--model)" in lines
    assert "  hidden_size: 128 -> 384 (DiT-S/2's own) (--model)" in lines
    assert "  num_heads: 4 -> 6 (DiT-S/2's own) (--model)" in lines
    warning = lines[-1]
    assert "the profile's model is DiT-S/2 with depth 4, hidden_size 128, num_heads 4; this run trains DiT-S/2." in warning
    assert "(lr 0.003, batch_size 64, max_steps 800, warmup_steps 100" in warning
    assert "were tuned for the profile's model, not for this one" in warning and "drop --model" in warning
    assert overrides.record()["tuned_for"] == overrides.tuned_model


def test_plain_overrides_are_listed_old_to_new_without_the_size_warning():
    cfg, overrides = resolve_args(["--config", "digits", "--lr", "1e-3", "--out", "runs/x", "--max-steps", "800"])
    lines = overrides.lines(cfg)
    assert lines == ["dit-train: the command line changed 2 setting(s) of profile digits:",
                     "  lr: 0.003 -> 0.001 (--lr)",
                     "  out: runs/dit (default) -> runs/x (--out)"]  # max_steps 800 is the profile's own
    assert overrides.tuned_model is None
    assert overrides.record() == {"profile": "digits", "changed": {
        "lr": {"from": 0.003, "to": 0.001, "by": "--lr"}, "out": {"from": "runs/dit", "to": "runs/x", "by": "--out"}}}


def test_a_size_key_alone_resizes_without_blaming_model(tmp_path):
    profile = tmp_path / "tiny.yaml"
    profile.write_text(yaml.safe_dump(TINY_PROFILE))
    cfg, overrides = resolve_args(["--config", str(profile), "--hidden-size", "64"])
    assert [(c.key, c.old, c.new, c.by) for c in overrides.changes] == [("hidden_size", 32, 64, "--hidden-size")]
    warning = overrides.lines(cfg)[-1]
    assert "the profile's model is DiT-S/2 with depth 2, hidden_size 32, num_heads 2; this run trains DiT-S/2 " \
           "with depth 2, hidden_size 64, num_heads 2" in warning
    assert "drop --model" not in warning and "(lr 0.001, batch_size 8, max_steps 2, mixed_precision fp32)" in warning


def test_no_profile_and_no_change_says_nothing():
    cfg, overrides = resolve_args([])
    assert overrides.changes == [] and overrides.lines(cfg) == []
    # without a profile the command line is the whole configuration
    cfg, overrides = resolve_args(["--model", "DiT-S/2", "--depth", "2", "--lr", "1e-3"])
    assert overrides.changes == [] and overrides.lines(cfg) == []
    assert find_overrides("digits", {}, resolve_args(["--config", "digits"])[0]).changes == []


def test_a_run_prints_and_records_what_it_changed_and_both_parameter_counts(tmp_path, capsys):
    from dit_core.data import export_digits

    digits = export_digits(tmp_path / "digits")
    profile = tmp_path / "tiny.yaml"
    profile.write_text(yaml.safe_dump(dict(TINY_PROFILE, data_path=str(digits))))
    out = tmp_path / "run"
    assert main(["--config", str(profile), "--depth", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "  depth: 2 -> 1 (--depth)" in printed
    assert "were tuned for the profile's model, not for this one" in printed
    run = yaml.safe_load((out / "config.yaml").read_text())["run"]
    record = run["overrides"]
    assert record["changed"]["depth"] == {"from": 2, "to": 1, "by": "--depth"}
    assert record["tuned_for"] == {"model": "DiT-S/2", "depth": 2, "hidden_size": 32, "num_heads": 2}
    counts = record["parameters"]
    assert counts["this_run"] == run["parameters"] < counts["profile_model"]
    # one block of width 32 fewer: the block's attention, MLP and adaLN modulation
    block = (32 * 96 + 96) + (32 * 32 + 32) + (32 * 128 + 128) + (128 * 32 + 32) + (32 * 192 + 192)
    assert counts["profile_model"] - counts["this_run"] == block
    assert f"parameters: {counts['this_run'] / 1e6:.2f} M in this run, {counts['profile_model'] / 1e6:.2f} M" in printed
    # the checkpoint keeps the run's facts, not the command line's: a resume by another command line matches it
    saved = torch.load(out / "checkpoints" / "last.pt", map_location="cpu", weights_only=False)["config"]
    assert "overrides" not in saved and saved["parameters"] == counts["this_run"] and saved["depth"] == 1
