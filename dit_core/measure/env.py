"""The environment report: what this machine can do for DiT training, and the profile to start from.

``dit-env`` prints it; chapter 00 explains each line. Everything here is read from torch and the
operating system; the attention lines come from actually running each backend on a tiny input, because
"compiled in" and "works on this GPU with this dtype" are not the same thing.
"""

from __future__ import annotations

import os
import platform
import sys
import time

import torch

from ..runtime import DTYPES, cpu_bf16_is_faster, cpu_bf16_speedup, cpu_bf16_units, cpu_flags, cpu_has_fast_bf16
from ..runtime import cuda_has_native_bf16, resolve_device
from ..runtime import resolve_precision, usable_cores

GIB = 1024**3

# The profiles by GPU memory (GiB as torch reports it; a "24 GB" card shows about 23.6 GiB).
# (upper bound in GiB, profile); above the last bound the profile depends on the architecture.
PROFILE_BY_MEMORY = ((16, "rtx3060-12gb"), (30, "rtx3090-24gb"), (45, "a100-40gb"))
#: The book's GPU track (DiT-B/2 on Imagenette, chapters 01-07) by the number format the card computes natively.
TRACK_PROFILES = {"bf16": "imagenette-b2", "fp16": "imagenette-b2-fp16"}


def cpu_info() -> dict:
    """CPU model, logical cores, cores this process may use, torch threads, and bf16 support.

    bf16 on CPU is fast only with hardware support: ``amx_bf16`` (Intel Sapphire Rapids and later, bf16
    matrix tiles) or ``avx512_bf16`` (Cooper Lake, AMD Zen 4) (:func:`dit_core.runtime.cpu_flags`), and even
    then not always: ``bf16_speedup`` is a measured matmul (:func:`dit_core.runtime.cpu_bf16_speedup`).
    """
    model, flags = cpu_flags()
    return {
        "model": model,
        "logical_cores": os.cpu_count(),
        "usable_cores": usable_cores(),
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "amx_bf16": "amx_bf16" in flags,
        "avx512_bf16": "avx512_bf16" in flags,
        "avx512f": "avx512f" in flags,
        "avx2": "avx2" in flags,
        "bf16_units": cpu_bf16_units(flags),
        "bf16_fast": cpu_has_fast_bf16(),
        "bf16_speedup": round(cpu_bf16_speedup(), 2),  # measured: bf16 matmul speed / fp32 (0 where emulated)
        "bf16_auto": cpu_bf16_is_faster(),  # what mixed_precision "auto" picks on this CPU
        "torch_cpu_capability": _safe(lambda: torch.backends.cpu.get_cpu_capability()),
    }


def memory_gib() -> float | None:
    """Total RAM in GiB (Linux), or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) * 1024 / GIB, 1)
    except OSError:
        pass
    return None


def gpu_info(index: int) -> dict:
    """Name, memory, compute capability, bf16 and TF32 support of one CUDA device."""
    props = torch.cuda.get_device_properties(index)
    major, minor = props.major, props.minor
    return {
        "index": index,
        "name": props.name,
        "memory_gib": round(props.total_memory / GIB, 1),
        "capability": f"{major}.{minor}",
        "multiprocessors": props.multi_processor_count,
        # bf16 tensor cores and TF32 arrived with Ampere (compute capability 8.0).
        "bf16": major >= 8,
        "tf32": major >= 8,
    }


def attention_backends(device: str | torch.device | None = None) -> dict:
    """Which scaled-dot-product-attention kernels run here: ``{name: True | "reason it fails"}``.

    Each SDPA backend (flash, memory-efficient, math; cuDNN on recent GPUs) is forced in turn with
    ``torch.nn.attention.sdpa_kernel`` on a tiny input, in bf16 on a GPU that has it (fp16 otherwise),
    in fp32 on the CPU. xformers is tried when installed.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    device = resolve_device(device)
    dtype = DTYPES[resolve_precision("auto", device, "reduced")] if device.type == "cuda" else torch.float32
    q = torch.randn(1, 2, 64, 64, device=device, dtype=dtype)
    result = {}
    names = {
        "flash": "FLASH_ATTENTION",
        "mem_efficient": "EFFICIENT_ATTENTION",
        "math": "MATH",
        "cudnn": "CUDNN_ATTENTION",
    }
    for name, attr in names.items():
        backend = getattr(SDPBackend, attr, None)
        if backend is None:
            result[name] = "not in this torch"
            continue
        try:
            with sdpa_kernel(backend):
                torch.nn.functional.scaled_dot_product_attention(q, q, q)
            result[name] = True
        except Exception as err:  # noqa: BLE001 - any failure means "not usable here"
            reason = _first_line(err)
            if "No viable backend" in reason:  # torch's generic message when the forced kernel cannot run
                reason = f"no kernel for {device.type} / {str(dtype).replace('torch.', '')} in this build"
            result[name] = reason
    try:
        import xformers
        import xformers.ops as xops

        try:
            xops.memory_efficient_attention(q.transpose(1, 2), q.transpose(1, 2), q.transpose(1, 2))
            result["xformers"] = True
        except Exception as err:  # noqa: BLE001
            result["xformers"] = f"xformers {xformers.__version__} installed but fails: {_first_line(err)}"
    except Exception:  # noqa: BLE001 - an xformers built for another torch fails in odd ways
        result["xformers"] = "not installed (optional; SDPA covers it)"
    return result


