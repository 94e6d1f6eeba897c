"""Speed and memory of DiT training, measured: the fast-DiT ladder, sampling throughput, MFU.

Each *rung* of the ladder is one training step of the same workload (model, image size, batch) run with
one trick switched on (or all of them), so every speed-up is a ratio measured in one run, on this machine:

===============  =============================================================================================
rung (key)       what changes
===============  =============================================================================================
``baseline``     fp32, explicit ("math") attention, eager PyTorch; latent models encode with the VAE every step
``ckpt``         + gradient checkpointing: each block recomputes its forward in backward (less memory, ~1/3
                 more compute)
``amp``          + mixed precision: bf16 autocast (fp16 + gradient scaler on GPUs without bf16); fp32 weights
``latents``      + pre-extracted VAE latents: the encoder leaves the loop (latent models only)
``sdpa``         + fused attention: ``scaled_dot_product_attention`` (FlashAttention / memory-efficient)
``tf32``         + TF32 tensor cores for fp32 matrix products (GPU only; the official code turns it on)
``compile``      + ``torch.compile`` of each block (regional compilation: all blocks share one compile)
``all``          every trick above, checkpointing included (the fast-DiT recipe and more)
``all-no-ckpt``  every trick but checkpointing: the fastest, when the memory allows it
``official``     the paper's step written plainly, as the official ``train.py`` does: :class:`OfficialStep`
===============  =============================================================================================

Timing: a short warm-up (compilation happens there), then the median of several steps. Memory: on a GPU,
``torch.cuda.max_memory_allocated`` over the timed steps; on the CPU, the peak resident set size of a fresh
process per rung (``VmHWM``) and, for eager rungs, the peak of tensor bytes alive
(:class:`dit_core.memory.TensorMemoryTracker`), which is what the planner predicts. Model FLOPs utilisation
(MFU) on GPUs: model FLOPs per image (3 forward passes, 2 FLOPs per multiply-add, recomputation not
counted: 712 GFLOP for DiT-XL/2 at 256 px) x images/s / the device's dense bf16 peak.

A VAE's speed does not depend on its weights: when the real ``stabilityai/sd-vae-ft-ema`` cannot be loaded
(offline), a randomly initialised ``AutoencoderKL`` of the same architecture (:data:`dit_core.vae.SD_VAE_CONFIG`)
is timed instead, and the result says which one ran.

``dit-bench`` is the command line (:mod:`dit_core.cli.bench`); ``benchmarks/gpu_ladder.sh`` runs the
DiT-XL/2 ladder on a GPU.
"""

from __future__ import annotations

import copy
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from . import memory
from .atomic import atomic_write_text
from .memory import ModelShape
from .runtime import autocast, resolve_device, resolve_precision, set_tf32
from .vae import decode_latents, load_vae_or_random, sample_latents

#: Dense bf16 tensor-core peaks in TFLOP/s (vendor figures; see shared/reference/FACTS.md), matched against
#: ``torch.cuda.get_device_name()`` in this order.
DEVICE_PEAK_TFLOPS = (("H200", 989.0), ("H100", 989.0), ("A100", 312.0), ("4090", 165.0), ("3090", 71.0))

RESULT_MARK = "DIT-BENCH-RESULT "


def device_peak_tflops(name: str) -> float | None:
    """The dense bf16 peak of a GPU by (part of) its name, or None when it is not in the table."""
    for key, peak in DEVICE_PEAK_TFLOPS:
        if key.lower() in name.lower():
            return peak
    return None


# ----------------------------------------------------------------------------------------------------------
# What is measured
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rung:
    """One configuration of the ladder: which tricks are on."""

    key: str
    label: str
    checkpointing: bool | int = False  # True: every block; an int k: the first k blocks
    amp: bool = False
    latents: bool = False  # pre-extracted latents instead of the VAE in the loop
    fused_attention: bool = False
    tf32: bool = False
    compile: bool = False
    official: bool = False


RUNGS = {
    r.key: r
    for r in (
        Rung("baseline", "baseline (fp32, math attn, VAE if latent)"),
        Rung("ckpt", "+ gradient checkpointing", checkpointing=True),
        Rung("amp", "+ mixed precision", amp=True),
        Rung("latents", "+ pre-extracted latents", latents=True),
        Rung("sdpa", "+ fused attention (sdpa)", fused_attention=True),
        Rung("tf32", "+ TF32 matmuls", tf32=True),
        Rung("compile", "+ torch.compile", compile=True),
        Rung("all", "all together", checkpointing=True, amp=True, latents=True, fused_attention=True, tf32=True,
             compile=True),
        Rung("all-no-ckpt", "all but checkpointing", amp=True, latents=True, fused_attention=True, tf32=True,
             compile=True),
        Rung("all-eager", "all together, without compile", checkpointing=True, amp=True, latents=True,
             fused_attention=True, tf32=True),
        Rung("all-no-ckpt-eager", "all but checkpointing and compile", amp=True, latents=True, fused_attention=True,
             tf32=True),
        Rung("official", "official-style plain step", official=True),
    )
}


def default_rungs(device_type: str, pixel: bool, official: bool = True, compile: bool = True) -> list[str]:
    """The ladder for a device: TF32 only on GPUs, the latents rung only for latent models."""
    keys = ["baseline", "ckpt", "amp", "latents", "sdpa", "tf32", "compile", "all", "all-no-ckpt"]
    if pixel:
        keys.remove("latents")
    if device_type != "cuda":
        keys.remove("tf32")
    if not compile:
        keys = [k for k in keys if k != "compile"]
        keys = [k + "-eager" if k.startswith("all") else k for k in keys]
    return (["official"] if official else []) + keys


