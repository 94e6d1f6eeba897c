"""Sampling on a GPU with a model that lives on the CPU (the 12 GB profile's EMA): the model stays where it is,
unchanged, and the temporary GPU copy is freed. Skipped where torch sees no CUDA device (the CPU tests in
``test_sample_scale.py`` check the same logic with a stand-in device)."""

from __future__ import annotations

import pytest
import torch

from dit_core.diffusion import create_diffusion
from dit_core.sample import generate

from test_sample_scale import assert_untouched, snapshot, tiny_dit

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(autouse=True)
def _no_tf32():
    """GPU against CPU in fp32: TF32 off for the matmuls and for cuDNN's convolutions (the patch embedding), which
    would otherwise round their inputs to 10 bits of mantissa."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def test_a_cpu_model_sampled_on_the_gpu_stays_on_the_cpu_and_its_copy_is_freed():
    model = tiny_dit(in_channels=4)
    model.train()
    before, modes = snapshot(model), [m.training for m in model.modules()]
    kw = dict(sampler="ddim", steps=4, cfg_scale=2.0, seed=0, clip_denoised=False)
    # a first call allocates what stays for the process (cuBLAS and cuDNN workspaces, the schedule's tables):
    # the comparison starts after it
    generate(model, None, [1, 2, 3], device="cuda", **kw)
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated()
    gpu = generate(model, None, [1, 2, 3], device="cuda", **kw)
    assert_untouched(model, before, modes, device="cpu")
    assert torch.cuda.memory_allocated() == allocated  # the temporary copy (and everything else) is gone
    cpu = generate(model, None, [1, 2, 3], **kw)
    torch.testing.assert_close(gpu, cpu, rtol=0, atol=1e-3)
    # with bf16 autocast the copy is made in bf16; the model stays as it was all the same
    generate(model, None, [1], sampler="ddim", steps=2, seed=0, device="cuda", amp="bf16")
    assert_untouched(model, before, modes, device="cpu")


def test_trainer_grid_with_the_ema_on_the_cpu(tmp_path):
    from dit_core.train import make_config
    from dit_core.train.ema import create_ema
    from dit_core.train.loop import sample_grid

    cfg = make_config(None, dict(out=str(tmp_path), sample_steps=3, sample_per_class=2, sample_classes=[0, 1],
                                 mixed_precision="bf16", ema_device="cpu"))
    ema = create_ema(tiny_dit().cuda(), device="cpu")
    before, modes = snapshot(ema), [m.training for m in ema.modules()]
    for step in (1, 2):  # before the fix, the first grid moved the EMA to the GPU for good
        assert sample_grid(ema, create_diffusion(""), cfg, tmp_path, step, [str(i) for i in range(10)], False,
                           None, torch.device("cuda")).is_file()
        assert_untouched(ema, before, modes, device="cpu")
