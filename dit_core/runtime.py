"""Where and how the arithmetic runs: the device, the precision, TF32, and the CPU threads.

Every part of the library (the trainer, the sampler, the benchmarks, latent extraction) asks the same few
questions before it computes anything; each is answered here, once:

* :func:`resolve_device`: ``"auto"`` is the first CUDA GPU, else Apple's MPS, else the CPU;
* :func:`resolve_precision`: what ``"auto"`` means for mixed precision. The answer depends on what the
  precision is *for* (:data:`PURPOSES`): the DiT itself, a benchmark rung that must run in reduced precision, or
  the VAE encoder. bf16 is used where the hardware runs it natively (Ampere and newer GPUs; CPUs with AMX, or
  with AVX512-BF16 where a measured bf16 matmul beats fp32: :func:`cpu_bf16_speedup`), fp16 with a gradient
  scaler on older GPUs;
* :func:`autocast`: mixed precision as a context: matmuls in bf16/fp16, reductions in fp32, fp32 weights;
* :func:`set_tf32`: TF32 tensor cores for fp32 matmuls (Ampere and newer; the official code turns them on);
* :func:`cpu_flags`, :func:`cpu_has_fast_bf16`: what the CPU offers (``dit-env`` reports it);
* :func:`usable_cores`, :func:`set_threads`: how many CPU threads torch should use. On a 2-core machine torch
  slows down badly when its threads outnumber the free cores;
* :func:`compiler_missing`, :func:`compile_dit`: ``torch.compile`` where it can build kernels (a C++ compiler
  on the CPU, Triton on a GPU), of each DiT block (one compile shared by all blocks) or of the whole model.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import shutil
from pathlib import Path

import torch

#: The precisions a computation can run in, by name.
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
#: Other spellings of the same precisions (PyTorch's dtype names).
_SPELLINGS = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}


# ----------------------------------------------------------------------------------------------------------
# The device
# ----------------------------------------------------------------------------------------------------------


def resolve_device(name: str | torch.device | None = "auto", local_rank: int = 0) -> torch.device:
    """``"auto"`` (or None): the GPU (``cuda:LOCAL_RANK`` under torchrun), else Apple's MPS, else the CPU.

    An explicit ``cuda`` is checked (a clear error where torch sees no GPU) and gets the index ``local_rank``
    when it names none.
    """
    if name is None or str(name) == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank)
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device 'cuda' was asked for but torch sees no CUDA GPU here; use --device cpu")
        if device.index is None:
            device = torch.device("cuda", local_rank)
    return device


# ----------------------------------------------------------------------------------------------------------
# The CPU
# ----------------------------------------------------------------------------------------------------------


def cpu_flags(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> tuple[str, set[str]]:
    """``(model name, instruction-set flags)`` of the CPU, read from ``/proc/cpuinfo`` (Linux).

    Elsewhere (no such file) the model is ``platform.processor()`` and the flags are empty.
    """
    model, flags = platform.processor() or platform.machine(), set()
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return model, flags
    named = False
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "flags" and not flags:
            flags = set(value.split())
        elif key == "model name" and not named:
            model, named = value.strip(), True
    return model, flags


def cpu_bf16_units(flags: set[str]) -> str | None:
    """The CPU's native bf16 instructions among ``flags``: ``"AMX"`` (Intel Sapphire Rapids and later, bf16
    matrix tiles), ``"AVX512-BF16"`` (Cooper Lake, AMD Zen 4), or None."""
    if "amx_bf16" in flags:
        return "AMX"
    if "avx512_bf16" in flags:
        return "AVX512-BF16"
    return None


def cpu_has_fast_bf16(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> bool:
    """True on CPUs with AMX or AVX-512 BF16 instructions, where oneDNN can run bf16 matmuls natively.

    Having the instructions does not make bf16 faster: on a 2-core Intel Xeon (model 207) that lists
    ``avx512_bf16`` but whose hypervisor hides AMX, a bf16 matmul ran at 0.65x the speed of fp32 (136 vs 206
    GFLOP/s) and a training step of the ``small-images`` profile took 446 ms in bf16 against 217 ms in fp32,
    while on an earlier AVX512-BF16 machine bf16 was 1.8x faster. :func:`cpu_bf16_speedup` measures it.
    """
    if _amx_usable():
        return True
    return cpu_bf16_units(cpu_flags(cpuinfo)[1]) is not None


def _amx_usable() -> bool:
    amx = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return bool(amx is not None and amx())


#: bf16 must beat fp32 by this factor on :func:`cpu_bf16_speedup`'s matmul before ``"auto"`` picks it on a CPU
#: (autocast adds casts that the matmul alone does not show).
BF16_MIN_SPEEDUP = 1.2
_BF16_SPEEDUP: dict[int, float] = {}


def cpu_bf16_speedup(size: tuple[int, int, int] = (2048, 256, 1024), repeats: int = 8) -> float:
    """How many times faster a bf16 matmul runs than an fp32 one on this CPU, at torch's current threads.

    Measured once per process and thread count (about 0.25 s on 2 cores): a (2048 x 256) @ (256 x 1024) product, the shape
    of a small DiT's MLP on a batch of tokens, best of ``repeats`` after a warm-up. CPUs without bf16
    instructions (:func:`cpu_has_fast_bf16`) are not measured: they emulate bf16, which is always slower (0.0).
    """
    threads = torch.get_num_threads()
    if threads in _BF16_SPEEDUP:
        return _BF16_SPEEDUP[threads]
    if not cpu_has_fast_bf16():
        return _BF16_SPEEDUP.setdefault(threads, 0.0)
    import time

    m, k, n = size
    best = {}
    with torch.no_grad():
        for dtype in (torch.float32, torch.bfloat16):
            a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
            a @ b  # warm-up: oneDNN builds its kernel on the first call
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                a @ b
                times.append(time.perf_counter() - start)
            best[dtype] = min(times)
    return _BF16_SPEEDUP.setdefault(threads, best[torch.float32] / max(best[torch.bfloat16], 1e-9))


def cpu_bf16_is_faster() -> bool:
    """Whether ``"auto"`` computes a model in bf16 on this CPU: AMX, or a measured bf16 matmul at least
    :data:`BF16_MIN_SPEEDUP` times faster than fp32 (:func:`cpu_bf16_speedup`)."""
    return _amx_usable() or cpu_bf16_speedup() >= BF16_MIN_SPEEDUP


def usable_cores() -> int:
    """CPU cores this process may really use: its CPU affinity, capped by a cgroup CPU quota if any.

    ``os.cpu_count()`` reports the host's cores, which inside a container can be many more than the
    container may use; torch then oversubscribes the cores and slows down badly.
    """
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        n = os.cpu_count() or 1
    try:  # cgroup v2: "max 100000" or "200000 100000"
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            n = min(n, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, n)


def set_threads(n: int | None = None) -> int:
    """Set torch's intra-op CPU threads and return the number used.

    ``n`` if given; otherwise ``OMP_NUM_THREADS`` if it is set (tests and CI pin it); otherwise the cores
    this process may use (:func:`usable_cores`). Harmless on a GPU machine: it only affects CPU ops.
    """
    if n is None:
        env = os.environ.get("OMP_NUM_THREADS", "").strip()
        if env:
            try:
                n = int(env)
            except ValueError:
                raise ValueError(f"OMP_NUM_THREADS={env!r} is not an integer; unset it or set e.g. 2") from None
        else:
            n = usable_cores()
    n = int(n)
    if n < 1:
        raise ValueError(f"set_threads needs n >= 1, got {n}")
    torch.set_num_threads(n)
    return torch.get_num_threads()


# ----------------------------------------------------------------------------------------------------------
# The precision
# ----------------------------------------------------------------------------------------------------------

def cuda_has_native_bf16() -> bool:
    """True when the current CUDA GPU computes bf16 in hardware (compute capability 8.0, Ampere, and later).

    ``torch.cuda.is_bf16_supported()`` also answers yes on older GPUs (T4, V100), where bf16 runs emulated and
    slowly; that never counts here (``including_emulation=False``), so bf16 is never chosen where it is emulated.
    """
    try:
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # a torch without the argument (or a test's stand-in)
        return bool(torch.cuda.is_bf16_supported())


#: What a precision is for, which decides what ``"auto"`` means (:func:`resolve_precision`).
PURPOSES = ("model", "reduced", "vae")


def auto_precision(purpose: str, device: torch.device) -> str:
    """``"auto"`` for ``purpose`` on ``device``:

    * ``"model"`` (the trainer, the sampler): bf16 on GPUs that have it and on CPUs where it is faster
      (:func:`cpu_bf16_is_faster`), fp16 (with a gradient scaler when training) on older GPUs, fp32 elsewhere;
    * ``"reduced"`` (the mixed-precision rungs of ``dit-bench``, which exist to measure reduced precision):
      bf16, or fp16 on GPUs without bf16; never fp32;
    * ``"vae"`` (the VAE encoder of latent extraction): fp16 autocast on a GPU, fp32 elsewhere. Measured with
      ``benchmarks/data_bench.py`` (:func:`dit_core.vae.compare_precisions`, randomly initialised VAEs on the
      CPU): the rms error of the latent mean relative to its rms is about 1.7e-2 in bf16 and 2.2e-3 in fp16
      for the tiny test VAE, 1.3e-2 and 1.6e-3 for the full SD-VAE architecture: fp16 is about 8x more
      accurate (3 more mantissa bits), and float16 storage adds only 2e-4. Autocast keeps GroupNorm and the
      softmax in fp32, so SD-VAE activations stay in fp16's range; a batch that overflows is re-encoded in
      fp32 anyway. On the CPU the default stays fp32, the reference result (CPU fp16 has no fast kernels); on
      CPUs with AMX, ``"bf16"`` trades accuracy for speed.
    """
    if device.type == "cuda":
        if purpose == "vae":
            return "fp16"
        return "bf16" if cuda_has_native_bf16() else "fp16"
    if purpose == "reduced":
        return "bf16"
    if purpose == "model" and device.type == "cpu" and cpu_bf16_is_faster():
        return "bf16"
    return "fp32"


def resolve_precision(name: str, device: torch.device | str, purpose: str = "model") -> str:
    """The precision to compute in: ``"fp32"``, ``"bf16"`` or ``"fp16"``.

    ``name`` is one of those, a dtype name (``"bfloat16"``, ...), or ``"auto"``, whose meaning depends on the
    ``purpose`` (``"model"``, ``"reduced"`` or ``"vae"``; see :func:`auto_precision`) and the ``device``. An explicit bf16 on a GPU that
    has none (before Ampere) is an error that names the fix.
    """
    device = torch.device(device)
    if purpose not in PURPOSES:
        raise ValueError(f"purpose must be one of {', '.join(PURPOSES)}, got {purpose!r}")
    name = _SPELLINGS.get(str(name).lower(), str(name).lower())
    if name == "auto":
        return auto_precision(purpose, device)
    if name not in DTYPES:
        raise ValueError(f"precision must be 'auto', 'fp32', 'bf16' or 'fp16', got {name!r}")
    if name == "bf16" and device.type == "cuda" and not cuda_has_native_bf16():
        raise ValueError("this GPU has no bf16 support (it predates Ampere); use fp16 (with a gradient scaler) or fp32")
    return name


def autocast(device: torch.device | str, precision: str):
    """Mixed precision: matmuls in bf16/fp16, reductions and the loss in fp32; weights stay fp32.

    ``fp32`` (and the ``meta`` device, which computes nothing) is a no-op context.
    """
    device = torch.device(device)
    if precision == "fp32" or device.type == "meta":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=DTYPES[precision])


def set_tf32(enabled: bool) -> None:
    """Let fp32 matmuls and convolutions use TF32 tensor cores (fp32's range, fp16's precision; GPU only)."""
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


def synchronize(device: torch.device | str) -> None:
    """Wait until ``device`` has finished its queued work (GPUs run asynchronously); for timing."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


