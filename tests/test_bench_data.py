"""The helpers behind chapters 0 and 2 and benchmarks/data_bench.py: JPEG folders, the demo VAE, timing,
and the matmul precision comparison of dit_core.measure.env."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from dit_book import bench_data
from dit_core.data import ImageFolderDataset
from dit_core.measure.env import FORMAT_BITS, matmul_benchmark, matmul_modes
from dit_core.vae import SD_VAE_CONFIG, load_vae_or_random, random_vae


@pytest.mark.parametrize("source, classes, folders", [("noise", 3, ["class000", "class001", "class002"]),
                                                      ("photos", 5, ["china", "flower"])])
def test_make_jpegs_writes_an_imagefolder_of_imagenet_sized_jpegs(tmp_path, source, classes, folders):
    total = bench_data.make_jpegs(tmp_path / "a", 6, classes=classes, seed=1, source=source)
    files = sorted((tmp_path / "a").rglob("*.jpg"))
    assert len(files) == 6 and total == sum(f.stat().st_size for f in files)
    assert total == bench_data.folder_bytes(tmp_path / "a")
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == folders
    for f in files:
        with Image.open(f) as img:
            assert img.format == "JPEG" and img.mode == "RGB"
            assert 350 <= img.size[0] < 500 and 300 <= img.size[1] < 420
    ds = ImageFolderDataset(tmp_path / "a", 32, flip=False)
    assert ds.classes == folders and len(ds) == 6
    # the same seed writes the same files
    bench_data.make_jpegs(tmp_path / "b", 6, classes=classes, seed=1, source=source)
    assert [f.read_bytes() for f in files] == [f.read_bytes() for f in sorted((tmp_path / "b").rglob("*.jpg"))]


def test_make_jpegs_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="source must be one of noise, photos"):
        bench_data.make_jpegs(tmp_path, 2, source="imagenet")
    with pytest.raises(ValueError, match="at least 1 image"):
        bench_data.make_jpegs(tmp_path, 0)


def test_vae_falls_back_to_random_weights_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-cache"))
    vae, description, pretrained = load_vae_or_random("nobody/no-such-vae", fallback="tiny")
    assert not pretrained
    assert description.startswith("random-init AutoencoderKL ('tiny' architecture): nobody/no-such-vae could not")
    assert list(vae.config.block_out_channels) == [8, 8, 16, 16] and not vae.training
    # a folder written by save_pretrained loads through the same function, with its own weights
    vae.save_pretrained(tmp_path / "my-vae")
    loaded, description, pretrained = load_vae_or_random(tmp_path / "my-vae", fallback="sd")
    assert pretrained and "pretrained" in description
    assert all(torch.equal(p, q) for p, q in zip(vae.parameters(), loaded.parameters()))


def test_random_vae_architectures_and_encoder_cost():
    tiny = random_vae("tiny")
    macs = bench_data.encoder_macs(tiny, 64)
    assert macs > 0 and bench_data.encoder_macs(tiny, 128) == pytest.approx(4 * macs, rel=0.01)  # convs: ~pixels
    with pytest.raises(ValueError, match="'sd' or 'tiny'"):
        random_vae("xl")
    from diffusers import AutoencoderKL

    with torch.device("meta"):  # shapes only: SD's encoder at 256 px is about 136 G multiply-adds
        sd = AutoencoderKL(**SD_VAE_CONFIG)
    assert bench_data.encoder_macs(sd, 256) / 1e9 == pytest.approx(136.4, rel=0.01)


class Clock:
    """A stand-in for the time module whose clock advances one second at every reading."""

    def __init__(self):
        self.now = -1.0

    def perf_counter(self):
        self.now += 1.0
        return self.now


def test_rate_and_loader_rate_count_calls_and_samples(monkeypatch):
    monkeypatch.setattr(bench_data, "time", Clock())
    calls = []
    # one warm-up call, then 5 timed ones between a clock reading before, one for the time limit and one after
    assert bench_data.rate(calls.append, 5, min_seconds=0.0) == 5 / 2
    assert calls == [0, 0, 1, 2, 3, 4]
    calls.clear()  # fewer calls than min_seconds asks for: it keeps calling until the time is up
    assert bench_data.rate(calls.append, 1, min_seconds=3.0) == 3 / 4 and calls == [0, 0, 1, 2]
    data = torch.utils.data.TensorDataset(torch.zeros(10, 2), torch.zeros(10))
    # the clock starts after the first batch: 3 batches of 4 in the one timed second
    assert bench_data.loader_rate(data, batch_size=4, workers=0, batches=3) == 12
    with pytest.raises(ValueError):
        bench_data.rate(calls.append, 0)


def test_matmul_benchmark_orders_formats_by_mantissa_bits():
    assert matmul_modes("cpu") == ["fp32", "bf16", "fp16"]
    result = matmul_benchmark(128, device="cpu", repeats=1)
    assert list(result) == ["fp32", "bf16", "fp16"]
    err = {m: r["rel_error"] for m, r in result.items()}
    # relative rounding error ~ 2^-(mantissa bits + 1): fp32 23 bits, fp16 10, bf16 7
    assert err["fp32"] < 1e-6 < 1e-4 < err["fp16"] < 1e-3 < err["bf16"] < 1e-2
    assert all(r["tflops"] == pytest.approx(2 * 128**3 / (r["ms"] / 1e3) / 1e12) for r in result.values())
    assert FORMAT_BITS["tf32"][2] == FORMAT_BITS["fp16"][2] and FORMAT_BITS["tf32"][1] == FORMAT_BITS["fp32"][1]
    with pytest.raises(ValueError, match="TF32 needs a CUDA GPU"):
        matmul_benchmark(8, modes=["tf32"], device="cpu")
    with pytest.raises(ValueError, match="unknown matmul mode"):
        matmul_benchmark(8, modes=["fp8"], device="cpu")
