"""The CUDA paths: the same checks as on the CPU, run on a GPU. Skipped where torch sees no CUDA device.

Run on a GPU machine with ``pytest -q tests/test_cuda.py`` (about a minute on one H100-class card). What is
compared: the model on the GPU against the float64 reference forward pass; the fused attention kernels
(flash, memory-efficient) against plain attention in bf16; checkpointed blocks; the trainer (bf16, fused AdamW,
TF32) learning and resuming on the GPU after SIGKILL; sampling seeds that do not depend on the batch; and the
memory planner against ``torch.cuda.max_memory_allocated``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from dit_core import DiT
from dit_core.diffusion import create_diffusion
from dit_core.measure.memory import ModelShape, activation_bytes, measure_saved_per_sample
from dit_core.sample import generate

from reference_dit import reference_forward
from test_models import inputs, randomize, tiny
from test_train import REPO, TINY_ARGS, child_env, final_state, kill_after_first_checkpoint

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def _no_tf32():
    """Exact comparisons need IEEE fp32 matmuls; the trainer turns TF32 on for itself."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def test_forward_on_the_gpu_matches_the_float64_reference():
    model = randomize(tiny(hidden_size=128, depth=4, num_heads=4)).eval()
    x, t, y = inputs(n=8)
    sd = {k: v.double() for k, v in model.state_dict().items()}
    ref = reference_forward(sd, x.double(), t, y, num_heads=4, patch=2)
    with torch.no_grad():
        out32 = model.to(CUDA)(x.to(CUDA), t.to(CUDA), y.to(CUDA)).cpu()
        out64 = model.double()(x.double().to(CUDA), t.to(CUDA), y.to(CUDA)).cpu()
    # The timestep features are fp32 in float64 models too (as in the published model), and the GPU's fp32
    # sin/cos differ from the CPU's in the last bits: ~4e-7 on an H200, against 1e-10 on the CPU.
    torch.testing.assert_close(out64, ref, rtol=1e-5, atol=2e-6)
    torch.testing.assert_close(out32.double(), ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kernel", ["flash", "efficient"])
def test_fused_attention_kernels_match_plain_attention_in_bf16(kernel):
    """The sdpa backend with one fused kernel forced, against the math backend in fp32: bf16-sized error."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = randomize(tiny(hidden_size=128, depth=3, num_heads=2)).to(CUDA).eval()  # head dim 64: flash-eligible
    x, t, y = (a.to(CUDA) for a in inputs(n=16))
    model.set_attention_backend("math")
    with torch.no_grad():
        ref = model(x, t, y).float()
    model.set_attention_backend("sdpa")
    backend = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}[kernel]
    x.requires_grad_(True)
    with sdpa_kernel([backend]), torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(x, t, y)
    out.float().square().mean().backward()  # the backward kernel runs too
    err = ((out.float() - ref).norm() / ref.norm()).item()
    assert err < 2e-2, f"{kernel} attention in bf16: relative error {err:.2e}"
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0


def test_checkpointed_blocks_give_the_same_gradients_on_the_gpu():
    model = randomize(tiny()).to(CUDA).eval()
    x, t, y = (a.to(CUDA) for a in inputs())

    def grads():
        model.zero_grad()
        model(x, t, y).square().mean().backward()
        return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}

    ref = grads()
    model.set_grad_checkpointing(True)
    got = grads()
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-5, atol=1e-7)


def test_sampling_seeds_do_not_depend_on_the_batch_on_the_gpu():
    torch.manual_seed(0)
    model = DiT(input_size=8, patch_size=2, in_channels=1, hidden_size=64, depth=2, num_heads=2, num_classes=10)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05)
    model = model.to(CUDA).eval()
    diffusion = create_diffusion("")
    labels = [0, 3, 3, 7, 9]
    kw = dict(sampler="ddim", steps=20, cfg_scale=2.0, seed=5, device=CUDA)
    whole = generate(model, diffusion, labels, batch_size=5, **kw)
    pieces = generate(model, diffusion, labels, batch_size=2, **kw)
    torch.testing.assert_close(whole, pieces, rtol=0, atol=1e-4)
    bf16 = generate(model, diffusion, labels, batch_size=5, amp="bf16", **kw)
    assert (bf16 - whole).abs().mean() < 0.05 and whole.std() > 0.1


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_planner_activation_bytes_against_the_cuda_allocator(precision):
    """Per-sample bytes a forward pass leaves allocated (the slope between two batch sizes, so weights and
    autocast's weight copies cancel) and the bytes autograd saves (hooks), against the planner's count."""
    model = DiT(input_size=32, patch_size=2, in_channels=4, hidden_size=384, depth=6, num_heads=6).to(CUDA)
    shape = ModelShape.from_model(model)
    ctx = lambda: torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16")

    def held(batch):
        g = torch.Generator(device="cpu").manual_seed(batch)
        x = torch.randn(batch, 4, 32, 32, generator=g).to(CUDA)
        t, y = torch.randint(0, 1000, (2, batch), generator=g).to(CUDA)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        with ctx():
            out = model(x, t, y)
        return torch.cuda.memory_allocated() - before - out.numel() * out.element_size()

    allocator = (held(16) - held(8)) / 8
    predicted = activation_bytes(shape, precision=precision, attn="sdpa", loss="none").per_sample
    hooks = measure_saved_per_sample(model, precision=precision, loss="none", batch_sizes=(8, 16))["per_sample"]
    for what, measured in (("allocator", allocator), ("saved-tensor hooks", hooks)):
        err = measured / predicted - 1
        print(f"planner vs {what}, {precision}: {predicted / 2**20:.3f} vs {measured / 2**20:.3f} MiB/sample "
              f"({err:+.2%})")
        assert abs(err) < 0.10, f"{what}, {precision}: planner {predicted} vs {measured} bytes ({err:+.1%})"


def test_trainer_on_the_gpu_learns_and_resumes_after_sigkill(tmp_path):
    """bf16 + fused AdamW + TF32 on the GPU; a run killed mid-way and resumed ends where an unbroken one does."""
    from dit_core.data.digits import export_digits

    data = export_digits(tmp_path / "digits")
    common = [sys.executable, "-m", "dit_core.train", "--data-path", str(data), *TINY_ARGS, "--hidden-size", "64",
              "--batch-size", "64", "--max-steps", "300", "--ckpt-every", "50", "--mixed-precision", "bf16",
              "--log-every", "25", "--device", "cuda", "--fused-adam", "true"]
    run = lambda out, *extra: subprocess.Popen([*common, "--out", str(tmp_path / out), *extra], env=child_env(),
                                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    reference = run("ref")
    out_ref, _ = reference.communicate(timeout=300)
    assert reference.returncode == 0, out_ref
    at_kill = kill_after_first_checkpoint(run("killed"), tmp_path / "killed" / "checkpoints" / "last.pt")
    resumed = run("killed", "--resume", "true")
    out_res, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out_res
    losses = [json.loads(line)["loss"] for line in (tmp_path / "ref" / "metrics.jsonl").open()]
    assert losses[-1] < 0.8 * losses[0], f"loss did not fall on the GPU: {losses}"
    ref, res = final_state(tmp_path / "ref"), final_state(tmp_path / "killed")
    assert res["step"] == ref["step"] == 300 and res["data"] == ref["data"]
    worst = max((res["model"][k].float() - v.float()).abs().max().item() for k, v in ref["model"].items())
    print(f"killed at step {at_kill}, resumed: largest weight difference to the unbroken run {worst:.2e}")
    # cuBLAS/cuDNN may pick other kernels in a new process, so allow float rounding, not a different run
    assert worst < 1e-3


# ----------------------------------------------------------------------------------------------------------
# No host-device synchronisation on the hot path; the EMA on the CPU
# ----------------------------------------------------------------------------------------------------------


def _cuda_step(ema_device=None, ema_every=1, seed=0):
    """A tiny DiT's training step on the GPU as the trainer builds it: bf16, fused AdamW, the NaN guard."""
    from dit_core.train.ema import create_ema
    from dit_core.train.step import StepOptions, TrainStep

    torch.manual_seed(seed)
    model = randomize(tiny(hidden_size=128, depth=2, num_heads=2)).to(CUDA).eval()
    ema = create_ema(model, device=ema_device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0, fused=True)
    options = StepOptions(precision="bf16", grad_clip=1.0, ema_decay=0.9, ema_every=ema_every)
    step = TrainStep(model, create_diffusion(""), opt, ema, options, batch_size=8, seed=seed)
    g = torch.Generator().manual_seed(seed)
    n, c, s = 8, model.in_channels, model.input_size
    batches = [((torch.rand(n, c, s, s, generator=g) * 2 - 1).pin_memory(), torch.randint(0, model.num_classes, (n,),
               generator=g).pin_memory()) for _ in range(4)]
    return step, batches


def test_a_training_step_makes_no_host_device_synchronisation():
    """Under torch.cuda.set_sync_debug_mode("error") any operation that makes the CPU wait for the GPU raises:
    the trainer's step (draws, forward, hybrid loss, backward, clipping, the guard's verdict, fused AdamW with
    found_inf, the masked EMA update) must run without one. The guard is then read, which does synchronise."""
    step, batches = _cuda_step()
    step(0, iter(batches[:1]))  # first use: cuBLAS handles, the schedule tables on the GPU, AdamW's state
    torch.cuda.synchronize()
    bad = (torch.full_like(batches[1][0], float("nan")), batches[1][1])
    torch.cuda.set_sync_debug_mode("error")
    try:
        for i, batch in enumerate([batches[1], bad, batches[2]], start=1):
            step(i, iter([batch]))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    messages = step.guard.read()  # the one synchronisation, when the loop logs
    assert step.guard.skipped == 1 and messages and messages[0].startswith("step 3: skipped (loss is nan")
    assert step.ema_updates == 3


def test_a_sampling_step_makes_no_host_device_synchronisation():
    """One DDIM and one DDPM step of a respaced diffusion with the model on the GPU, after a first call has put
    the schedule and the step map on the device."""
    model = randomize(tiny(hidden_size=128, depth=2, num_heads=2)).to(CUDA).eval()
    diffusion = create_diffusion("25")
    x = torch.randn(4, model.in_channels, model.input_size, model.input_size, device=CUDA)
    t = torch.full((4,), 10, dtype=torch.long, device=CUDA)
    y = torch.arange(4, device=CUDA) % model.num_classes
    with torch.no_grad():
        diffusion.ddim_sample(model, x, t, model_kwargs=dict(y=y))
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            x1 = diffusion.ddim_sample(model, x, t, model_kwargs=dict(y=y))["sample"]
            x2 = diffusion.p_sample(model, x1, t - 1, model_kwargs=dict(y=y))["sample"]
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(x2).all()


@pytest.mark.parametrize("ema_every", [1, 3])
def test_an_ema_on_the_cpu_follows_the_one_on_the_gpu(ema_every):
    """The trainer's step with its EMA on the CPU (pinned staging copies, an event, then the lerp on the CPU),
    and beside it an EMA on the GPU that follows the same weights: after 12 steps, the same averaged weights
    within the fp32 arithmetic of two processors."""
    from dit_core.train.ema import EmaUpdater, create_ema

    step, batches = _cuda_step(ema_device="cpu", ema_every=ema_every)
    assert step.ema_update.staging is not None and step.ema_update.staging.pinned
    on_gpu = create_ema(step.model)
    gpu_updater = EmaUpdater(on_gpu, step.model, 0.9, every=ema_every)
    for i in range(12):
        step(i, iter([batches[i % 4]]))
        gpu_updater(i)
    assert next(step.ema.parameters()).device.type == "cpu" and step.ema_updates == 12 // ema_every
    for (name, cpu), gpu in zip(step.ema.state_dict().items(), on_gpu.state_dict().values()):
        torch.testing.assert_close(cpu, gpu.cpu(), rtol=1e-5, atol=1e-6, msg=name)
