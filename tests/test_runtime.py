"""dit_core.runtime: devices, the precision rules, the CPU's bf16 units and the thread count."""

from __future__ import annotations

import pytest
import torch

from dit_core import runtime

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480C
flags\t\t: fpu vme sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile
processor\t: 1
model name\t: ignored, the first one counts
flags\t\t: fpu
"""


def test_cpu_flags_are_parsed_from_cpuinfo(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO)
    model, flags = runtime.cpu_flags(path)
    assert model == "Intel(R) Xeon(R) Platinum 8480C"
    assert {"avx2", "avx512_bf16", "amx_bf16"} <= flags and "fpu" in flags and len(flags) == 8
    assert runtime.cpu_bf16_units(flags) == "AMX"
    assert runtime.cpu_bf16_units(flags - {"amx_bf16"}) == "AVX512-BF16"
    assert runtime.cpu_bf16_units({"avx2", "avx512f"}) is None
    # no cpuinfo (macOS, Windows): no flags, and a model name from the platform
    model, flags = runtime.cpu_flags(tmp_path / "missing")
    assert flags == set() and isinstance(model, str)


def test_fast_bf16_follows_the_flags(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO)
    assert runtime.cpu_has_fast_bf16(path)
    path.write_text(CPUINFO.replace("avx512_bf16 amx_bf16", ""))
    assert not runtime.cpu_has_fast_bf16(path)


def test_auto_takes_bf16_on_a_cpu_only_where_the_measured_matmul_is_faster(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(runtime, "_amx_usable", lambda: False)
    for speedup, precision in ((0.63, "fp32"), (1.1, "fp32"), (1.8, "bf16")):  # 0.63: an AVX512-BF16 Xeon, measured
        monkeypatch.setattr(runtime, "cpu_bf16_speedup", lambda speedup=speedup: speedup)
        assert runtime.resolve_precision("auto", cpu) == precision
    monkeypatch.setattr(runtime, "_amx_usable", lambda: True)
    assert runtime.resolve_precision("auto", cpu) == "bf16"  # AMX tiles: not measured


def test_the_bf16_speedup_is_measured_once_per_thread_count_and_zero_without_instructions(monkeypatch):
    monkeypatch.setattr(runtime, "_BF16_SPEEDUP", {})
    monkeypatch.setattr(runtime, "_amx_usable", lambda: False)
    monkeypatch.setattr(runtime, "cpu_has_fast_bf16", lambda: False)
    assert runtime.cpu_bf16_speedup() == 0.0 and not runtime.cpu_bf16_is_faster()
    monkeypatch.setattr(runtime, "_BF16_SPEEDUP", {})
    monkeypatch.setattr(runtime, "cpu_has_fast_bf16", lambda: True)  # measured even where bf16 is emulated
    measured = runtime.cpu_bf16_speedup(size=(64, 32, 64), repeats=2)
    assert 0.0 < measured < 100.0 and runtime._BF16_SPEEDUP == {torch.get_num_threads(): measured}
    assert runtime.cpu_bf16_speedup(size=(64, 32, 64), repeats=2) == measured  # cached, not measured again


def test_precision_rules_by_purpose(monkeypatch):
    cpu = torch.device("cpu")
    for fast in (True, False):
        monkeypatch.setattr(runtime, "cpu_bf16_is_faster", lambda fast=fast: fast)
        assert runtime.resolve_precision("auto", cpu) == ("bf16" if fast else "fp32")  # the trainer, the sampler
        assert runtime.resolve_precision("auto", cpu, "reduced") == "bf16"  # a mixed-precision rung: never fp32
        assert runtime.resolve_precision("auto", cpu, "vae") == "fp32"  # the encoder's reference result
    meta = torch.device("meta")
    assert runtime.resolve_precision("auto", meta) == "fp32"
    assert runtime.resolve_precision("bfloat16", cpu) == "bf16" and runtime.resolve_precision("half", cpu) == "fp16"
    with pytest.raises(ValueError, match="precision must be"):
        runtime.resolve_precision("fp8", cpu)
    with pytest.raises(ValueError, match="purpose must be"):
        runtime.resolve_precision("auto", cpu, "training")


def test_precision_rules_on_gpus(monkeypatch):
    cuda = torch.device("cuda", 0)
    for has_bf16, half in ((True, "bf16"), (False, "fp16")):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda has_bf16=has_bf16: has_bf16)
        assert runtime.resolve_precision("auto", cuda) == half
        assert runtime.resolve_precision("auto", cuda, "reduced") == half
        assert runtime.resolve_precision("auto", cuda, "vae") == "fp16"
    with pytest.raises(ValueError, match="no bf16 support"):
        runtime.resolve_precision("bf16", cuda)


def test_autocast_computes_matmuls_in_the_precision():
    a = torch.randn(4, 4)
    with runtime.autocast("cpu", "bf16"):
        assert (a @ a).dtype == torch.bfloat16
    with runtime.autocast("cpu", "fp32"):
        assert (a @ a).dtype == torch.float32
    with runtime.autocast("meta", "bf16"):  # nothing to autocast on the meta device
        assert (a.to("meta") @ a.to("meta")).dtype == torch.float32


def test_devices():
    assert runtime.resolve_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        assert runtime.resolve_device("auto").type in ("cpu", "mps")
        with pytest.raises(ValueError, match="no CUDA GPU"):
            runtime.resolve_device("cuda")
    else:
        assert runtime.resolve_device("auto", local_rank=0) == torch.device("cuda", 0)
        assert runtime.resolve_device("cuda", local_rank=0).index == 0


def test_set_threads_respects_argument_and_env(monkeypatch):
    before = torch.get_num_threads()
    try:
        assert runtime.set_threads(1) == 1
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        assert runtime.set_threads() == 2
        monkeypatch.delenv("OMP_NUM_THREADS")
        assert runtime.set_threads() == runtime.usable_cores() >= 1
        monkeypatch.setenv("OMP_NUM_THREADS", "two")
        with pytest.raises(ValueError, match="not an integer"):
            runtime.set_threads()
        with pytest.raises(ValueError, match="n >= 1"):
            runtime.set_threads(0)
    finally:
        torch.set_num_threads(before)