# ----------------------------------------------------------------------------------------------------------
# Compilation
# ----------------------------------------------------------------------------------------------------------

#: What :func:`compile_dit` compiles: every block on its own (all blocks share one compiled graph, so it compiles
#: once, not once per block) or the whole model as one graph (embeddings and the final layer too; every block is
#: traced again, so it compiles several times longer).
COMPILE_SCOPES = ("blocks", "model")


def compiler_missing(device: torch.device | str) -> str | None:
    """Why ``torch.compile`` (its default backend, inductor) cannot build kernels for ``device`` here, or None.

    On the CPU inductor writes C++ and needs a compiler (``$CXX``, ``g++``, ``c++`` or ``clang++``); on a GPU it
    writes Triton kernels and needs the ``triton`` package (installed with PyTorch's CUDA wheels).
    """
    device = torch.device(device)
    if device.type == "cpu":
        names = [os.environ["CXX"]] if os.environ.get("CXX") else []
        if not any(shutil.which(n) for n in names + ["g++", "c++", "clang++"]):
            return ("torch.compile on the CPU needs a C++ compiler and none was found (g++, c++, clang++ or $CXX); "
                    "install one (apt-get install g++, xcode-select --install) or run without compile")
        return None
    if device.type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            return "torch.compile on a GPU needs the triton package: pip install triton (or run without compile)"
        return None
    return f"torch.compile is not used on {device.type} here; run without compile"