@dataclass
class BenchSpec:
    """The workload: a model, an input size, a batch, and how to time it. Plain data (JSON in, JSON out)."""

    model: str = "DiT-S/2"  # a named configuration, or a profile ("digits")
    shape: dict = field(default_factory=dict)  # ModelShape fields (filled by resolve_spec)
    pixel: bool = False  # pixel-space model (no VAE) instead of a latent model
    image_size: int = 256
    batch_size: int = 4  # the micro-batch
    grad_accum: int = 1  # micro-batches per optimizer step (images per step = batch_size x grad_accum)
    steps: int = 3
    warmup: int = 1
    device: str = "auto"
    precision: str = "auto"  # the autocast dtype of the amp rungs: auto, bf16, fp16
    vae: str | None = None  # a VAE to load (hub id or folder); None: random init of SD_VAE_CONFIG
    threads: int | None = None
    seed: int = 0
    track_tensors: bool = True  # CPU: also measure the peak of live tensor bytes (eager rungs)
    sample_steps: int = 10
    sampler: str = "ddim"
    cfg_scale: float = 4.0
    sample_batch: int = 2
    sample_decode: bool = True
    memory_limit_gib: float | None = None  # CUDA: cap the allocator at this much, as on a smaller card


def profile_shape(name: str) -> tuple[dict, int, bool]:
    """Model fields, image size and pixel-space flag of a training profile (``dit_core/configs/<name>.yaml``)."""
    import yaml

    from .models import model_kwargs

    path = Path(__file__).resolve().parent / "configs" / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"unknown model or profile {name!r}: use a DiT name (DiT-S/2 ... DiT-XL/2) or a profile "
                         f"in {path.parent}")
    cfg = yaml.safe_load(path.read_text()) or {}
    kwargs = model_kwargs(cfg.get("model", "DiT-S/2"))
    for key in ("depth", "hidden_size", "num_heads", "patch_size", "learn_sigma", "class_dropout_prob"):
        if cfg.get(key) is not None:
            kwargs[key] = cfg[key]
    pixel = not cfg.get("latents_path") and cfg.get("data_path") == "digits"
    image = int(cfg.get("image_size", 256))
    if pixel:
        kwargs.update(input_size=image, in_channels=int(cfg.get("channels", 3)), num_classes=10)
    else:
        kwargs.update(input_size=image // 8, in_channels=4, num_classes=1000)
    return kwargs, image, pixel


def resolve_spec(spec: BenchSpec) -> BenchSpec:
    """Fill ``spec.shape`` (and pixel/image size for a profile) from ``spec.model``.

    A spec may also bring its own ``shape`` (``ModelShape`` fields, e.g. a tiny model for tests); its input
    side must then agree with ``image_size`` (equal in pixel space, ``image_size / 8`` for latents).
    """
    if spec.shape:
        side = spec.shape.get("input_size")
        want = spec.image_size if spec.pixel else spec.image_size // 8
        if side != want:
            raise ValueError(f"shape input_size {side} does not match image_size {spec.image_size} "
                             f"({'pixel space: equal' if spec.pixel else 'latents: image_size / 8'})")
        return spec
    if spec.model.startswith("DiT-"):
        shape = ModelShape.from_name(spec.model, spec.image_size)
        kwargs = shape.model_kwargs()
        if spec.pixel:
            raise ValueError("named DiT models are latent models; use a profile (e.g. digits) for pixel space")
        return replace(spec, shape=kwargs)
    kwargs, image, pixel = profile_shape(spec.model)
    return replace(spec, shape=kwargs, image_size=image, pixel=pixel)


def model_shape(spec: BenchSpec) -> ModelShape:
    return ModelShape(name=spec.model, **resolve_spec(spec).shape)


def train_gflop_per_image(shape: ModelShape) -> float:
    """Model FLOPs of one training image: 3 forward passes (forward + 2x for backward), 2 FLOPs per MAC."""
    from .flops import forward_macs
    from .models import DiT

    with torch.device("meta"):
        model = DiT(**shape.model_kwargs())
    return 6 * forward_macs(model) / 1e9


def build_vae(name: str | None, device: torch.device):
    """``(vae, description)``: the named VAE if it loads offline, else a random-init AutoencoderKL of SD's
    architecture (same cost: a VAE's speed does not depend on its weights)."""
    vae, description, pretrained = load_vae_or_random(name, device)
    if name and not pretrained:
        print(f"dit-bench: timing a {description}", file=sys.stderr)
    return vae, description


# ----------------------------------------------------------------------------------------------------------
# Training steps
# ----------------------------------------------------------------------------------------------------------


def _make_data(spec: BenchSpec, shape: ModelShape, device: torch.device, vae_in_loop: bool):
    """A fixed batch (data loading is not what is measured): images for the VAE, latent moments, or pixels."""
    g = torch.Generator().manual_seed(spec.seed)
    n = spec.batch_size
    labels = torch.randint(0, max(shape.num_classes, 1), (n,), generator=g).to(device)
    if vae_in_loop:
        images = torch.rand(n, 3, spec.image_size, spec.image_size, generator=g) * 2 - 1
        return {"images": images.to(device), "y": labels}
    size = (n, shape.in_channels, shape.input_size, shape.input_size)
    if spec.pixel:
        return {"pixels": (torch.rand(size, generator=g) * 2 - 1).to(device), "y": labels}
    # pre-extracted latents are stored as posterior moments; each step draws mean + std * noise
    return {"mean": torch.randn(size, generator=g).to(device), "std": (0.1 * torch.rand(size, generator=g)).to(device),
            "y": labels}


def _fused_adamw(params, device: torch.device):
    try:
        return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0, fused=True)
    except (RuntimeError, TypeError):  # no fused kernel for this device/dtype: the multi-tensor one
        return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0, foreach=device.type == "cuda")


