"""dit_core.measure.env: the environment report and the profile it recommends."""

from __future__ import annotations

import json

import pytest
import torch

from dit_core.cli.env import main as dit_env
from dit_core import runtime
from dit_core.measure.env import cpu_info, environment_report, format_report, recommend_profile


def _gpu_report(memory_gib: float, capability: str) -> dict:
    gpu = {"index": 0, "name": "fake", "memory_gib": memory_gib, "capability": capability, "multiprocessors": 1}
    return {"cuda_available": True, "gpus": [gpu]}


@pytest.mark.parametrize(
    "memory, capability, profile",
    [
        (11.8, "8.6", "rtx3060-12gb"),  # RTX 3060 12 GB
        (15.8, "7.0", "rtx3060-12gb"),  # V100 16 GB
        (23.6, "8.9", "rtx3090-24gb"),  # RTX 4090 / 3090
        (39.4, "8.0", "a100-40gb"),
        (44.5, "8.9", "a100-40gb"),  # L40S 48 GB reports about 44.5 GiB
        (79.2, "8.0", "a100-80gb"),
        (79.1, "9.0", "h100-80gb"),
        (139.8, "9.0", "h100-80gb"),  # H200
    ],
)
def test_profile_by_gpu_memory_and_architecture(memory, capability, profile):
    assert recommend_profile(_gpu_report(memory, capability)) == profile


def test_profile_without_gpu_is_digits():
    assert recommend_profile({"cuda_available": False, "gpus": []}) == "digits"


def test_report_on_this_machine():
    report = environment_report()
    json.dumps(report)  # plain data
    assert report["torch"] == torch.__version__
    assert report["cuda_available"] == torch.cuda.is_available()
    if not torch.cuda.is_available():
        assert report["profile"] == "digits" and report["gpus"] == [] and not report["bf16_supported"]
    assert report["attention"]["math"] is True  # the reference kernel runs everywhere
    assert set(report["attention"]) >= {"flash", "mem_efficient", "math", "xformers"}
    cpu = report["cpu"]
    assert cpu["torch_threads"] == torch.get_num_threads() and cpu["usable_cores"] >= 1
    text = format_report(report)
    for label in ("torch", "CUDA available", "bf16", "TF32", "attention", "CPU threads", "CPU bf16", "profile"):
        assert label in text
    assert f"profile           {report['profile']}" in text


def test_cpu_info_reports_what_runtime_reads():
    info = cpu_info()
    model, flags = runtime.cpu_flags()
    assert info["model"] == model and info["bf16_units"] == runtime.cpu_bf16_units(flags)
    assert info["bf16_fast"] == runtime.cpu_has_fast_bf16() and info["usable_cores"] == runtime.usable_cores()
    assert info["bf16_auto"] == runtime.cpu_bf16_is_faster() and info["bf16_speedup"] >= 0.0


def test_format_report_for_a_gpu_machine():
    report = environment_report(probe_attention=False)
    report.update(
        cuda_available=True, cuda_build="12.8", cudnn=91000, bf16_supported=True, tf32_supported=True,
        gpus=[{"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_gib": 79.1, "capability": "9.0",
               "multiprocessors": 132}],
    )
    report["profile"] = recommend_profile(report)
    text = format_report(report)
    assert "NVIDIA H100 80GB HBM3, 79.1 GiB, compute capability 9.0" in text
    assert "h100-80gb" in text


def test_dit_env_cli(capsys):
    from dit_core.train.config import profiles

    assert dit_env(["--json", "--no-probe"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["torch"] == torch.__version__ and report["attention"] == {}  # --no-probe runs no kernel
    assert report["cpu"]["usable_cores"] == runtime.usable_cores()
    if torch.cuda.is_available():
        assert report["profile"] in profiles() and report["profile"] != "digits"
    else:
        assert report["profile"] == "digits" and report["gpus"] == []
    assert dit_env([]) == 0
    text = capsys.readouterr().out
    assert f"profile           {report['profile']}" in text
    assert "attention         " in text and "math: yes" in text  # without --no-probe the kernels are run


# --------------------------------------------------------------------------------- the track, on faked GPUs
def _fake_gpu(monkeypatch, name: str, capability: tuple[int, int], memory_gib: float):
    """Make torch report one CUDA GPU of this kind (nothing runs on it: the report is built with probe off)."""
    import types

    major, minor = capability
    props = types.SimpleNamespace(name=name, major=major, minor=minor, total_memory=int(memory_gib * 2**30),
                                  multi_processor_count=40)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=0: props)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0: capability)
    # as torch answers: pre-Ampere cards "support" bf16 through emulation unless emulation is excluded
    monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                        lambda including_emulation=True: major >= 8 or including_emulation)
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91000)


@pytest.mark.parametrize("name, capability, memory, track_profile, precision, long_run", [
    ("Tesla T4", (7, 5), 14.6, "imagenette-b2-fp16", "fp16", "rtx3060-12gb"),
    ("Tesla V100-SXM2-32GB", (7, 0), 31.7, "imagenette-b2-fp16", "fp16", "a100-40gb"),
    ("NVIDIA GeForce RTX 4090", (8, 9), 23.6, "imagenette-b2", "bf16", "rtx3090-24gb"),
    ("NVIDIA H100 80GB HBM3", (9, 0), 79.1, "imagenette-b2", "bf16", "h100-80gb"),
])
def test_track_and_precision_follow_the_gpus_capability(monkeypatch, name, capability, memory, track_profile,
                                                        precision, long_run):
    from dit_core.train import make_config

    _fake_gpu(monkeypatch, name, capability, memory)
    assert torch.cuda.is_bf16_supported()  # what torch says, emulation included, on every card here
    report = environment_report(probe_attention=False)
    track = report["track"]
    assert (track["track"], track["profile"], track["precision"], track["long_run"]) == (
        "gpu", track_profile, precision, long_run)
    assert report["bf16_supported"] == (precision == "bf16")
    cuda = torch.device("cuda", 0)
    assert runtime.resolve_precision("auto", cuda) == precision  # bf16 never where it is emulated
    cfg = make_config(track["profile"])
    assert cfg.mixed_precision == precision and cfg.model == "DiT-B/2"
    long_cfg = make_config(track["long_run"], track["long_run_overrides"])
    assert long_cfg.mixed_precision == precision  # the XL/2 profile switched to fp16 where bf16 is emulated
    text = format_report(report)
    assert f"track             gpu: chapters use {track_profile} ({precision})" in text
    if precision == "fp16":
        assert "--mixed-precision fp16" in text and "no bf16 on this GPU" in text
        with pytest.raises(ValueError, match="no bf16 support"):
            runtime.resolve_precision("bf16", cuda)


def test_the_fp16_profile_trains_with_a_gradient_scaler(tmp_path):
    from dit_core.train import make_config, train

    class Latents(torch.utils.data.Dataset):  # 16 random 4x4x4 latents under ImageNet labels
        num_classes, sample_shape, flip = 1000, (4, 4, 4), False

        def __len__(self):
            return 16

        def __getitem__(self, i):
            return torch.randn(4, 4, 4, generator=torch.Generator().manual_seed(i)), [0, 217, 701][i % 3]

    cfg = make_config("imagenette-b2-fp16", dict(
        depth=1, hidden_size=32, num_heads=2, batch_size=4, grad_accum=2, max_steps=2, num_workers=0, device="cpu",
        tensorboard=False, progress=False, sample_at_end=False, out=str(tmp_path / "run")))
    summary = train(cfg, dataset=Latents())
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)
    assert summary["precision"] == "fp16" and ckpt["scaler"]["scale"] > 0  # fp16 runs with its loss scaler