def recommend_profile(report: dict) -> str:
    """The configuration profile to start from on this machine.

    No CUDA GPU: ``digits`` (pixel space, small DiT; minutes on a laptop). With a GPU, by memory of the
    first device: < 16 GiB ``rtx3060-12gb``, < 30 ``rtx3090-24gb``, < 45 ``a100-40gb``, otherwise
    ``h100-80gb`` on Hopper (compute capability 9.x) and ``a100-80gb`` on anything else.
    """
    gpus = report.get("gpus") or []
    if not report.get("cuda_available") or not gpus:
        return "digits"
    gpu = gpus[0]
    mem = gpu["memory_gib"]
    for bound, name in PROFILE_BY_MEMORY:
        if mem < bound:
            return name
    return "h100-80gb" if str(gpu["capability"]).startswith("9.") else "a100-80gb"


def native_bf16(gpu: dict) -> bool:
    """True for a GPU of compute capability 8.0 or later (Ampere, Ada, Hopper), whose tensor cores compute bf16.
    Older cards (T4: 7.5, V100: 7.0) run bf16 only emulated, which PyTorch may report as "supported"."""
    return int(str(gpu["capability"]).split(".")[0]) >= 8


def recommend_track(report: dict) -> dict:
    """The book's track for this machine, and the profiles to use.

    - no CUDA GPU: the CPU track, ``digits`` (pixel space, minutes on a laptop);
    - a CUDA GPU: the GPU track (Imagenette, DiT-B/2 in chapter 05), ``imagenette-b2`` in bf16 on cards with bf16
      hardware, ``imagenette-b2-fp16`` (fp16 with a gradient scaler) on older ones. ``long_run`` is the DiT-XL/2
      profile for the card (:func:`recommend_profile`), with ``long_run_overrides`` that switch it to fp16 where
      bf16 would be emulated.
    """
    gpus = report.get("gpus") or []
    if not report.get("cuda_available") or not gpus:
        return {"track": "cpu", "profile": "digits", "precision": None, "long_run": None, "long_run_overrides": {},
                "why": "no CUDA GPU: the chapters train and sample the digits in pixel space"}
    gpu = gpus[0]
    precision = "bf16" if native_bf16(gpu) else "fp16"
    overrides = {} if precision == "bf16" else {"mixed_precision": "fp16", "tf32": False}
    why = (f"{gpu['name']} (compute capability {gpu['capability']}, {gpu['memory_gib']} GiB): the chapters train "
           f"DiT-B/2 on Imagenette latents in {precision}")
    if precision == "fp16":
        why += " with a gradient scaler (no bf16 hardware before compute capability 8.0; emulated bf16 is slow)"
    return {"track": "gpu", "profile": TRACK_PROFILES[precision], "precision": precision,
            "long_run": recommend_profile(report), "long_run_overrides": overrides, "why": why}