class TrainStep:
    """One training step as a one-GPU trainer runs it, each trick switchable (a :class:`Rung`).

    ``zero_grad(set_to_none=True)`` first (the previous step's gradients are gone before the forward);
    the batch's ``x_0`` from the VAE, stored latents or pixels; the DiT hybrid loss from
    :func:`dit_core.create_diffusion`; backward (through a gradient scaler for fp16); fused AdamW
    (lr 1e-4, no weight decay); the EMA update (decay 0.9999).
    """

    def __init__(self, spec: BenchSpec, rung: Rung, device: torch.device, vae=None):
        from .diffusion import create_diffusion
        from .models import DiT

        self.shape = model_shape(spec)
        self.device, self.rung, self.spec = device, rung, spec
        self.precision = resolve_precision(spec.precision, device, "reduced") if rung.amp else "fp32"
        torch.manual_seed(spec.seed)
        with torch.device(device):
            self.model = DiT(**self.shape.model_kwargs(), attn_backend="sdpa" if rung.fused_attention else "math")
        self.model.set_grad_checkpointing(rung.checkpointing).train()
        self.checkpointed = len(self.model.checkpointed_blocks)
        self.ema = copy.deepcopy(self.model).requires_grad_(False)
        if rung.compile:
            for block in self.model.blocks:  # regional compilation: every block shares one compiled graph
                block.compile()
        self.opt = _fused_adamw([p for p in self.model.parameters() if p.requires_grad], device)
        self.scaler = torch.amp.GradScaler(device.type) if self.precision == "fp16" else None
        self.diffusion = create_diffusion("")
        self.vae = None if (rung.latents or spec.pixel) else vae
        self.data = _make_data(spec, self.shape, device, self.vae is not None)

    def autocast(self):
        return autocast(self.device, self.precision)

    def forward(self, x, t, y=None):
        with self.autocast():
            return self.model(x, t, y).float()

    def x0(self) -> torch.Tensor:
        d = self.data
        if self.vae is not None:
            return sample_latents(self.vae, d["images"], self.precision)
        if "pixels" in d:
            return d["pixels"]
        return d["mean"] + d["std"] * torch.randn_like(d["std"])

    def __call__(self) -> torch.Tensor:
        self.opt.zero_grad(set_to_none=True)
        accum = self.spec.grad_accum
        y = self.data["y"] if self.shape.num_classes else None
        for _ in range(accum):  # gradient accumulation: the same update as one batch accum times larger
            x0 = self.x0()
            t = torch.randint(0, self.diffusion.num_timesteps, (x0.shape[0],), device=self.device)
            loss = self.diffusion.training_losses(self.forward, x0, t, dict(y=y))["loss"].mean()
            if self.scaler is not None:
                self.scaler.scale(loss / accum).backward()
            else:
                (loss / accum).backward()
        if self.scaler is not None:
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            self.opt.step()
        with torch.no_grad():
            for e, p in zip(self.ema.parameters(), self.model.parameters()):
                e.lerp_(p, 1 - 0.9999)
        return loss.detach()

    def static_tensors(self) -> list:
        """Tensors that live across steps: weights, EMA, optimizer state, the VAE, the batch."""
        out = list(self.model.parameters()) + list(self.ema.parameters()) + memory.optimizer_tensors(self.opt)
        out += [p.grad for p in self.model.parameters() if p.grad is not None]
        if self.vae is not None:
            out += list(self.vae.parameters())
        return out + list(self.data.values())

    def setup(self) -> memory.TrainSetup:
        """The planner's description of this step."""
        return memory.TrainSetup(
            micro_batch=self.spec.batch_size, grad_accum=self.spec.grad_accum,
            checkpointed=self.checkpointed, precision=self.precision,
            attn="sdpa" if self.rung.fused_attention else "math", optimizer="adamw", ema="device",
            vae_in_loop=self.vae is not None, vae_precision=self.precision,
        )


class OfficialStep(TrainStep):
    """The paper's training step written the plain way, as the official ``train.py`` does it.

    fp32; explicit attention (``q @ k^T``, softmax, ``@ v``, as timm's ``Attention``); the VAE encoder in
    the loop (``vae.encode(x).latent_dist.sample() * 0.18215``); AdamW with PyTorch's default
    implementation; ``zero_grad`` after the forward pass (so last step's gradients are still alive during
    it); the EMA updated parameter by parameter with ``mul_``/``add_``. No checkpointing, no compilation.
    The official code turns TF32 on; here it stays off, which is the ``+ TF32`` rung's job.
    """

    def __init__(self, spec: BenchSpec, device: torch.device, vae=None):
        if spec.grad_accum != 1:
            raise ValueError("the official-style step has no gradient accumulation; use grad_accum=1")
        super().__init__(spec, RUNGS["official"], device, vae)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, weight_decay=0)

    def __call__(self) -> torch.Tensor:
        if self.vae is not None:
            x = sample_latents(self.vae, self.data["images"])
        else:
            x = self.x0()
        t = torch.randint(0, self.diffusion.num_timesteps, (x.shape[0],), device=self.device)
        model_kwargs = dict(y=self.data["y"] if self.shape.num_classes else None)
        loss = self.diffusion.training_losses(self.model, x, t, model_kwargs)["loss"].mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        with torch.no_grad():
            for e, p in zip(self.ema.parameters(), self.model.parameters()):
                e.mul_(0.9999).add_(p.data, alpha=1 - 0.9999)
        return loss.detach()


# ----------------------------------------------------------------------------------------------------------
# Measuring one rung
# ----------------------------------------------------------------------------------------------------------


