"""Sampling throughput and the optimizer and EMA timings behind the low-memory options.

:func:`measure_sampling` times :func:`dit_core.sample.generate`, the sampler ``dit-sample`` runs, and the
VAE decoder after it; :func:`measure_optimizers` times the optimizer step and the EMA update
(:func:`dit_core.train.ema.update_ema`, on the device and on the CPU), the speed costs of the low-memory
options of the planner.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from ...runtime import autocast, resolve_device, resolve_precision, synchronize
from ...vae import decode_latents, load_vae_or_random
from .. import memory
from .rungs import BenchSpec, model_shape, resolve_spec


def build_vae(name: str | None, device: torch.device):
    """``(vae, description)``: the named VAE if it loads offline, else a random-init AutoencoderKL of SD's
    architecture (same cost: a VAE's speed does not depend on its weights)."""
    vae, description, pretrained = load_vae_or_random(name, device)
    if pretrained:
        return vae, description
    if name:
        print(f"dit-bench: timing a {description}", file=sys.stderr)
    return vae, description.split(": ", 1)[0]  # the rows say which VAE ran; the reason went to stderr


def timed(fn, device: torch.device, repeats: int = 3, clock=time.perf_counter) -> float:
    """Seconds per call of ``fn()``: one untimed call, then the median of ``repeats`` timed ones, each waiting
    for the device to finish."""
    fn()
    synchronize(device)
    times = []
    for _ in range(repeats):
        start = clock()
        fn()
        synchronize(device)
        times.append(clock() - start)
    return statistics.median(times)


def _random_model(spec: BenchSpec, device: torch.device):
    from ...models import DiT

    torch.manual_seed(spec.seed)
    with torch.device(device):
        return DiT(**model_shape(spec).model_kwargs())


def measure_sampling(spec: BenchSpec, vae=None, vae_source: str | None = None) -> dict:
    """Images/s of guided sampling: ``sample_steps`` DDIM (or DDPM) steps with classifier-free guidance
    (each step runs the model on the conditional and the null-class halves), bf16/fp16 autocast and fused
    attention where available, then the VAE decoder for latent models. The spec's ``sample_*`` fields choose how
    the model runs (:func:`sampling_model`: compiled, CUDA graphs, a pinned attention kernel, int8 on the CPU)."""
    from ...diffusion import create_diffusion
    from ...models import DiT
    from ...sample import generate
    from ..flops import forward_macs

    spec = resolve_spec(spec)
    device = resolve_device(spec.device)
    if spec.threads:
        torch.set_num_threads(spec.threads)
    if spec.sampler not in ("ddim", "ddpm"):
        raise ValueError(f"sampler must be ddim or ddpm, got {spec.sampler!r}")
    shape = model_shape(spec)
    precision = "fp32" if spec.sample_int8 else resolve_precision(spec.precision, device, "reduced")
    model = sampling_model(spec, _random_model(spec, device).eval())
    diffusion = create_diffusion("", learn_sigma=shape.learn_sigma)
    guided = shape.num_classes > 0 and spec.cfg_scale != 1.0
    labels = torch.randint(0, max(shape.num_classes, 1), (spec.sample_batch,))
    kwargs = dict(cfg_scale=spec.cfg_scale if guided else 1.0, seed=spec.seed, device=device, amp=precision,
                  clip_denoised=False, batch_size=spec.sample_batch)
    start = time.perf_counter()
    generate(model, diffusion, labels, sampler="ddim", steps=2, **kwargs)  # warm-up (and compilation)
    synchronize(device)
    warmup_s = time.perf_counter() - start
    start = time.perf_counter()
    samples = generate(model, diffusion, labels, sampler=spec.sampler, steps=spec.sample_steps, **kwargs)
    synchronize(device)
    loop_s = time.perf_counter() - start
    decode_s = 0.0
    if not spec.pixel and spec.sample_decode:
        if vae is None:
            vae, vae_source = build_vae(spec.vae, device)
        with autocast(device, precision):
            decode_latents(vae, samples[:1])  # warm-up
            synchronize(device)
            start = time.perf_counter()
            decode_latents(vae, samples)
            synchronize(device)
        decode_s = time.perf_counter() - start
    with torch.device("meta"):
        macs = forward_macs(DiT(**shape.model_kwargs()))
    n, evals = spec.sample_batch, spec.sample_steps * (2 if guided else 1)
    return dict(sampler=spec.sampler, steps=spec.sample_steps, cfg_scale=spec.cfg_scale if guided else None,
                batch=n, precision=precision, loop_s=loop_s, decode_s=decode_s,
                images_per_s=n / (loop_s + decode_s), s_per_image=(loop_s + decode_s) / n,
                model_tflop_per_image=2 * macs * evals / 1e12, vae=vae_source if decode_s else None,
                compile=spec.sample_compile, compile_mode=spec.sample_compile_mode,
                attn_kernel=spec.sample_attn_kernel, int8=spec.sample_int8, warmup_s=warmup_s)


def sampling_model(spec: BenchSpec, model: torch.nn.Module) -> torch.nn.Module:
    """The sampling model as ``spec`` asks: int8 linears (CPU), a pinned SDPA kernel, compiled (in that order)."""
    from ...attention import set_sdpa_kernel
    from ...runtime import compile_dit
    from ...sample.int8 import int8_copy

    if spec.sample_int8:
        model = int8_copy(model)
    if spec.sample_attn_kernel:
        set_sdpa_kernel(model, spec.sample_attn_kernel)
    if spec.sample_compile:
        compile_dit(model, spec.sample_compile, spec.sample_compile_mode)
    return model


def measure_optimizers(spec: BenchSpec, repeats: int = 3, ema_every: int = 4) -> list[dict]:
    """Time the optimizer step and the EMA update for this model: AdamW (fused, multi-tensor, per-parameter),
    bitsandbytes' 8-bit AdamW when installed, the EMA on the device and, on a GPU, the EMA kept on the CPU:
    with a blocking copy of the weights, and with the trainer's pinned staging buffers
    (:class:`dit_core.train.ema.HostStaging`), per update and per optimizer step with ``ema_every`` (the
    update every N steps). These are the speed costs of the low-memory options. On a CPU the staging row runs
    the same code path through plain buffers (no PCIe there: it shows that the path works, not its GPU cost)."""
    from ...train.ema import HostStaging, create_ema, update_ema

    spec = resolve_spec(spec)
    device = resolve_device(spec.device)
    model = _random_model(spec, device)
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    rows = []
    variants = [("AdamW fused", dict(fused=True)), ("AdamW multi-tensor", dict(foreach=True)),
                ("AdamW per-parameter", dict(foreach=False))]
    for label, kw in variants:
        try:
            opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0, **kw)
            s = timed(opt.step, device, repeats)
            rows.append(dict(what=label, ms=s * 1e3, state_bytes=memory.tensor_bytes(memory.optimizer_tensors(opt))))
            del opt
        except Exception as err:  # noqa: BLE001
            rows.append(dict(what=label, status=f"unavailable: {type(err).__name__}: {str(err)[:100]}"))
    label = "AdamW 8-bit (bitsandbytes)"
    try:
        from ...train.optimizer import import_bitsandbytes

        bnb = import_bitsandbytes()
        opt = bnb.optim.AdamW8bit(params, lr=1e-4, weight_decay=0.0)  # DiT's decay (bitsandbytes' default: 0.01)
        s = timed(opt.step, device, repeats)
        rows.append(dict(what=label, ms=s * 1e3, state_bytes=memory.tensor_bytes(memory.optimizer_tensors(opt))))
        del opt
    except ValueError as err:  # ConfigError: not installed, or does not load
        rows.append(dict(what=label, status=f"unavailable: {str(err).split(':', 1)[-1].strip()[:120]}"))
    except Exception as err:  # noqa: BLE001
        rows.append(dict(what=label, status=f"failed: {type(err).__name__}: {str(err)[:100]}"))
    ema = create_ema(model)
    seconds = timed(lambda: update_ema(ema, model, 0.9999), device, repeats)
    rows.append(dict(what=f"EMA update on {device.type}", ms=seconds * 1e3))
    ema_cpu = create_ema(model, device="cpu")
    staging = HostStaging(list(model.parameters()))
    decay = torch.tensor(0.9999, dtype=torch.float64, device=device)
    if device.type == "cuda":
        seconds = timed(lambda: update_ema(ema_cpu, model, 0.9999), device, repeats)
        rows.append(dict(what="EMA on the CPU, blocking copy + lerp", ms=seconds * 1e3))
    seconds = timed(lambda: update_ema(ema_cpu, model, decay, staging), device, repeats)
    what = "EMA on the CPU, pinned staging + lerp" if staging.pinned else "EMA via staging buffers (CPU: code path)"
    rows.append(dict(what=what, ms=seconds * 1e3, pinned=staging.pinned))
    rows.append(dict(what=f"  the same with ema_every {ema_every}, per step", ms=seconds * 1e3 / ema_every,
                     derived=f"the update / {ema_every}"))
    return rows
