"""The training step and the sampler on the CPU, against the official code's plain fp32 operations.

One process, the same weights everywhere, the candidates timed in alternating order (A B C A B C ...) and
reported as medians, each as a ratio to an official-style reference measured in the same run
(``benchmarks/official_style.py``: the official model and diffusion computed as the official code computes them):

* DiT-S/2 on 4x32x32 latents: one training step at batch 8 (AdamW, EMA, the hybrid loss), and a 10-step guided
  DDPM sample of 4 images (guidance 4.0 on 3 channels, as the official ``sample.py``);
* the book's CPU path, the ``digits`` profile: its training step (batch 64) and its sampler (50 DDIM steps,
  guidance 2.0, 4 images per class);
* what bounds it: the share of matrix products in the fp32 step (PyTorch's profiler) and their rate against one
  large matrix product alone;
* ``--int8-quality CKPT``: int8 sampling of a trained digits model against fp32 sampling with the same seeds
  (class accuracy, Fréchet distance in the digit classifier's space, the difference of the samples).

Candidates for dit_core's best setting: ``torch.compile`` of the blocks or of the whole model (compile time
reported), bf16 autocast where the CPU has native bf16 (AMX, AVX512-BF16; ``--force-bf16`` times it anyway), and for
sampling int8 dynamic quantization (opt-in: it changes the samples; its own row, not "best"). The winner is the
fastest candidate whose results equal fp32 to round-off.

    python benchmarks/cpu_vs_official.py                           # the table, and benchmarks/results/cpu-vs-official.json
    python benchmarks/cpu_vs_official.py --rounds 3 --no-digits    # quicker
    python benchmarks/cpu_vs_official.py --dry-run                 # tiny sizes: checks the script (tests run it)
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import math
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

import torch  # noqa: E402

import official_style as off  # noqa: E402
from dit_core import runtime  # noqa: E402
from dit_core.diffusion import create_diffusion, get_named_beta_schedule  # noqa: E402
from dit_core.models import DiT  # noqa: E402
from dit_core.sample import generate  # noqa: E402
from dit_core.sample.int8 import int8_copy  # noqa: E402
from dit_core.train.config import TrainConfig  # noqa: E402
from dit_core.train.ema import create_ema  # noqa: E402
from dit_core.train.optimizer import make_optimizer  # noqa: E402
from dit_core.train.step import StepOptions, TrainStep  # noqa: E402

OUT = REPO / "benchmarks" / "results" / "cpu-vs-official.json"

# The two workloads: model shape, batches, sampler.
WORKLOADS = {
    "DiT-S/2": dict(model=dict(input_size=32, patch_size=2, in_channels=4, hidden_size=384, depth=12, num_heads=6,
                               num_classes=1000),
                    train_batch=8, schedule="linear", grad_clip=0.0, sample_images=4, sampler="ddpm", steps=10,
                    cfg=4.0, guided_channels=3, clip=False),
    "digits": dict(model=dict(input_size=8, patch_size=2, in_channels=1, hidden_size=128, depth=4, num_heads=4,
                              num_classes=10),
                   train_batch=64, schedule="squaredcos_cap_v2", grad_clip=1.0, sample_images=40, sampler="ddim",
                   steps=50, cfg=2.0, guided_channels=1, clip=True),
}
DRY = dict(model=dict(input_size=8, patch_size=2, in_channels=4, hidden_size=32, depth=2, num_heads=2, num_classes=10),
           train_batch=4, schedule="linear", grad_clip=0.0, sample_images=2, sampler="ddpm", steps=3, cfg=4.0,
           guided_channels=3, clip=False)


class Candidate:
    """One way of running the workload: ``fn()`` runs it once (a training step, or a whole sample)."""

    def __init__(self, key, label, fn, *, reference=False, exact=True, note=""):
        self.key, self.label, self.fn, self.reference, self.exact, self.note = key, label, fn, reference, exact, note
        self.times, self.first_s, self.output = [], None, None

    def row(self) -> dict:
        med = statistics.median(self.times) if self.times else None
        return dict(key=self.key, label=self.label, exact=self.exact, note=self.note, times_s=[round(t, 4) for t in self.times],
                    median_s=med, min_s=min(self.times) if self.times else None, first_call_s=self.first_s)


def loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


# ----------------------------------------------------------------------------------------------------------
# Building the candidates
# ----------------------------------------------------------------------------------------------------------


def reference_model(w: dict) -> off.OfficialStyleDiT:
    m = w["model"]
    return off.OfficialStyleDiT(input_size=m["input_size"], patch_size=m["patch_size"], in_channels=m["in_channels"],
                                hidden_size=m["hidden_size"], depth=m["depth"], num_heads=m["num_heads"],
                                num_classes=m["num_classes"], guided_channels=w["guided_channels"])


def dit_copy(ref: torch.nn.Module, w: dict) -> DiT:
    model = DiT(**w["model"])
    model.load_state_dict(ref.state_dict(), strict=True)  # the same key layout, the same weights
    return model


def train_candidates(w: dict, ref: torch.nn.Module, settings: list[str]) -> list[Candidate]:
    """The official-style step, then dit_core's trainer step (``dit-train``'s TrainStep) in each setting."""
    n = w["train_batch"]
    g = torch.Generator().manual_seed(0)
    m = w["model"]
    x = torch.randn(n, m["in_channels"], m["input_size"], m["input_size"], generator=g)
    y = torch.randint(0, m["num_classes"], (n,), generator=g)
    betas = get_named_beta_schedule(w["schedule"], 1000)
    out = []

    official = copy.deepcopy(ref).train()
    official_ema = copy.deepcopy(official).requires_grad_(False)
    official_opt = torch.optim.AdamW(official.parameters(), lr=1e-4, weight_decay=0)  # PyTorch's default AdamW
    od = off.OfficialStyleDiffusion(betas=betas)
    out.append(Candidate("official", "official code, fp32",
                         lambda: off.train_step(official, official_ema, official_opt, od, x, y), reference=True))
    for setting in settings:
        model = dit_copy(ref, w).eval()  # eval: the step drops labels itself
        precision = "bf16" if "bf16" in setting else "fp32"
        if "compile" in setting:  # the trainer's scope (runtime.default_compile_scope): the whole model on the CPU,
            # where a block compiled alone has wrong gradients (PyTorch 2.13)
            runtime.compile_dit(model, "model" if "model" in setting else None)
        opt = make_optimizer(model, TrainConfig(), torch.device("cpu"))  # fused AdamW, the trainer's default
        step = TrainStep(model, create_diffusion("", noise_schedule=w["schedule"]), opt, create_ema(model),
                         StepOptions(precision=precision, grad_clip=w["grad_clip"]), batch_size=n)
        batches, counter = itertools.repeat((x, y)), itertools.count()
        out.append(Candidate(setting, label_of(setting), lambda s=step, b=batches, c=counter: s(next(c), b).loss.item()))
    return out


def sample_candidates(w: dict, ref: torch.nn.Module, settings: list[str]) -> list[Candidate]:
    """The official-style sampler (``sample.py``'s loop on the doubled batch), then :func:`dit_core.sample.generate`."""
    m = w["model"]
    n = w["sample_images"]
    labels = torch.arange(n) % m["num_classes"]
    g = torch.Generator().manual_seed(1)
    z = torch.randn(n, m["in_channels"], m["input_size"], m["input_size"], generator=g)
    betas = get_named_beta_schedule(w["schedule"], 1000)
    ddim = w["sampler"] == "ddim"
    kept = list(range(0, 1000, 1000 // w["steps"])) if ddim else None
    od = off.OfficialStyleDiffusion(steps=None if ddim else w["steps"], betas=betas, use_timesteps=kept)
    official = copy.deepcopy(ref).eval()
    out = [Candidate("official", "official code, fp32",
                     lambda: off.sample(official, od, z, labels, w["cfg"], m["num_classes"], ddim=ddim,
                                        clip_denoised=w["clip"]), reference=True)]
    diffusion = create_diffusion("", noise_schedule=w["schedule"])
    for setting in settings:
        model = dit_copy(ref, w).eval()
        if "int8" in setting:
            model = int8_copy(model)
        if "compile" in setting:
            runtime.compile_dit(model, "model" if "model" in setting else "blocks")
        amp = "bf16" if "bf16" in setting else "fp32"
        fn = (lambda mm=model, a=amp: generate(mm, diffusion, labels, cfg_scale=w["cfg"], sampler=w["sampler"],
                                              steps=w["steps"], seed=0, clip_denoised=w["clip"],
                                              guidance_channels=w["guided_channels"], amp=a, batch_size=n))
        out.append(Candidate(setting, label_of(setting), fn, exact="int8" not in setting and "bf16" not in setting,
                             note="opt-in: changes the samples" if "int8" in setting else ""))
    return out


LABELS = {
    "fp32": "dit_core, fp32",
    "compile": "dit_core, compile",  # train: the trainer's scope; sample: each block
    "compile-model": "dit_core, compile (whole model)",
    "bf16": "dit_core, bf16 autocast",
    "bf16-compile": "dit_core, bf16 + compile (blocks)",
    "int8": "dit_core, int8 linears (opt-in)",
    "int8-compile": "dit_core, int8 + compile (opt-in)",
}


def label_of(setting: str) -> str:
    return LABELS.get(setting, f"dit_core, {setting}")


def settings_for(kind: str, args) -> list[str]:
    """The candidates of this machine: bf16 only with native bf16 (or ``--force-bf16``), compile only with a
    C++ compiler, int8 only for sampling."""
    out = ["fp32"]
    can_compile = not args.no_compile and runtime.compiler_missing("cpu") is None
    if can_compile:
        out += ["compile"] + (["compile-model"] if args.whole_model else [])
    if runtime.cpu_has_fast_bf16() or args.force_bf16:
        out += ["bf16"] + (["bf16-compile"] if can_compile else [])
    if kind == "sample" and not args.no_int8:
        out += ["int8"] + (["int8-compile"] if can_compile else [])
    return out


# ----------------------------------------------------------------------------------------------------------
# Timing: first calls (compilation), then rounds in alternating order
# ----------------------------------------------------------------------------------------------------------


def run_alternating(cands: list[Candidate], rounds: int, log) -> None:
    for c in cands:  # first call: warm-up, compilation
        start = time.perf_counter()
        c.output = c.fn()
        c.first_s = time.perf_counter() - start
        log(f"  {c.label}: first call {c.first_s:.1f} s")
    for c in cands:  # a second untimed call: anything lazy after the others' compilation settles here
        c.fn()
    for r in range(rounds):
        order = cands if r % 2 == 0 else cands[::-1]  # A B C, C B A, ...: no candidate always runs first
        for c in order:
            start = time.perf_counter()
            c.fn()
            c.times.append(time.perf_counter() - start)
        log(f"  round {r + 1}/{rounds}: " + ", ".join(f"{c.key} {c.times[-1]:.2f}s" for c in cands))


def finish_rows(cands: list[Candidate], kind: str) -> list[dict]:
    ref = next(c for c in cands if c.reference)
    fp32 = next((c for c in cands if c.key == "fp32"), None)
    rows = []
    for c in cands:
        row = c.row()
        row["x_official"] = statistics.median(ref.times) / row["median_s"]
        if c.first_s is not None and "compile" in c.key:  # the first call compiles: its time beyond a settled call
            row["compile_s"] = max(0.0, c.first_s - row["median_s"])
        if kind == "sample" and fp32 is not None and isinstance(c.output, torch.Tensor) and c is not ref:
            diff = (c.output - fp32.output).float()
            row["max_abs_diff_vs_fp32"] = diff.abs().max().item()
            row["rms_diff_vs_fp32"] = diff.pow(2).mean().sqrt().item()
        rows.append(row)
    return rows


def best_of(rows: list[dict]) -> dict:
    """The fastest dit_core setting whose results equal fp32 to round-off (int8 and bf16 do not count unless the
    machine's bf16 is native: then bf16 is the book's own default, ``precision: auto``)."""
    fast_bf16 = runtime.cpu_has_fast_bf16()
    pool = [r for r in rows if r["key"] != "official" and (r["exact"] or (fast_bf16 and "bf16" in r["key"]))]
    return min(pool, key=lambda r: r["median_s"])


# ----------------------------------------------------------------------------------------------------------
# What bounds it: the matrix products' share of the fp32 step, and their rate
# ----------------------------------------------------------------------------------------------------------

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::_scaled_dot_product_flash_attention_for_cpu",
              "aten::_scaled_dot_product_flash_attention_for_cpu_backward", "aten::convolution_backward",
              "aten::mkldnn_convolution", "quantized::linear_dynamic")


def profile_shares(fn) -> dict:
    """Self CPU time of one call of ``fn`` by operator: the matrix products' share, and the top operators."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    mat = sum(e.self_cpu_time_total for e in events if e.key in MATMUL_OPS)
    top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:8]
    return dict(total_ms=total / 1e3, matmul_share=mat / total if total else math.nan,
                top=[(e.key, round(e.self_cpu_time_total / total, 4)) for e in top])


def gemm_rate(m=2048, k=384, n=1536, repeats=5) -> float:
    """GFLOP/s of one fp32 matrix product of DiT-S/2's MLP shape (batch 8 x 256 tokens, width 384 -> 1536) alone."""
    a, b = torch.randn(m, k), torch.randn(k, n)
    a @ b
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return 2 * m * k * n / min(times) / 1e9


def gelu_times(shape=(2048, 1536), repeats=5) -> dict:
    """Milliseconds of the tanh GELU on DiT-S/2's MLP activations (batch 8): PyTorch's kernel, and the sigmoid form
    that ``dit_core.models.TanhGELU`` uses under ``torch.compile``, compiled."""
    import torch.nn.functional as F

    from dit_core.models import TanhGELU

    x = torch.randn(shape)
    compiled = torch.compile(TanhGELU())

    def best(fn):
        fn()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return 1e3 * min(times)

    return dict(shape=list(shape), tanh_kernel_ms=best(lambda: F.gelu(x, approximate="tanh")),
                sigmoid_form_compiled_ms=best(lambda: compiled(x)))


def model_train_gflop(w: dict) -> float:
    from dit_core.measure.flops import forward_macs

    with torch.device("meta"):
        macs = forward_macs(DiT(**w["model"]))
    return 6 * macs * w["train_batch"] / 1e9


# ----------------------------------------------------------------------------------------------------------
# int8 quality on a trained digits model
# ----------------------------------------------------------------------------------------------------------


def int8_quality(ckpt: str, per_class: int, log) -> dict:
    """fp32 and int8 samples of a trained digits model with the same seeds: accuracy, Fréchet distance, difference."""
    from dit_core.checkpoint import load_dit
    from dit_core.eval.digits import digits_metrics

    path = Path(ckpt)
    if path.is_dir():
        path = path / "checkpoints" / "last.pt"
    model = load_dit(path).eval()
    cfg = torch.load(path, map_location="cpu", weights_only=True).get("config", {})
    diffusion = create_diffusion("", noise_schedule=cfg.get("noise_schedule", "linear"), learn_sigma=model.learn_sigma)
    labels = torch.arange(10).repeat_interleave(per_class)
    out = dict(checkpoint=str(path), per_class=per_class, sampler="ddim", steps=50, cfg_scale=2.0)
    images = {}
    for name, m in (("fp32", model), ("int8", int8_copy(model))):
        start = time.perf_counter()
        images[name] = generate(m, diffusion, labels, cfg_scale=2.0, sampler="ddim", steps=50, seed=0, batch_size=100)
        metrics = digits_metrics(images[name], labels)
        out[name] = dict(class_accuracy=metrics["class_accuracy"], frechet_distance=metrics["frechet_distance"],
                         real_floor=metrics.get("real_floor"), seconds=time.perf_counter() - start)
        log(f"  {name}: accuracy {metrics['class_accuracy']:.3f}, Fréchet distance {metrics['frechet_distance']:.3f}")
    diff = images["int8"] - images["fp32"]
    out["rms_diff"] = diff.pow(2).mean().sqrt().item()
    out["max_abs_diff"] = diff.abs().max().item()
    from dit_core.eval.digits import classifier

    clf = classifier()
    out["same_predicted_class"] = float((clf.predict(images["int8"]) == clf.predict(images["fp32"])).mean())
    return out


# ----------------------------------------------------------------------------------------------------------
# The table
# ----------------------------------------------------------------------------------------------------------


def format_tables(record: dict) -> str:
    env = record["environment"]
    lines = [f"CPU: {env['cpu']} ({env['threads']} threads; bf16 units: {env['bf16_units'] or 'none'}); torch "
             f"{env['torch']}; load average {env['load_before']} -> {env['load_after']} on {env['cores']} cores; "
             f"median of {record['rounds']} alternating rounds"]
    for name, part in record["workloads"].items():
        w = part["workload"]
        lines.append("")
        lines.append(f"== {name}: train step at batch {w['train_batch']}; {w['steps']}-step guided {w['sampler'].upper()} "
                     f"sample of {w['sample_images']} images (cfg {w['cfg']})")
        head = f"{'':<38}{'train s/step':>13}{'x official':>11}   {'sample s':>9}{'x official':>11}"
        lines.append(head)
        t_rows, s_rows = part["train"], part["sample"]
        summary = [("official code, fp32", _get(t_rows, "official"), _get(s_rows, "official")),
                   ("dit_core, fp32", _get(t_rows, "fp32"), _get(s_rows, "fp32")),
                   ("dit_core, best setting", _get(t_rows, part["best_train"]), _get(s_rows, part["best_sample"]))]
        for label, t, s in summary:
            lines.append(_line(label, t, s))
        lines.append(f"  (best setting: train {label_of(part['best_train'])!r}, sample {label_of(part['best_sample'])!r}; "
                     "int8 is opt-in and not counted)")
        lines.append("every candidate:")
        keys = [r["key"] for r in t_rows] + [r["key"] for r in s_rows if r["key"] not in {x["key"] for x in t_rows}]
        for k in keys:
            t, s = _get(t_rows, k), _get(s_rows, k)
            label = (t or s)["label"]
            extra = []
            for r in (t, s):
                if r and r.get("compile_s") is not None:
                    extra.append(f"compile {r['compile_s']:.0f} s")
            if s and s.get("max_abs_diff_vs_fp32") is not None and k != "fp32":
                extra.append(f"samples vs fp32: max |diff| {s['max_abs_diff_vs_fp32']:.1e}, rms {s['rms_diff_vs_fp32']:.1e}")
            lines.append(_line("  " + label, t, s) + ("   " + "; ".join(extra) if extra else ""))
        if part.get("profile"):
            p = part["profile"]
            lines.append(f"what bounds it (fp32): matrix products and attention are {p['train']['matmul_share']:.0%} of the "
                         f"train step's CPU time and {p['sample']['matmul_share']:.0%} of sampling's; the step's model "
                         f"arithmetic runs at {p['train_gflops']:.0f} GFLOP/s, one {p['gemm_shape']} fp32 matrix product "
                         f"alone at {p['gemm_gflops']:.0f} GFLOP/s")
            if p.get("gelu"):
                lines.append(f"tanh GELU on {p['gelu']['shape'][0]}x{p['gelu']['shape'][1]}: PyTorch's kernel "
                             f"{p['gelu']['tanh_kernel_ms']:.1f} ms, the sigmoid form compiled "
                             f"{p['gelu']['sigmoid_form_compiled_ms']:.1f} ms")
    q = record.get("int8_quality")
    if q:
        lines.append("")
        lines.append(f"int8 quality ({q['checkpoint']}, {q['per_class']} per class, DDIM 50, cfg 2): class accuracy "
                     f"fp32 {q['fp32']['class_accuracy']:.3f} / int8 {q['int8']['class_accuracy']:.3f}; Fréchet distance "
                     f"fp32 {q['fp32']['frechet_distance']:.3f} / int8 {q['int8']['frechet_distance']:.3f} (real floor "
                     f"{q['fp32']['real_floor']:.3f}); samples differ by rms {q['rms_diff']:.3f} (range [-1, 1]); "
                     f"{q['same_predicted_class']:.1%} classified alike")
    return "\n".join(lines)


def _get(rows, key):
    return next((r for r in rows if r["key"] == key), None)


def _line(label, t, s) -> str:
    def cell(r, width):
        return f"{r['median_s']:>{width}.3f}{r['x_official']:>10.2f}x" if r else f"{'-':>{width}}{'':>11}"

    return f"{label[:38]:<38}{cell(t, 13)}   {cell(s, 9)}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds per part (the median is reported)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: OMP_NUM_THREADS or the usable cores)")
    p.add_argument("--no-digits", action="store_true", help="skip the digits profile")
    p.add_argument("--no-dit", action="store_true", help="skip DiT-S/2")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile candidates")
    p.add_argument("--whole-model", action="store_true", help="also compile the whole model (several minutes on 2 cores)")
    p.add_argument("--no-int8", action="store_true", help="skip the int8 sampling candidates")
    p.add_argument("--force-bf16", action="store_true", help="time bf16 autocast even without native bf16 (emulated: slow)")
    p.add_argument("--no-profile", action="store_true", help="skip the profiler's matmul share")
    p.add_argument("--int8-quality", default=None, metavar="CKPT",
                   help="a trained digits run or checkpoint: int8 vs fp32 samples (accuracy, Fréchet distance)")
    p.add_argument("--per-class", type=int, default=20, help="--int8-quality: samples per digit")
    p.add_argument("--dry-run", action="store_true", help="tiny sizes, one round: checks the script, no figure means anything")
    p.add_argument("--json", default=None, help=f"where to write the record (default {OUT.relative_to(REPO)}; dry run: none)")
    args = p.parse_args(argv)
    threads = runtime.set_threads(args.threads)
    warnings.filterwarnings("ignore", message=".*TF32.*")
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    rounds = min(args.rounds, 2) if args.dry_run else args.rounds
    workloads = {"tiny (dry run)": DRY} if args.dry_run else {
        k: v for k, v in WORKLOADS.items() if not (k == "digits" and args.no_digits) and not (k == "DiT-S/2" and args.no_dit)}
    model, flags = runtime.cpu_flags()
    record = dict(environment=dict(cpu=model, bf16_units=runtime.cpu_bf16_units(flags), threads=threads,
                                   cores=runtime.usable_cores(), torch=torch.__version__, load_before=loadavg(),
                                   time=time.strftime("%Y-%m-%d %H:%M:%S"),
                                   compiler=runtime.compiler_missing("cpu") or "found"),
                  rounds=rounds, dry_run=args.dry_run, workloads={})
    for name, w in workloads.items():
        log(f"== {name}")
        torch.manual_seed(0)
        ref = reference_model(w)
        part = dict(workload=dict(w))
        for kind, build in (("train", train_candidates), ("sample", sample_candidates)):
            cands = build(w, ref, settings_for(kind, args))
            log(f" {kind}: " + ", ".join(c.key for c in cands))
            run_alternating(cands, rounds, log)
            part[kind] = finish_rows(cands, kind)
            part[f"best_{kind}"] = best_of(part[kind])["key"]
            if kind == "train" and not args.no_profile:
                fp32 = next(c for c in cands if c.key == "fp32")
                part["profile"] = dict(train=profile_shares(fp32.fn))
                med = _get(part["train"], "fp32")["median_s"]
                part["profile"]["train_gflops"] = model_train_gflop(w) / med
                part["profile"]["gemm_gflops"] = gemm_rate()
                part["profile"]["gemm_shape"] = "2048x384 @ 384x1536"
                if name == "DiT-S/2" and runtime.compiler_missing("cpu") is None and not args.no_compile:
                    part["profile"]["gelu"] = gelu_times()
            if kind == "sample" and not args.no_profile:
                part["profile"]["sample"] = profile_shares(next(c for c in cands if c.key == "fp32").fn)
            del cands
        record["workloads"][name] = part
    if args.int8_quality:
        log("== int8 quality")
        record["int8_quality"] = int8_quality(args.int8_quality, args.per_class, log)
    record["environment"]["load_after"] = loadavg()
    record["table"] = format_tables(record)
    print(record["table"])
    path = args.json or (None if args.dry_run else str(OUT))
    if path:
        from dit_core.atomic import atomic_write_text

        atomic_write_text(path, json.dumps(record, indent=1, default=str))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