def _proc_status(field: str) -> int | None:
    """A memory line of /proc/self/status in bytes (Linux), e.g. VmRSS (now) or VmHWM (peak)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def rss_bytes() -> int | None:
    return _proc_status("VmRSS")


def peak_rss_bytes() -> int:
    peak = _proc_status("VmHWM")
    if peak is not None:
        return peak
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _is_oom(err: BaseException) -> bool:
    return isinstance(err, torch.cuda.OutOfMemoryError) or "out of memory" in str(err).lower()


def _rung(rung: "str | Rung | dict") -> Rung:
    if isinstance(rung, Rung):
        return rung
    if isinstance(rung, dict):
        return Rung(**rung)
    if rung not in RUNGS:
        raise ValueError(f"unknown rung {rung!r}; choose from {', '.join(RUNGS)}")
    return RUNGS[rung]


def measure_rung(spec: BenchSpec, rung: "str | Rung") -> dict:
    """Run one rung (a key of :data:`RUNGS` or a :class:`Rung`) in this process and return its row."""
    spec = resolve_spec(spec)
    rung = _rung(rung)
    key = rung.key
    device = resolve_device(spec.device)
    if spec.threads:
        torch.set_num_threads(spec.threads)
    set_tf32(rung.tf32 and device.type == "cuda")
    shape = model_shape(spec)
    row = dict(rung=key, label=rung.label, tricks={k: v for k, v in asdict(rung).items() if k not in ("key", "label")},
               batch_size=spec.batch_size, status="ok")
    if rung.checkpointing is not False and rung.checkpointing is not True:
        row["checkpointed_blocks"] = int(rung.checkpointing)
    rss0 = rss_bytes()
    step = None
    if spec.memory_limit_gib and device.type == "cuda":  # a smaller card, simulated on a larger one
        index = device.index if device.index is not None else torch.cuda.current_device()
        total = torch.cuda.get_device_properties(index).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, spec.memory_limit_gib * memory.GIB / total), index)
        row["memory_limit_gib"] = spec.memory_limit_gib
    try:
        vae, vae_source = (None, None)
        if not spec.pixel and not rung.latents:
            vae, vae_source = build_vae(spec.vae, device)
        step = OfficialStep(spec, device, vae) if rung.official else TrainStep(spec, rung, device, vae)
        row.update(precision=step.precision, attention="sdpa" if rung.fused_attention else "math",
                   vae=vae_source if step.vae is not None else None)
        _sync(device)
        row["rss_setup_bytes"] = rss_bytes()
        if device.type == "cuda":
            row["cuda_setup_bytes"] = torch.cuda.memory_allocated(device)
        times = []
        warmup = max(spec.warmup, 2) if rung.compile else spec.warmup  # compilation, then one settled step
        for i in range(warmup + spec.steps):
            if i == warmup and device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            start = time.perf_counter()
            loss = step()
            _sync(device)
            loss = float(loss)
            elapsed = time.perf_counter() - start
            if i < warmup:
                row.setdefault("warmup_s", []).append(round(elapsed, 4))
            else:
                times.append(elapsed)
        row["loss"] = loss
        row["step_s"] = [round(t, 5) for t in times]
        row["step_s_median"] = statistics.median(times)
        row["step_s_min"] = min(times)  # the least disturbed step, for busy machines
        row["images_per_s"] = spec.batch_size * spec.grad_accum / row["step_s_median"]
        row["grad_accum"] = spec.grad_accum
        if device.type == "cuda":
            row["peak_bytes"] = torch.cuda.max_memory_allocated(device)
            row["peak_kind"] = "cuda max_memory_allocated"
        else:
            row["peak_bytes"] = peak_rss_bytes()
            row["peak_kind"] = "peak RSS of the process"
            row["rss_start_bytes"] = rss0
            if spec.track_tensors and not rung.compile:
                tracker = memory.TensorMemoryTracker()
                for t in step.static_tensors():  # counted from the start, and their frees are seen
                    tracker.track(t)
                del t  # hold no reference (an old gradient must be freed by zero_grad)
                with tracker:
                    step()
                tracker.close()
                row["tensor_peak_bytes"] = tracker.peak
        est = memory.estimate(shape, step.setup())
        if rung.official:  # last step's gradients are alive during the forward pass
            est = memory.estimate(shape, step.setup(), grad_accum=2, micro_batch=spec.batch_size)
        row["planned_peak_bytes"] = est.peak
        row["planned"] = {k: v for k, v in est.components().items()}
        measured = row.get("peak_bytes") if device.type == "cuda" else row.get("tensor_peak_bytes")
        if measured:
            row["plan_error"] = memory.relative_error(est.peak, measured)
    except Exception as err:  # noqa: BLE001 - a failed rung is a row of the table, not the end of the run
        row["status"] = "OOM" if _is_oom(err) else f"error: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
    finally:
        del step
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return row


def measure_rung_isolated(spec: BenchSpec, rung: "str | Rung", timeout: float | None = None) -> dict:
    """Run :func:`measure_rung` in a fresh Python process, so that its peak memory is its own."""
    rung = _rung(rung)
    key = rung.key
    payload = json.dumps({"spec": asdict(spec), "rung": asdict(rung)})
    cmd = [sys.executable, "-m", "dit_core.bench", "--child", payload]
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return dict(rung=key, label=rung.label, status=f"timeout after {timeout:g} s")
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK):])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return dict(rung=key, label=rung.label, status=f"error: exit {proc.returncode}: {' | '.join(tail)[:300]}")


def measure_planned(spec: BenchSpec, card_gib: float, global_batch: int = 256, precision: str = "bf16",
                    cap: bool = True, max_micro_batch: int | None = None, timeout: float | None = None) -> dict:
    """The memory planner's choice for a card of ``card_gib`` (as ``dit-plan`` prints it), measured.

    The step runs in a fresh process (:func:`measure_rung_isolated`) with two micro-batches, so that the
    gradients of the first are alive during the second, as in training; with ``cap`` the CUDA allocator is
    capped at ``card_gib``, so a larger GPU stands in for the smaller card. The row carries the plan
    (``row["plan"]``) and, on a GPU of known peak, the MFU.
    """
    shape = model_shape(resolve_spec(spec))
    choice = memory.plan(shape, card_gib, global_batch=global_batch, precision=precision)
    if not choice.fits:
        return dict(rung="planned", label=f"planner, {card_gib:g} GiB", status="no setting fits (see dit-plan)",
                    card_gib=card_gib, plan=choice.as_dict())
    s = choice.setup
    rung = Rung("planned", f"planner, {card_gib:g} GiB: {s.micro_batch} x {s.grad_accum}, "
                f"ckpt {s.checkpointed}/{shape.depth}", checkpointing=s.checkpointed, amp=True, latents=True,
                fused_attention=True, tf32=True)
    micro = min(s.micro_batch, max_micro_batch) if max_micro_batch else s.micro_batch
    run = replace(spec, batch_size=micro, grad_accum=min(2, s.grad_accum), memory_limit_gib=card_gib if cap else None)
    row = measure_rung_isolated(run, rung, timeout)
    if row.get("status") == "ok":
        row["achieved_tflops"] = row["images_per_s"] * train_gflop_per_image(shape) / 1e3
        device = resolve_device(spec.device)
        peak = device_peak_tflops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
        row["mfu"] = row["achieved_tflops"] / peak if peak else None
    return dict(row, card_gib=card_gib, plan=choice.as_dict())


def format_record(data: dict) -> str:
    """A recorded benchmark file (``benchmarks/results/*.json``) as its table: a ladder (``dit-bench --json``,
    ``benchmarks/gpu_ladder.sh``) or a file that carries its own ``table`` (the planner check, the profiles)."""
    if "results" in data:
        text = format_summary(data["results"], data.get("planner_choice", []))
    elif "table" in data:
        text = data["table"]
    else:
        text = format_summary([data], [])
    return text + (f"\nnote: {data['note']}" if data.get("note") else "")


# ----------------------------------------------------------------------------------------------------------
# Sampling and optimizer timings
# ----------------------------------------------------------------------------------------------------------


def measure_sampling(spec: BenchSpec, vae=None, vae_source: str | None = None) -> dict:
    """Images/s of guided sampling: ``sample_steps`` DDIM (or DDPM) steps with classifier-free guidance
    (each step runs the model on the conditional and the null-class halves), bf16/fp16 autocast and fused
    attention where available, then the VAE decoder for latent models."""
    from .diffusion import create_diffusion
    from .models import DiT

    spec = resolve_spec(spec)
    device = resolve_device(spec.device)
    if spec.threads:
        torch.set_num_threads(spec.threads)
    shape = model_shape(spec)
    precision = resolve_precision(spec.precision, device, "reduced")
    torch.manual_seed(spec.seed)
    with torch.device(device):
        model = DiT(**shape.model_kwargs()).eval()
    if spec.sampler not in ("ddim", "ddpm"):
        raise ValueError(f"sampler must be ddim or ddpm, got {spec.sampler!r}")
    diffusion = create_diffusion(f"ddim{spec.sample_steps}" if spec.sampler == "ddim" else str(spec.sample_steps))
    loop = diffusion.ddim_sample_loop if spec.sampler == "ddim" else diffusion.p_sample_loop
    n = spec.sample_batch
    guided = shape.num_classes > 0 and spec.cfg_scale != 1.0
    y = torch.randint(0, max(shape.num_classes, 1), (n,), device=device)
    z = torch.randn(n, shape.in_channels, shape.input_size, shape.input_size, device=device)
    if guided:
        z = torch.cat([z, z])
        y = torch.cat([y, torch.full_like(y, shape.num_classes)])

    def net(x, t, y=None, cfg_scale=None):
        with autocast(device, precision):
            out = model.forward_with_cfg(x, t, y, cfg_scale) if guided else model(x, t, y)
        return out.float()

    kwargs = dict(y=y if shape.num_classes else None)
    if guided:
        kwargs["cfg_scale"] = spec.cfg_scale
    with torch.no_grad():
        warm = create_diffusion("ddim2")
        warm.ddim_sample_loop(net, z.shape, z, clip_denoised=False, model_kwargs=kwargs)
        _sync(device)
        start = time.perf_counter()
        samples = loop(net, z.shape, z, clip_denoised=False, model_kwargs=kwargs)
        _sync(device)
        loop_s = time.perf_counter() - start
        decode_s = 0.0
        if not spec.pixel and spec.sample_decode:
            if vae is None:
                vae, vae_source = build_vae(spec.vae, device)
            with autocast(device, precision):
                decode_latents(vae, samples[:1])  # warm-up
                _sync(device)
                start = time.perf_counter()
                decode_latents(vae, samples[:n])
                _sync(device)
            decode_s = time.perf_counter() - start
    from .flops import forward_macs

    with torch.device("meta"):
        macs = forward_macs(DiT(**shape.model_kwargs()))
    evals = spec.sample_steps * (2 if guided else 1)
    return dict(sampler=spec.sampler, steps=spec.sample_steps, cfg_scale=spec.cfg_scale if guided else None,
                batch=n, precision=precision, loop_s=loop_s, decode_s=decode_s,
                images_per_s=n / (loop_s + decode_s), s_per_image=(loop_s + decode_s) / n,
                model_tflop_per_image=2 * macs * evals / 1e12, vae=vae_source if decode_s else None)


def measure_optimizers(spec: BenchSpec, repeats: int = 3) -> list[dict]:
    """Time the optimizer step and the EMA update for this model: AdamW (fused, multi-tensor, per-parameter),
    bitsandbytes' 8-bit AdamW when installed, the EMA on the device and, on a GPU, the EMA kept on the CPU
    (weights copied over PCIe, then updated there). These are the speed costs of the low-memory options."""
    from .models import DiT

    spec = resolve_spec(spec)
    device = resolve_device(spec.device)
    shape = model_shape(spec)
    torch.manual_seed(spec.seed)
    with torch.device(device):
        model = DiT(**shape.model_kwargs())
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    rows = []

    def timed(fn) -> float:
        fn()
        _sync(device)
        ts = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            _sync(device)
            ts.append(time.perf_counter() - start)
        return statistics.median(ts)

    variants = [("AdamW fused", dict(fused=True)), ("AdamW multi-tensor", dict(foreach=True)),
                ("AdamW per-parameter", dict(foreach=False))]
    for label, kw in variants:
        try:
            opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0, **kw)
            s = timed(opt.step)
            rows.append(dict(what=label, ms=s * 1e3, state_bytes=memory.tensor_bytes(memory.optimizer_tensors(opt))))
            del opt
        except Exception as err:  # noqa: BLE001
            rows.append(dict(what=label, status=f"unavailable: {type(err).__name__}: {str(err)[:100]}"))
    try:
        import bitsandbytes as bnb

        opt = bnb.optim.AdamW8bit(params, lr=1e-4, weight_decay=0)
        s = timed(opt.step)
        rows.append(dict(what="AdamW 8-bit (bitsandbytes)", ms=s * 1e3,
                         state_bytes=memory.tensor_bytes(memory.optimizer_tensors(opt))))
        del opt
    except ImportError:
        rows.append(dict(what="AdamW 8-bit (bitsandbytes)", status="unavailable: pip install bitsandbytes"))
    except Exception as err:  # noqa: BLE001
        rows.append(dict(what="AdamW 8-bit (bitsandbytes)", status=f"failed: {type(err).__name__}: {str(err)[:100]}"))
    all_params = list(model.parameters())
    ema = [p.detach().clone() for p in all_params]

    def ema_update():
        with torch.no_grad():
            torch._foreach_lerp_(ema, [p.detach() for p in all_params], 1 - 0.9999)

    rows.append(dict(what=f"EMA update on {device.type}", ms=timed(ema_update) * 1e3))
    if device.type == "cuda":
        ema_cpu = [p.detach().to("cpu") for p in all_params]
        pinned = [torch.empty_like(e).pin_memory() for e in ema_cpu]

        def ema_on_cpu():
            for buf, p in zip(pinned, all_params):
                buf.copy_(p.detach(), non_blocking=True)
            torch.cuda.synchronize()
            with torch.no_grad():
                torch._foreach_lerp_(ema_cpu, pinned, 1 - 0.9999)

        rows.append(dict(what="EMA update kept on the CPU (copy + lerp)", ms=timed(ema_on_cpu) * 1e3))
    return rows


# ----------------------------------------------------------------------------------------------------------
# The whole benchmark
# ----------------------------------------------------------------------------------------------------------


def check_activations(spec: BenchSpec) -> list[dict]:
    """The planner's activation bytes per image against what autograd saves for this model, on this device:
    fp32 with math attention, bf16/fp16 with fused attention, and the latter with every block checkpointed."""
    from .models import DiT

    spec = resolve_spec(spec)
    device = resolve_device(spec.device)
    shape = model_shape(spec)
    amp = resolve_precision(spec.precision, device, "reduced")
    torch.manual_seed(spec.seed)
    with torch.device(device):
        model = DiT(**shape.model_kwargs())
    rows = []
    for precision, attn, ckpt in (("fp32", "math", 0), (amp, "sdpa", 0), (amp, "sdpa", shape.depth)):
        model.set_attention_backend(attn).set_grad_checkpointing(ckpt)
        measured = memory.measure_saved_per_sample(model, precision)["per_sample"]
        predicted = memory.activation_bytes(shape, precision, attn, ckpt).per_sample
        rows.append(dict(precision=precision, attention=attn, checkpointed=ckpt, predicted=predicted,
                         measured=measured, error=memory.relative_error(predicted, measured)))
    del model
    return rows


def environment(device: torch.device) -> dict:
    from .env import cpu_info

    env = dict(time=time.strftime("%Y-%m-%d %H:%M:%S"), host=platform.node(), python=platform.python_version(),
               torch=torch.__version__, device=device.type, cpu=cpu_info())
    try:
        env["loadavg_1min"] = os.getloadavg()[0]
    except OSError:
        pass
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["gpu_memory_bytes"] = torch.cuda.get_device_properties(device).total_memory
        env["peak_bf16_tflops"] = device_peak_tflops(env["gpu"])
    return env


def _merge_rows(rows: list[dict], batch_images: int) -> dict:
    """One row from several passes of a rung: step times pooled, the largest peak kept."""
    ok = [r for r in rows if r.get("status") == "ok"]
    if not ok:
        return rows[0]
    merged = dict(ok[0])
    times = [t for r in ok for t in r["step_s"]]
    merged.update(step_s=times, step_s_median=statistics.median(times), step_s_min=min(times),
                  images_per_s=batch_images / statistics.median(times), passes=len(ok))
    for key in ("peak_bytes", "tensor_peak_bytes"):
        values = [r[key] for r in ok if r.get(key)]
        if values:
            merged[key] = max(values)
    if merged.get("planned_peak_bytes"):
        measured = merged.get("peak_bytes") if merged.get("peak_kind", "").startswith("cuda") else merged.get("tensor_peak_bytes")
        if measured:
            merged["plan_error"] = memory.relative_error(merged["planned_peak_bytes"], measured)
    return merged


def run_benchmark(spec: BenchSpec, rungs: list[str] | None = None, isolate: bool = True, sampling: bool = True,
                  optimizers: bool = False, timeout: float | None = None, progress: bool = True,
                  activations: bool = True, repeats: int = 1) -> dict:
    """The ladder (one row per rung), sampling throughput, the planner's activation check and, optionally,
    optimizer timings.

    ``repeats > 1`` runs the ladder that many times, in alternating order (forward, backward, ...), and pools
    each rung's step times: on a shared machine whose load drifts, every rung then sees the same mix of quiet
    and busy moments, so the ratios between rungs are fairer.
    """
    spec = resolve_spec(spec)
    device = resolve_device(spec.device)
    shape = model_shape(spec)
    rungs = rungs or default_rungs(device.type, spec.pixel)
    unknown = [r for r in rungs if not isinstance(r, Rung) and r not in RUNGS]
    if unknown:
        raise ValueError(f"unknown rung(s) {unknown}; choose from {', '.join(RUNGS)}")
    rungs = [_rung(r) for r in rungs]
    if spec.pixel:
        rungs = [r for r in rungs if r.key != "latents"]
    env = environment(device)
    gflop = train_gflop_per_image(shape)
    counts = memory.param_counts(shape)
    result = dict(spec=asdict(spec), environment=env,
                  model=dict(name=spec.model, shape=asdict(shape), params=counts["total"], tokens=shape.tokens,
                             train_gflop_per_image=gflop),
                  rows=[])
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    passes: dict[str, list[dict]] = {r.key: [] for r in rungs}
    for p in range(repeats):
        for rung in (rungs if p % 2 == 0 else rungs[::-1]):
            key = rung.key
            if progress:
                print(f"dit-bench: {key:<12} {rung.label} ...", file=sys.stderr, flush=True)
            row = measure_rung_isolated(spec, rung, timeout) if isolate else measure_rung(spec, rung)
            if progress:
                print(f"dit-bench: {key:<12} {_row_summary(row)}", file=sys.stderr, flush=True)
            passes[key].append(row)
    result["repeats"] = repeats
    for rung in rungs:
        row = _merge_rows(passes[rung.key], spec.batch_size * spec.grad_accum)
        if row.get("status") == "ok":
            row["achieved_tflops"] = row["images_per_s"] * gflop / 1e3
            if env.get("peak_bf16_tflops"):
                row["mfu"] = row["achieved_tflops"] / env["peak_bf16_tflops"]
        result["rows"].append(row)
    _add_ratios(result["rows"])
    if sampling:
        try:
            result["sampling"] = measure_sampling(spec)
        except Exception as err:  # noqa: BLE001
            result["sampling"] = dict(status=f"error: {type(err).__name__}: {str(err)[:200]}")
    if activations:
        try:
            result["activation_check"] = check_activations(spec)
        except Exception as err:  # noqa: BLE001 - e.g. out of memory for a large model on a small card
            result["activation_check"] = [dict(status=f"error: {type(err).__name__}: {str(err)[:200]}")]
    if optimizers:
        result["optimizers"] = measure_optimizers(spec)
    try:
        env["loadavg_1min_after"] = os.getloadavg()[0]
    except OSError:
        pass
    vaes = {r.get("vae") for r in result["rows"] if r.get("vae")}
    result["vae"] = sorted(vaes)[0] if len(vaes) == 1 else (sorted(vaes) or None)
    return result


def _add_ratios(rows: list[dict]) -> None:
    by_key = {r["rung"]: r for r in rows if r.get("status") == "ok"}
    for ref in ("official", "baseline"):
        if ref in by_key:
            t_ref = by_key[ref]["step_s_median"]
            for r in rows:
                if r.get("status") == "ok":
                    r[f"speedup_vs_{ref}"] = t_ref / r["step_s_median"]


def _row_summary(row: dict) -> str:
    if row.get("status") != "ok":
        return row.get("status", "?")
    mem = row.get("peak_bytes")
    return (f"{row['step_s_median'] * 1e3:9.1f} ms/step  {row['images_per_s']:8.2f} img/s  "
            f"peak {memory.format_bytes(mem) if mem else '-'}")


def format_table(result: dict) -> str:
    """The ladder as a text table, with the environment and the VAE that was used."""
    env = result["environment"]
    spec = result["spec"]
    model = result["model"]
    cpu = env["cpu"]
    where = env.get("gpu") or f"CPU: {cpu['model']} ({cpu['torch_threads']} threads, bf16 units: {cpu.get('bf16_units') or 'none'})"
    lines = [
        f"{model['name']} ({model['params'] / 1e6:.1f} M params, {model['tokens']} tokens), "
        f"{'pixel' if spec['pixel'] else 'latent'} {spec['image_size']}px, batch {spec['batch_size']}, "
        f"median of {spec['steps']} steps after {spec['warmup']} warm-up"
        + (f" x {result['repeats']} passes in alternating order" if result.get("repeats", 1) > 1 else "")
        + f"; {where}; torch {env['torch']}",
    ]
    if "loadavg_1min" in env:
        lines[0] += f"; load average {env['loadavg_1min']:.1f}"
        if "loadavg_1min_after" in env:
            lines[0] += f" -> {env['loadavg_1min_after']:.1f}"
    if result.get("vae"):
        lines.append(f"VAE: {result['vae']}")
    cores = env["cpu"].get("usable_cores") or 1
    if env["device"] == "cpu" and env.get("loadavg_1min", 0) > 0.75 * cores:
        lines.append(f"note: the machine was busy (load {env['loadavg_1min']:.1f} on {cores} cores): times are longer and "
                     "noisier than on an idle machine; with other processes on the cores, --threads 1 is often faster")
    gpu = env["device"] == "cuda"
    mem_head = "peak alloc" if gpu else "peak RSS"
    head = f"{'rung':<44}{'ms/step':>10}{'min ms':>10}{'img/s':>9}{'x official':>11}{'x base':>8}{mem_head:>12}"
    head += f"{'planned':>11}{'MFU':>7}" if gpu else f"{'tensors':>11}{'planned':>11}"
    lines.append(head)
    for r in result["rows"]:
        if r.get("status") != "ok":
            lines.append(f"{r['label']:<44}{r.get('status', '?')}")
            continue
        fmt = lambda v: (f"{v / memory.GIB:.2f}G" if v >= 0.1 * memory.GIB else f"{v / 2**20:.0f}M") if v else "-"  # noqa: E731
        line = (f"{r['label']:<44}{r['step_s_median'] * 1e3:>10.1f}{r.get('step_s_min', float('nan')) * 1e3:>10.1f}"
                f"{r['images_per_s']:>9.2f}"
                f"{r.get('speedup_vs_official', float('nan')):>11.2f}{r.get('speedup_vs_baseline', float('nan')):>8.2f}"
                f"{fmt(r.get('peak_bytes')):>12}")
        if gpu:
            line += f"{fmt(r.get('planned_peak_bytes')):>11}{r.get('mfu', float('nan')):>7.1%}"
        else:
            line += f"{fmt(r.get('tensor_peak_bytes')):>11}{fmt(r.get('planned_peak_bytes')):>11}"
        lines.append(line)
    s = result.get("sampling")
    if s and "images_per_s" in s:
        lines.append(
            f"sampling: {s['sampler']} {s['steps']} steps, cfg {s['cfg_scale']}, batch {s['batch']}, {s['precision']}: "
            f"{s['images_per_s']:.3f} img/s ({s['loop_s']:.2f} s denoising + {s['decode_s']:.2f} s VAE decode)"
        )
    elif s:
        lines.append(f"sampling: {s.get('status')}")
    for a in result.get("activation_check", []):
        if "error" in a:
            lines.append(f"planner vs saved activations ({a['precision']}, {a['attention']}, "
                         f"{a['checkpointed']} blocks checkpointed): {memory.format_bytes(a['predicted'])} vs "
                         f"{memory.format_bytes(a['measured'])} per image, error {a['error']:+.3%}")
        else:
            lines.append(f"planner vs saved activations: {a.get('status')}")
    for o in result.get("optimizers", []):
        if "ms" in o:
            extra = f", state {memory.format_bytes(o['state_bytes'])}" if o.get("state_bytes") else ""
            lines.append(f"  {o['what']:<44}{o['ms']:>10.1f} ms{extra}")
        else:
            lines.append(f"  {o['what']:<44}{o['status']}")
    return "\n".join(lines)


def format_summary(results: list[dict], extra_rows: list[dict] = ()) -> str:
    """One table for several runs (e.g. batch 32 and 256) plus extra rows (e.g. the planner's choice):
    time, throughput, speed-up over the official-style step, measured and planned peak memory, MFU."""
    first = results[0]
    env = first["environment"]
    gpu = env["device"] == "cuda"
    where = env.get("gpu") or f"CPU {env['cpu']['model']} ({env['cpu']['torch_threads']} threads)"
    lines = [f"{first['model']['name']} at {first['spec']['image_size']}px on {where}, torch {env['torch']}"
             + (f"; VAE: {first['vae']}" if first.get("vae") else "")]
    measured = "peak alloc" if gpu else "tensor peak"
    lines.append(f"{'batch':>5}  {'rung':<44}{'ms/step':>10}{'img/s':>9}{'x official':>11}{measured:>12}"
                 f"{'planned':>10}{'error':>8}{'MFU':>7}")

    def gib(v):
        if not v:
            return "-"
        return f"{v / memory.GIB:.2f}G" if v >= 0.1 * memory.GIB else f"{v / 2**20:.1f}M"

    for result, row in [(r, row) for r in results for row in r["rows"]] + [(first, row) for row in extra_rows]:
        batch = row.get("batch_size", result["spec"]["batch_size"])
        if row.get("status") != "ok":
            lines.append(f"{batch:>5}  {row['label']:<44}{row.get('status')}")
            continue
        meas = row.get("peak_bytes") if gpu else row.get("tensor_peak_bytes")
        err = f"{row['plan_error']:+.1%}" if row.get("plan_error") is not None else "-"
        mfu = f"{row['mfu']:.1%}" if row.get("mfu") is not None else "-"
        ratio = row.get("speedup_vs_official")
        lines.append(f"{batch:>5}  {row['label']:<44}{row['step_s_median'] * 1e3:>10.1f}{row['images_per_s']:>9.2f}"
                     f"{(f'{ratio:.2f}' if ratio else '-'):>11}{gib(meas):>12}{gib(row.get('planned_peak_bytes')):>10}"
                     f"{err:>8}{mfu:>7}")
    for result in results:
        s = result.get("sampling")
        if s and "images_per_s" in s:
            lines.append(f"sampling ({s['sampler']}, {s['steps']} steps, cfg {s['cfg_scale']}, batch {s['batch']}, "
                         f"{s['precision']}): {s['images_per_s']:.2f} img/s = {s['loop_s']:.2f} s denoising + "
                         f"{s['decode_s']:.2f} s VAE decode")
    return "\n".join(lines)


def save_result(result: dict, path: str | os.PathLike) -> Path:
    return atomic_write_text(path, json.dumps(result, indent=1, default=str))


def _child(payload: str) -> int:
    data = json.loads(payload)
    row = measure_rung(BenchSpec(**data["spec"]), data["rung"])
    print(RESULT_MARK + json.dumps(row, default=str), flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        sys.exit(_child(sys.argv[2]))
    from .cli.bench import main

    sys.exit(main())
