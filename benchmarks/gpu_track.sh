#!/usr/bin/env bash
# The book's GPU track end to end, at full size, on one GPU with no internet, measured chapter by chapter.
#
# It executes chapters 00, 01, 02, 05 and 07 with papermill as `make book` does, with TRACK = "gpu", on stand-ins
# for every download, made here first (nothing is fetched):
#   * imagenette2-320.tgz: 9,469 + 3,925 GENERATED JPEGs (short side 320 px) in Imagenette's layout and class
#     folders (dit_core.data.imagenette.make_archive): the same count and size of images, not the photographs;
#   * sd-vae-ft-ema: a RANDOMLY INITIALISED AutoencoderKL of Stable Diffusion's architecture (save_pretrained);
#   * DiT-XL-2-256x256.pt: a RANDOMLY INITIALISED DiT-XL/2 in the official checkpoint format (2.7 GB);
#   * the FID Inception-v3 weights: random ones.
# Shapes, code paths, data sizes, time and memory are those of the real thing; pictures and FIDs are not.
#
# It records, per chapter: wall time (papermill's per-cell durations, the GPU-track cells apart), torch's peak
# allocated GPU memory in the chapter's kernel, and nvidia-smi's peak memory in use. To fit in about 8 minutes of
# an H200 it trains for TRAIN_MINUTES (1) instead of the chapter's 15 and draws FID_SAMPLES (300) instead of
# 2,000 per model, and extrapolates to the chapters' defaults: training is a wall-clock budget, so the training
# cell's time minus the budget used plus 15 minutes; FID sampling time grows linearly with the sample count, so
# the measured sampling seconds of each model times (2000 / FID_SAMPLES - 1) are added (the rest of the FID cell,
# the 3,925 reference images and the real-vs-real floor, is not scaled). Downloads (3.5 GB) are not included.
# Writes <OUT>/<gpu>-gpu-track.json and .md (commit them: the intro's GPU column comes from them), rewritten after
# each chapter so that a run stopped at a time limit keeps the chapters it finished, and keeps the executed
# notebooks in <WORK>/executed/.
#
#   bash benchmarks/gpu_track.sh                 # on a CUDA GPU (about 8 minutes on an H200: an estimate, not yet run)
#   bash benchmarks/gpu_track.sh --smoke         # on a CUDA GPU: tiny stand-ins and the chapters' SMOKE sizes, every
#                                                # GPU-track cell on the GPU (records <gpu>-gpu-track-smoke.*)
#   bash benchmarks/gpu_track.sh --dry-run       # the same script on a CPU, with tiny stand-ins and SMOKE sizes
#
# Needs the book's Python packages (pip install -e ".[test,book]": diffusers, papermill, ipykernel, ipywidgets,
# scikit-learn, matplotlib, ...); a machine without them can take them as wheels (the first thing the script does
# is name any that are missing). Knobs (environment): TRAIN_MINUTES (1), FID_SAMPLES (300), WORK (a scratch
# folder, default /tmp/dit-gpu-track), OUT (benchmarks/results), WORKERS (JPEG-encoding processes: all cores),
# CHAPTER_TIMEOUT (seconds per cell, 1200), CHAPTERS (a subset, e.g. "00_environment 01_data"), PYTHON.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
PYTHON=${PYTHON:-python}
MODE=full
case "${1:-}" in
  --dry-run) MODE=dry ;;
  --smoke) MODE=smoke ;;
  "") ;;
  *) echo "usage: bash benchmarks/gpu_track.sh [--smoke | --dry-run]" >&2; exit 2 ;;
esac
export GPU_TRACK_MODE=$MODE
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true

"$PYTHON" - <<'PY'
import importlib.util, json, os, re, shutil, subprocess, sys, tempfile, threading, time
from pathlib import Path

missing = [m for m in ("torch", "diffusers", "papermill", "nbformat", "ipykernel", "ipywidgets", "sklearn",
                       "matplotlib", "yaml", "tqdm", "PIL") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"gpu_track.sh: missing Python packages {missing}; install the book's dependencies "
             "(pip install -e '.[test,book]') or carry their wheels to this machine")

import nbformat
import papermill
import torch

mode = os.environ.get("GPU_TRACK_MODE", "full")
dry = mode == "dry"  # on the CPU
small = mode in ("dry", "smoke")  # tiny stand-ins and the chapters' SMOKE sizes
if not (torch.cuda.is_available() or dry):
    sys.exit("gpu_track.sh needs a CUDA GPU; on a CPU, `bash benchmarks/gpu_track.sh --dry-run` checks the script")

from dit_book import track as tracks

repo = Path.cwd()
train_minutes = float(os.environ.get("TRAIN_MINUTES", "0.05" if small else "1"))
fid_samples = int(os.environ.get("FID_SAMPLES", "10" if small else "300"))
work = Path(os.environ.get("WORK", "/tmp/dit-gpu-track" + ("" if mode == "full" else f"-{mode}")))
out_dir = Path(os.environ.get("OUT", "benchmarks/results"))
workers = int(os.environ.get("WORKERS", str(os.cpu_count() or 1)))
cell_timeout = int(os.environ.get("CHAPTER_TIMEOUT", "1200"))
start_all = time.time()

