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