def default_compile_scope(device: torch.device | str) -> str:
    """The scope :func:`compile_dit` uses when none is given: ``"blocks"`` on a GPU (regional compilation: one
    compile shared by all blocks), ``"model"`` on the CPU.

    Why not blocks on the CPU: with PyTorch 2.13's inductor, a DiT block compiled on its own computes its forward
    pass to float32 round-off but its *gradients* 0.8-2 % away from the float64 ones (DiT-S width 384, two
    blocks: 2.3 %; eager float32: 1e-7), and the error goes away when inductor's C++ code is not vectorised
    (``cpp.simdlen = 1``) or kernels are not fused (``max_fusion_size = 1``): a bug of the vectorised CPU
    kernels for the block's fused backward. The whole model compiled as one graph is correct (4e-6).
    ``tests/test_speed_paths.py`` keeps both facts under test, so a PyTorch that fixes it shows up as a
    failing expected-failure."""
    return "model" if torch.device(device).type == "cpu" else "blocks"


def compile_dit(model: torch.nn.Module, scope: str | None = None, mode: str | None = None) -> torch.nn.Module:
    """``torch.compile`` a DiT in place and return it: each of ``model.blocks`` (``scope="blocks"``) or the whole
    ``model`` (``"model"``); None: :func:`default_compile_scope` of the model's device. ``mode`` is
    torch.compile's (None, ``"max-autotune-no-cudagraphs"``,
    ``"reduce-overhead"``: CUDA graphs). The weights are not copied: the compiled model trains, samples and saves
    as before (state-dict keys unchanged). Under compilation the MLP's tanh GELU is written with a sigmoid, which
    the compiler fuses into one faster pass (:class:`dit_core.models.TanhGELU`). A clear error when no compiler
    is available (:func:`compiler_missing`)."""
    first = next(model.parameters(), None)
    device = first.device if first is not None else torch.device("cpu")
    scope = default_compile_scope(device) if scope is None else scope
    if scope not in COMPILE_SCOPES:
        raise ValueError(f"compile scope must be one of {', '.join(COMPILE_SCOPES)}, got {scope!r}")
    missing = compiler_missing(device)
    if missing:
        raise ValueError(missing)
    if scope == "blocks":
        for block in model.blocks:
            block.compile(mode=mode)
    else:
        model.compile(mode=mode)
    return model