# -- stand-ins for the downloads, and a scratch copy of the book's layout --------------------------------------
t0 = time.time()
stand = tracks.standins(work / "standins", full_size=not small, workers=workers)
prep_seconds = time.time() - t0
gpu = "dry-run-cpu" if dry else torch.cuda.get_device_name(0)  # after the stand-ins: their JPEG workers fork
slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
print(f"stand-ins ready in {prep_seconds:.0f} s: " + ", ".join(f"{k}={v}" for k, v in stand.items()), flush=True)
book = work / "book"
for old in ("book", "data", "runs", "outputs", "executed"):
    shutil.rmtree(work / old, ignore_errors=True)
book.mkdir(parents=True)
(work / "executed").mkdir()

# a kernel that runs this interpreter with the repository importable
kernels = work / "jupyter" / "kernels" / "python3"
kernels.mkdir(parents=True, exist_ok=True)
(kernels / "kernel.json").write_text(json.dumps({
    "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"], "display_name": "Python 3",
    "language": "python", "env": {"PYTHONPATH": os.environ["PYTHONPATH"], "HF_HUB_OFFLINE": "1"}}))
os.environ["JUPYTER_PATH"] = str(work / "jupyter")

common = {"TRACK": "gpu", "SMOKE": small}
downloads = {"IMAGENETTE_ARCHIVE": str(stand["archive"]), "CHECKSUM": False}
params = {
    "00_environment": {},
    "01_data": {**downloads, "DOWNLOAD": False},
    "02_latents": {**downloads, "VAE": str(stand["vae"]), "DOWNLOAD_VAE": False},
    "05b_your_data": {**downloads, "VAE": str(stand["vae"]), "DOWNLOAD": False, "TRAIN_MINUTES": train_minutes},
    "07_sampling": {**downloads, "VAE": str(stand["vae"]), "DOWNLOAD": False, "OFFICIAL_CKPT": str(stand["official"]),
                    "INCEPTION": str(stand["inception"]), "FID_SAMPLES": fid_samples},
}

if os.environ.get("CHAPTERS"):  # a subset, e.g. CHAPTERS="00_environment 01_data"
    wanted = os.environ["CHAPTERS"].split()
    unknown = [c for c in wanted if c not in params]
    if unknown:
        sys.exit(f"gpu_track.sh: unknown chapters {unknown}; choose from {list(params)}")
    params = {k: v for k, v in params.items() if k in wanted}

# appended to each chapter (in the scratch copy only): what the chapter's kernel measured and computed
RECORD = '''
import json as _json, torch as _torch
_rec = {"peak_allocated_gib": _torch.cuda.max_memory_allocated() / 2**30 if _torch.cuda.is_available() else None,
        "peak_reserved_gib": _torch.cuda.max_memory_reserved() / 2**30 if _torch.cuda.is_available() else None}
for _k in ("track", "gpu_rate", "gpu_result", "race_rows", "fid_rows", "floor", "psnr_gpu"):
    if _k in globals():
        _rec[_k] = globals()[_k]
_json.dump(_rec, open(RECORD_PATH, "w"), default=str, indent=1)
'''

# -- nvidia-smi's view of the memory, sampled every half second --------------------------------------------------
samples = []
if shutil.which("nvidia-smi") and not dry:
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-lms", "500"],
                           stdout=subprocess.PIPE, text=True)
    threading.Thread(target=lambda: [samples.append((time.time(), float(line))) for line in smi.stdout
                                     if line.strip().replace(".", "").isdigit()], daemon=True).start()
else:
    smi = None

# -- the report, rewritten after each chapter ---------------------------------------------------------------------
def gib(v):
    return f"{v:.1f}" if isinstance(v, (int, float)) else "-"


what = {"dry": "DRY RUN on the CPU: tiny stand-ins and the chapters' SMOKE sizes",
        "smoke": "tiny stand-ins and the chapters' SMOKE sizes, on the GPU",
        "full": "generated data of Imagenette's size and count; random-init VAE, DiT-XL/2 and Inception of the real "
                "architectures"}[mode]
suffix = "-smoke" if mode == "smoke" else ""


