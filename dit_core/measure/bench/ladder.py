"""The ladder, measured: every rung's training step timed, its peak memory read, the planner checked against it.

:func:`measure_rung` builds the step of ``dit-train`` (:class:`dit_core.train.step.TrainStep`) configured as
the rung says (:mod:`.rungs`), runs a short warm-up (compilation happens there), then times several steps
and reports their median. Memory: on a GPU, ``torch.cuda.max_memory_allocated`` over the timed steps; on the
CPU, the peak resident set size of a fresh process per rung (``VmHWM``, :mod:`.isolate`) and, for eager
rungs, the peak of tensor bytes alive (:class:`dit_core.measure.memory.TensorMemoryTracker`), which is what
the planner predicts. Model FLOPs utilisation (MFU) on GPUs: model FLOPs per image (3 forward passes, 2
FLOPs per multiply-add, recomputation not counted: 712 GFLOP for DiT-XL/2 at 256 px) x images/s / the
device's dense bf16 peak.

A VAE's speed does not depend on its weights: when the real ``stabilityai/sd-vae-ft-ema`` cannot be loaded
(offline), a randomly initialised ``AutoencoderKL`` of the same architecture is timed instead
(:func:`dit_core.vae.load_vae_or_random`), and the row says which one ran.

``dit-bench`` is the command line (:mod:`dit_core.cli.bench`); ``benchmarks/gpu_ladder.sh`` runs the
DiT-XL/2 ladder on a GPU.
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, replace

import torch

from ...runtime import resolve_device, resolve_precision, set_tf32, synchronize
from .. import memory
from ..estimates import CARDS, peak_tflops
from .isolate import RESULT_MARK, measure_rung_isolated, peak_rss_bytes, rss_bytes
from .report import row_summary
from .rungs import (
    RUNGS,
    BenchSpec,
    LadderPlan,
    Rung,
    as_rung,
    default_rungs,
    model_shape,
    plan_ladder,
    resolve_spec,
    rung_setup,
    step_options,
    train_gflop_per_image,
)
from .timings import build_vae, measure_optimizers, measure_sampling

#: Dense bf16 tensor-core peaks in TFLOP/s, as (lower-case part of ``torch.cuda.get_device_name()``, peak), tried
#: in this order: the book's one table of cards, :data:`dit_core.measure.estimates.CARDS` (sources there).
DEVICE_PEAK_TFLOPS = tuple((key, c.peak_tflops) for c in CARDS for key in c.match)


def device_peak_tflops(name: str) -> float | None:
    """The dense bf16 peak of a GPU by (part of) its name, or None when it is not in the table."""
    return peak_tflops(name)


# ----------------------------------------------------------------------------------------------------------
# One rung
# ----------------------------------------------------------------------------------------------------------


def fixed_batches(spec: BenchSpec, shape: memory.ModelShape, device: torch.device, images: bool):
    """``(micro-batches, tensors)``: the same batch at every step (data loading is not what is measured) as an
    endless iterator of ``(x, y)``: images for the VAE in the loop, pixels, or a fresh posterior draw
    ``mean + std * noise`` of stored latent moments at every step, as a latent dataset gives; and the tensors
    that hold the batch (alive across steps)."""
    g = torch.Generator().manual_seed(spec.seed)
    n = spec.batch_size
    y = torch.randint(0, max(shape.num_classes, 1), (n,), generator=g).to(device)
    if images:
        x = (torch.rand(n, 3, spec.image_size, spec.image_size, generator=g) * 2 - 1).to(device)
        return itertools.repeat((x, y)), [x, y]
    size = (n, shape.in_channels, shape.input_size, shape.input_size)
    if spec.pixel:
        x = (torch.rand(size, generator=g) * 2 - 1).to(device)
        return itertools.repeat((x, y)), [x, y]
    mean, std = torch.randn(size, generator=g).to(device), (0.1 * torch.rand(size, generator=g)).to(device)
    return ((mean + std * torch.randn_like(std), y) for _ in itertools.count()), [mean, std, y]


def make_step(spec: BenchSpec, rung: Rung, device: torch.device, vae=None):
    """``(step, micro-batches, batch tensors)``: the training step of ``dit-train`` on this workload,
    configured as ``rung`` says; ``vae`` runs in the loop unless the rung reads pre-extracted latents."""
    from ...diffusion import create_diffusion
    from ...models import DiT
    from ...train.config import TrainConfig
    from ...train.ema import create_ema
    from ...train.optimizer import make_optimizer
    from ...attention import set_sdpa_kernel
    from ...runtime import compile_dit
    from ...train.step import TrainStep

    shape = model_shape(spec)
    torch.manual_seed(spec.seed)
    with torch.device(device):
        model = DiT(**shape.model_kwargs(), attn_backend="sdpa" if rung.fused_attention else "math")
    model.set_grad_checkpointing(rung.checkpointing).eval()  # eval: the step drops labels itself
    ema = create_ema(model)
    if rung.attn_kernel:
        set_sdpa_kernel(model, rung.attn_kernel)
    if rung.compile:
        compile_dit(model, rung.compile_scope, rung.compile_mode)
    # the official recipe (AdamW, lr 1e-4, no weight decay); the official step uses PyTorch's default AdamW
    opt = make_optimizer(model, TrainConfig(fused_adam="false" if rung.official else "auto"), device)
    in_loop = None if (rung.latents or spec.pixel) else vae
    step = TrainStep(model, create_diffusion(""), opt, ema, step_options(spec, rung, device),
                     batch_size=spec.batch_size * spec.grad_accum, seed=spec.seed, vae=in_loop)
    batches, tensors = fixed_batches(spec, shape, device, images=in_loop is not None)
    return step, batches, tensors


def planned_setup(step, spec: BenchSpec, rung: Rung) -> memory.TrainSetup:
    """The planner's description of a rung's step as built: its precision, its checkpointed blocks, the VAE it
    encodes with (if any) and the device type."""
    vae = memory.VaeShape.from_model(step.vae, "in the loop") if step.vae is not None else None
    setup = rung_setup(spec, rung, step.device.type, step.options.precision, vae)
    return replace(setup, checkpointed=len(step.model.checkpointed_blocks))


def _tensors_alive(step, batch: list) -> list:
    """What lives across steps: weights, EMA, optimizer state, gradients, the VAE, the batch."""
    out = list(step.model.parameters()) + list(step.ema.parameters()) + memory.optimizer_tensors(step.opt)
    out += [p.grad for p in step.model.parameters() if p.grad is not None]
    if step.vae is not None:
        out += list(step.vae.parameters())
    return out + batch


def _is_oom(err: BaseException) -> bool:
    return isinstance(err, torch.cuda.OutOfMemoryError) or "out of memory" in str(err).lower()


def measure_rung(spec: BenchSpec, rung: "str | Rung") -> dict:
    """Run one rung (a key of :data:`~.rungs.RUNGS` or a :class:`~.rungs.Rung`) in this process; its row."""
    spec = resolve_spec(spec)
    rung = as_rung(rung)
    device = resolve_device(spec.device)
    if spec.threads:
        torch.set_num_threads(spec.threads)
    set_tf32(rung.tf32 and device.type == "cuda")
    shape = model_shape(spec)
    row = dict(rung=rung.key, label=rung.label, batch_size=spec.batch_size, status="ok",
               tricks={k: v for k, v in asdict(rung).items() if k not in ("key", "label")})
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
        step, batches, batch = make_step(spec, rung, device, vae)
        row.update(precision=step.options.precision, attention="sdpa" if rung.fused_attention else "math",
                   vae=vae_source if step.vae is not None else None)
        synchronize(device)
        row["rss_setup_bytes"] = rss_bytes()
        if device.type == "cuda":
            row["cuda_setup_bytes"] = torch.cuda.memory_allocated(device)
        times = []
        warmup = max(spec.warmup, 2) if rung.compile else spec.warmup  # compilation, then one settled step
        for i in range(warmup + spec.steps):
            if i == warmup and device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            start = time.perf_counter()
            loss = step(i, batches).loss
            synchronize(device)
            loss = float(loss)
            elapsed = time.perf_counter() - start
            if i < warmup:
                row.setdefault("warmup_s", []).append(round(elapsed, 4))
            else:
                times.append(elapsed)
        row.update(loss=loss, step_s=[round(t, 5) for t in times], step_s_median=statistics.median(times),
                   step_s_min=min(times),  # the least disturbed step, for busy machines
                   step_s_mean=statistics.fmean(times),  # with ema_every > 1 the average step carries its share
                   grad_accum=spec.grad_accum)
        row["images_per_s"] = spec.batch_size * spec.grad_accum / row["step_s_median"]
        if device.type == "cuda":
            row.update(peak_bytes=torch.cuda.max_memory_allocated(device), peak_kind="cuda max_memory_allocated")
        else:
            row.update(peak_bytes=peak_rss_bytes(), peak_kind="peak RSS of the process", rss_start_bytes=rss0)
            if spec.track_tensors and not rung.compile:
                tracker = memory.TensorMemoryTracker()
                for t in _tensors_alive(step, batch):  # counted from the start, and their frees are seen
                    tracker.track(t)
                del t  # hold no reference (an old gradient must be freed by zero_grad)
                with tracker:
                    step(warmup + spec.steps, batches)
                tracker.close()
                row["tensor_peak_bytes"] = tracker.peak
        setup = planned_setup(step, spec, rung)  # the official step's zero_grad before backward: counted in it
        est = memory.estimate(shape, setup)
        row["planned_peak_bytes"] = est.peak
        row["planned"] = est.components()
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


def run_child(payload: str) -> int:
    """The fresh process of :func:`~.isolate.measure_rung_isolated`: one rung, its row printed as marked JSON."""
    data = json.loads(payload)
    row = measure_rung(BenchSpec(**data["spec"]), as_rung(data["rung"]))
    print(RESULT_MARK + json.dumps(row, default=str), flush=True)
    return 0


# ----------------------------------------------------------------------------------------------------------
# The whole ladder
# ----------------------------------------------------------------------------------------------------------


def check_activations(spec: BenchSpec) -> list[dict]:
    """The planner's activation bytes per image against what autograd saves for this model, on this device:
    fp32 with math attention, bf16/fp16 with fused attention, and the latter with every block checkpointed."""
    from ...models import DiT

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
    """Where the ladder ran: time, host, versions, the CPU (and its load), the GPU and its bf16 peak."""
    from ..env import cpu_info

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
        cuda = merged.get("peak_kind", "").startswith("cuda")
        measured = merged.get("peak_bytes") if cuda else merged.get("tensor_peak_bytes")
        if measured:
            merged["plan_error"] = memory.relative_error(merged["planned_peak_bytes"], measured)
    return merged


def add_ratios(rows: list[dict]) -> None:
    """Each row's speed-up over the official step (the reference), over it in strict fp32, and over the baseline
    (where they ran)."""
    by_key = {r["rung"]: r for r in rows if r.get("status") == "ok"}
    for ref in ("official", "official-fp32", "baseline"):
        if ref in by_key:
            t_ref = by_key[ref]["step_s_median"]
            for r in rows:
                if r.get("status") == "ok":
                    r[f"speedup_vs_{ref.replace('-', '_')}"] = t_ref / r["step_s_median"]


def card_memory_gib(spec: BenchSpec, device: torch.device) -> float | None:
    """The memory the ladder is sized for: the spec's ``memory_limit_gib`` (a smaller card, simulated on a larger
    GPU by capping the allocator, or on the CPU only for the sizing), else the GPU's memory, else None (a CPU,
    no card limit)."""
    if spec.memory_limit_gib:
        return float(spec.memory_limit_gib)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.cuda.get_device_properties(index).total_memory / memory.GIB
    return None


def ladder_plan(spec: BenchSpec, rungs: list | None = None, card_gib: "float | str | None" = "auto",
                min_batch: int = 8) -> LadderPlan:
    """What the ladder will run on this machine (:func:`~.rungs.plan_ladder`): ``card_gib="auto"`` sizes it for
    the card found (:func:`card_memory_gib`), a number for a card of that size, None for no limit."""
    spec = resolve_spec(spec)
    device = resolve_device(spec.device)
    rungs = rungs or default_rungs(device.type, spec.pixel)
    unknown = [r for r in rungs if not isinstance(r, Rung) and r not in RUNGS]
    if unknown:
        raise ValueError(f"unknown rung(s) {unknown}; choose from {', '.join(RUNGS)}")
    rungs = [as_rung(r) for r in rungs]
    if spec.pixel:
        rungs = [r for r in rungs if r.key != "latents"]
    if card_gib == "auto":
        card_gib = card_memory_gib(spec, device)
    return plan_ladder(spec, rungs, card_gib, device.type, min_batch=min_batch)


def run_benchmark(spec: BenchSpec, rungs: list | None = None, isolate: bool = True, sampling: bool = True,
                  optimizers: bool = False, timeout: float | None = None, progress: bool = True,
                  activations: bool = True, repeats: int = 1, card_gib: "float | str | None" = "auto",
                  plan: LadderPlan | None = None) -> dict:
    """The ladder (one row per rung), sampling throughput, the planner's activation check and, optionally,
    optimizer timings.

    The ladder is first sized for the card (:func:`ladder_plan`, or the ``plan`` given): the model and batch at
    which the reference rung fits, and only the rungs the planner fits in the card's budget run; the others are
    rows with a "skipped" status, and no ratio is taken against a rung that did not run.

    ``repeats > 1`` runs the ladder that many times, in alternating order (forward, backward, ...), and pools
    each rung's step times: on a shared machine whose load drifts, every rung then sees the same mix of quiet
    and busy moments, so the ratios between rungs are fairer.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    plan = plan or ladder_plan(spec, rungs, card_gib)
    spec = plan.spec
    device = resolve_device(spec.device)
    shape = model_shape(spec)
    by_key = {r.key: r for r in ([as_rung(r) for r in rungs] if rungs else [])}
    rungs = [by_key.get(row["rung"]) or as_rung(row["rung"]) for row in plan.rows]
    skipped = {row["rung"]: row for row in plan.skipped()}
    env = environment(device)
    gflop = train_gflop_per_image(shape)
    counts = memory.param_counts(shape)
    result = dict(spec=asdict(spec), environment=env,
                  model=dict(name=spec.model, shape=asdict(shape), params=counts["total"], tokens=shape.tokens,
                             train_gflop_per_image=gflop),
                  rows=[], repeats=repeats)
    result["plan"] = plan.as_dict()
    passes: dict[str, list[dict]] = {r.key: [] for r in rungs}
    for rung in rungs:
        if rung.key in skipped:
            row = skipped[rung.key]
            passes[rung.key].append(dict(rung=rung.key, label=rung.label, batch_size=spec.batch_size,
                                         status=plan.skip_status(row), planned_peak_bytes=row["planned_peak"]))
    for p in range(repeats):
        for rung in [r for r in (rungs if p % 2 == 0 else rungs[::-1]) if r.key not in skipped]:
            if progress:
                print(f"dit-bench: {rung.key:<12} {rung.label} ...", file=sys.stderr, flush=True)
            row = measure_rung_isolated(spec, rung, timeout) if isolate else measure_rung(spec, rung)
            if not isolate and row.get("peak_kind", "").startswith("peak RSS"):  # the process's, not the rung's
                row.update(peak_bytes=None, peak_kind="none: the rungs share one process (see tensor_peak_bytes)")
            if progress:
                print(f"dit-bench: {rung.key:<12} {row_summary(row)}", file=sys.stderr, flush=True)
            passes[rung.key].append(row)
    for rung in rungs:
        row = _merge_rows(passes[rung.key], spec.batch_size * spec.grad_accum)
        if row.get("status") == "ok":
            row["achieved_tflops"] = row["images_per_s"] * gflop / 1e3
            if env.get("peak_bf16_tflops"):
                row["mfu"] = row["achieved_tflops"] / env["peak_bf16_tflops"]
        result["rows"].append(row)
    add_ratios(result["rows"])
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


def measure_planned(spec: BenchSpec, card_gib: float, global_batch: int = 256, precision: str = "bf16",
                    cap: bool = True, max_micro_batch: int | None = None, timeout: float | None = None) -> dict:
    """The memory planner's choice for a card of ``card_gib`` (as ``dit-plan`` prints it), measured.

    The step runs in a fresh process (:func:`~.isolate.measure_rung_isolated`) with two micro-batches, so that
    the gradients of the first are alive during the second, as in training; with ``cap`` the CUDA allocator is
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