def environment_report(probe_attention: bool = True) -> dict:
    """Everything ``dit-env`` prints, as plain data (JSON serialisable)."""
    cuda = torch.cuda.is_available()
    report = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda_build": torch.version.cuda,  # None on a CPU build of torch
        "cudnn": _safe(lambda: torch.backends.cudnn.version()) if cuda else None,
        "cuda_available": cuda,
        "gpus": [gpu_info(i) for i in range(torch.cuda.device_count())] if cuda else [],
        "mps_available": bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()),
        "bf16_supported": bool(cuda and cuda_has_native_bf16()),  # in hardware: emulation does not count
        "tf32_supported": bool(cuda and torch.cuda.get_device_capability(0)[0] >= 8),
        "tf32_matmul_enabled": _safe(lambda: torch.backends.cuda.matmul.allow_tf32),
        "tf32_cudnn_enabled": _safe(lambda: torch.backends.cudnn.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cpu": cpu_info(),
        "ram_gib": memory_gib(),
        "attention": attention_backends() if probe_attention else {},
    }
    report["profile"] = recommend_profile(report)
    report["track"] = recommend_track(report)
    report["notes"] = _notes(report)
    return report


def _notes(report: dict) -> list[str]:
    notes = []
    if report["cuda_build"] is None and not report["cuda_available"]:
        notes.append("CPU build of torch: GPU profiles need a CUDA build (see environment.yml)")
    elif report["cuda_build"] and not report["cuda_available"]:
        notes.append(
            "torch was built with CUDA but sees no GPU: check the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES"
        )
    if report["gpus"] and report["gpus"][0]["memory_gib"] < 10:
        notes.append("less GPU memory than the smallest GPU profile assumes: lower the micro-batch or use digits")
    if report["gpus"] and not report["bf16_supported"]:
        notes.append("no bf16 on this GPU (pre-Ampere): mixed precision falls back to fp16 with loss scaling")
    if report["mps_available"]:
        notes.append("Apple GPU (MPS) found: the digits profile runs on it with device='mps'")
    cpu = report["cpu"]
    if not report["cuda_available"] and cpu["bf16_fast"]:
        if cpu.get("bf16_auto", True):
            notes.append("this CPU has bf16 hardware (AMX / AVX512-BF16): bf16 autocast speeds up CPU training")
        else:
            notes.append(f"this CPU has bf16 instructions, but a bf16 matmul ran at {cpu['bf16_speedup']}x the speed "
                         "of fp32 here: mixed_precision auto trains in fp32")
    if cpu["torch_threads"] > cpu["usable_cores"]:
        notes.append(
            f"torch uses {cpu['torch_threads']} threads on {cpu['usable_cores']} usable cores: set OMP_NUM_THREADS"
        )
    return notes


def _yes(value) -> str:
    if value is True:
        return "yes"
    if value is False or value is None:
        return "no"
    return str(value)


def format_report(report: dict) -> str:
    """The text ``dit-env`` prints: one fact per line."""
    cpu = report["cpu"]
    lines = [
        f"python            {report['python']}  ({report['platform']})",
        f"torch             {report['torch']}  (CUDA build: {report['cuda_build'] or 'none, CPU only'}"
        + (f", cuDNN {report['cudnn']})" if report.get("cudnn") else ")"),
        f"CUDA available    {_yes(report['cuda_available'])}",
    ]
    for gpu in report["gpus"]:
        lines.append(
            f"GPU {gpu['index']}             {gpu['name']}, {gpu['memory_gib']} GiB, "
            f"compute capability {gpu['capability']}, {gpu['multiprocessors']} SMs"
        )
    lines += [
        f"bf16 (GPU)        {_yes(report['bf16_supported'])}",
        f"TF32              supported: {_yes(report['tf32_supported'])}; enabled for matmul: "
        f"{_yes(report['tf32_matmul_enabled'])}, for cuDNN conv: {_yes(report['tf32_cudnn_enabled'])}; "
        f"float32 matmul precision '{report['float32_matmul_precision']}'",
    ]
    if report["attention"]:
        att = report["attention"]
        lines.append("attention         " + ", ".join(f"{k}: {'yes' if v is True else 'no'}" for k, v in att.items()))
        for k, v in att.items():
            if v is not True and k != "cudnn":
                lines.append(f"  {k}: {v}")
    lines += [
        f"CPU               {cpu['model']}",
        f"CPU threads       torch {cpu['torch_threads']}, usable cores {cpu['usable_cores']}, logical cores "
        f"{cpu['logical_cores']}, OMP_NUM_THREADS={cpu['omp_num_threads'] or 'unset'}",
        f"CPU bf16          {cpu['bf16_units'] or 'none'} (torch CPU kernels: {cpu['torch_cpu_capability']})"
        + (f", matmul {cpu['bf16_speedup']}x fp32: auto uses {'bf16' if cpu.get('bf16_auto') else 'fp32'}"
           if cpu.get("bf16_units") and "bf16_speedup" in cpu else ""),
        f"RAM               {report['ram_gib']} GiB",
        f"profile           {report['profile']}",
    ]
    track = report.get("track")
    if track:
        line = f"track             {track['track']}: chapters use {track['profile']}"
        if track["track"] == "gpu":
            flags = "".join(f" --{k.replace('_', '-')} {str(v).lower()}" for k, v in track["long_run_overrides"].items())
            line += f" ({track['precision']}); DiT-XL/2: dit-train --config {track['long_run']}{flags}"
        lines.append(line)
    lines += [f"note: {n}" for n in report["notes"]]
    return "\n".join(lines)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:160]}" if text else type(err).__name__