def save(rows: dict, final: bool) -> str:
    lines = [f"GPU track on {gpu} ({what}), TRAIN_MINUTES {train_minutes:g}, FID_SAMPLES {fid_samples}:",
             f"{'chapter':<16}{'measured':>10}{'GPU cells':>11}{'at defaults':>13}{'peak alloc':>12}{'nvidia-smi':>12}",
             f"{'':<16}{'(s)':>10}{'(s)':>11}{'(min)':>13}{'(GiB)':>12}{'(GiB)':>12}"]
    for stem, r in rows.items():
        lines.append(f"{stem:<16}{r['wall_s']:>10.0f}{r['gpu_track_cells_s']:>11.0f}{r['wall_at_defaults_s'] / 60:>13.1f}"
                     f"{gib(r['peak_allocated_gib']):>12}{gib(r['nvidia_smi_peak_gib']):>12}"
                     + (f"  FAILED {r['error']}" if r["error"] else ""))
    total = sum(r["wall_at_defaults_s"] for r in rows.values())
    lines.append(f"{'all':<16}{sum(r['wall_s'] for r in rows.values()):>10.0f}{'':>11}{total / 60:>13.1f}")
    left = [stem for stem in params if stem not in rows]
    if left:
        lines.append(f"(not run yet: {', '.join(left)})")
    lines.append(f"(stand-ins made in {prep_seconds:.0f} s; total wall time {time.time() - start_all:.0f} s; downloads not included)")
    table = "\n".join(lines)
    if not dry or os.environ.get("OUT"):
        out_dir.mkdir(parents=True, exist_ok=True)
        data = {"gpu": gpu, "mode": mode, "dry_run": dry, "complete": final, "date": time.strftime("%Y-%m-%d"),
                "train_minutes": train_minutes, "fid_samples": fid_samples, "torch": torch.__version__,
                "chapters": rows, "table": table}
        (out_dir / f"{slug}-gpu-track{suffix}.json").write_text(json.dumps(data, indent=1, default=str))
        (out_dir / f"{slug}-gpu-track{suffix}.md").write_text(
            f"# The GPU track on {gpu}\n\nMeasured by `benchmarks/gpu_track.sh{' --smoke' if mode == 'smoke' else ''}` "
            f"on {data['date']}{'' if final else ' (stopped before the last chapter)'}.\n\n```\n{table}\n```\n")
    return table


# -- the chapters ---------------------------------------------------------------------------------------------
rows = {}
for stem, extra in params.items():
    nb = nbformat.read(repo / "book" / f"{stem}.ipynb", as_version=4)
    record_path = work / "executed" / f"{stem}.record.json"
    nb.cells.append(nbformat.v4.new_code_cell(f"RECORD_PATH = {str(record_path)!r}\n" + RECORD))
    src = book / f"{stem}.ipynb"
    nbformat.write(nb, src)
    executed = work / "executed" / f"{stem}.ipynb"
    print(f"== {stem} {extra}", flush=True)
    t0 = time.time()
    error = None
    try:
        papermill.execute_notebook(str(src), str(executed), parameters={**common, **extra}, kernel_name="python3",
                                   cwd=str(book), execution_timeout=cell_timeout, progress_bar=False)
    except Exception as err:  # noqa: BLE001 - keep measuring the other chapters, report this one
        error = f"{type(err).__name__}: {str(err).strip().splitlines()[-1][:300] if str(err).strip() else ''}"
        print(f"   FAILED: {error}", flush=True)
    t1 = time.time()
    cells = nbformat.read(executed, as_version=4).cells if executed.exists() else []
    durations = {c.get("id", str(i)): float(c.metadata.get("papermill", {}).get("duration") or 0.0)
                 for i, c in enumerate(cells) if c.cell_type == "code"}
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    smi_peak = max((mib for t, mib in samples if t0 <= t <= t1), default=None)
    gpu_cells = sum(d for cid, d in durations.items() if cid.startswith("g0"))
    row = {"wall_s": t1 - t0, "cells_s": sum(durations.values()), "gpu_track_cells_s": gpu_cells,
           "peak_allocated_gib": record.get("peak_allocated_gib"), "peak_reserved_gib": record.get("peak_reserved_gib"),
           "nvidia_smi_peak_gib": smi_peak / 1024 if smi_peak is not None else None, "error": error,
           "slowest_cells": sorted(durations.items(), key=lambda kv: -kv[1])[:5], "record": record}
    # extrapolation to the chapter's defaults (see the header); none at SMOKE sizes
    extra_s = 0.0
    if mode == "full" and stem == "05b_your_data" and "g05c" in durations:
        extra_s = 15 * 60 - 60 * train_minutes
    if mode == "full" and stem == "07_sampling":
        sampling = sum(float(r[2]) for r in record.get("fid_rows") or [] if isinstance(r, (list, tuple)))
        extra_s = sampling * (2000 / fid_samples - 1)
    row["wall_at_defaults_s"] = row["wall_s"] + extra_s
    rows[stem] = row
    print(f"   {row['wall_s']:.0f} s ({gpu_cells:.0f} s in GPU-track cells), peak {row['peak_allocated_gib']} GiB "
          f"allocated, nvidia-smi {row['nvidia_smi_peak_gib']} GiB; at the chapter's defaults ~{row['wall_at_defaults_s']:.0f} s",
          flush=True)
    save(rows, final=False)  # after each chapter: a run stopped at its time limit keeps what it measured
if smi is not None:
    smi.terminate()

print(save(rows, final=True))
if not dry or os.environ.get("OUT"):
    print(f"wrote {out_dir / (slug + '-gpu-track' + suffix + '.json')} and the .md beside it")
if any(r["error"] for r in rows.values()):
    sys.exit(1)
PY