def _safe(fn):
    try:
        return fn()
    except Exception:  # noqa: BLE001
        return None


# --------------------------------------------------------------------------------------------- number formats
#: Bits of (sign, exponent, mantissa) of the formats mixed-precision training uses. The exponent sets the
#: range, the mantissa the precision. TF32 is not a storage type: it is how Ampere and later tensor cores
#: multiply fp32 inputs (fp32's range, fp16's precision), switched on by ``torch.backends.cuda.matmul.allow_tf32``.
FORMAT_BITS = {"fp32": (1, 8, 23), "tf32": (1, 8, 10), "bf16": (1, 8, 7), "fp16": (1, 5, 10)}


def matmul_modes(device: str | torch.device | None = None) -> list[str]:
    """The matmul precisions worth comparing on ``device``: fp32, bf16 and fp16 everywhere, and TF32 on a
    CUDA GPU of compute capability 8.0 or later (elsewhere it does not exist)."""
    device = resolve_device(device)
    modes = ["fp32"]
    if device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 8:
        modes.append("tf32")
    return modes + ["bf16", "fp16"]


def matmul_benchmark(n: int = 1024, modes=None, device: str | torch.device | None = None, repeats: int = 5,
                     seed: int = 0) -> dict:
    """Speed and accuracy of one ``n x n`` matrix product in each precision mode.

    Returns ``{mode: {"tflops": ..., "ms": ..., "rel_error": ...}}``. Speed: median of ``repeats`` timed
    products after one warm-up, at 2 n^3 FLOP each. Accuracy: relative (Frobenius) error against the float64
    product of the same fp32 inputs, computed on ``device``. "bf16" and "fp16" cast both inputs, as autocast
    does; "fp32" runs with TF32 off and "tf32" with it on (the setting is restored afterwards).
    """
    device = resolve_device(device)
    modes = list(modes or matmul_modes(device))
    unknown = [m for m in modes if m not in FORMAT_BITS]
    if unknown:
        raise ValueError(f"unknown matmul mode(s) {unknown}; choose from {', '.join(FORMAT_BITS)}")
    if "tf32" in modes and "tf32" not in matmul_modes(device):
        raise ValueError(f"TF32 needs a CUDA GPU of compute capability 8.0 or later; {device} has none")
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(n, n, generator=gen).to(device)
    b = torch.randn(n, n, generator=gen).to(device)
    reference = a.double() @ b.double()
    dtypes = {**DTYPES, "tf32": torch.float32}
    cuda = device.type == "cuda"
    saved = torch.backends.cuda.matmul.allow_tf32
    result = {}
    try:
        for mode in modes:
            torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
            x, y = a.to(dtypes[mode]), b.to(dtypes[mode])
            out = x @ y  # warm-up (kernel selection)
            times = []
            for _ in range(max(1, repeats)):
                if cuda:
                    torch.cuda.synchronize(device)
                t0 = time.perf_counter()
                out = x @ y
                if cuda:
                    torch.cuda.synchronize(device)
                times.append(time.perf_counter() - t0)
            seconds = sorted(times)[len(times) // 2]
            error = (out.double() - reference).norm() / reference.norm()
            result[mode] = {"tflops": 2 * n**3 / seconds / 1e12, "ms": seconds * 1e3, "rel_error": float(error)}
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    return result
