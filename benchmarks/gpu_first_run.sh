#!/usr/bin/env bash
# The GPU path's first run on one GPU without internet, in at most 8 minutes on an H100, its records written as it
# goes: what the CPU machines cannot check (the CUDA tests, the small-card profiles under their card's memory, the
# training step and sampling of DiT-XL/2, the EMA's device and pinned-memory paths).
#
#   bash benchmarks/gpu_first_run.sh OUT              # on the GPU machine; OUT: a folder for the records (made)
#   bash benchmarks/gpu_first_run.sh --plan OUT       # print the parts, their commands and time limits; run nothing
#   bash benchmarks/gpu_first_run.sh --dry-run OUT    # on a CPU: every part at tiny size (checks this script)
#
# What the GPU machine is expected to have: Python (the version the wheels were fetched for: GPU_PYTHON_VERSION
# in the Makefile, 3.12 unless changed), PyTorch with CUDA, numpy, PyYAML and pytest, and the light dependencies
# of dit_core that a CUDA PyTorch image usually carries: Pillow, tqdm, safetensors, huggingface_hub, requests,
# scikit-learn, scipy, matplotlib. The install part names any of these that is missing.
# What must be carried: the wheels of `make gpu-wheels` (the folder .gpu-wheels/, ignored by git; WHEELS=DIR
# names another): bitsandbytes (8-bit AdamW of the rtx3060-12gb profile), diffusers (the VAE that makes the
# profiles' latents and runs in the official rung's loop) and what benchmarks/gpu_chapters_smoke.sh needs to run
# notebooks (papermill, nbclient, ipykernel, ipywidgets and their dependencies).
#
# The parts, in order, each with its own time limit in seconds (LIMIT_<PART>=S changes one), so that a hang costs
# one part, not the run; PARTS="tests ema" runs some of them:
#   install    45  each carried wheel whose package the interpreter lacks, with pip --no-index --no-deps into the
#                  interpreter (where that is refused, or on a dry run: into a folder put first on PYTHONPATH);
#                  then the carried packages and dit_core's dependencies are imported
#   tests      90  tests/test_cuda.py and tests/test_cuda_sampling.py (CUDA_TESTS="FILES" names others)
#   profiles  150  rtx3060-12gb, imagenette-b2 and imagenette-b2-fp16 under the allocator cap of their card, the
#                  GPU-track ones with the memory planner's setup for it, 20 steps each: peak memory, images/s
#                  (benchmarks/gpu_profiles.py)
#   ladder    120  DiT-XL/2's training step at batch 32: the official reference rung and the fastest rung, each in
#                  a fresh process: images/s, MFU, peak memory (benchmarks/gpu_speed.py)
#   sampling   40  DiT-XL/2 sampling: 50 guided DDPM steps timed, 16 images a batch, bf16: s/image, also scaled to
#                  250 steps (benchmarks/gpu_speed.py)
#   ema        35  the EMA update three ways on the GPU and the pinned memory of the EMA kept on the CPU
#                  (benchmarks/gpu_check.py --parts ema)
# Records under OUT, each rewritten as soon as its part ends (7 files): first-run.md (the summary to read),
# first-run.json (every part's exit status, time and output tail), first-run.log (all output), profiles.json,
# ladder.json, sampling.json, ema.json.
set -uo pipefail
CALLER=$PWD
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO=$PWD

MODE=run
INSTALL_ONLY=0
while [[ "${1:-}" == --* ]]; do
  case "$1" in
    --plan) MODE=plan ;;
    --dry-run) MODE=dry ;;
    --install-only) INSTALL_ONLY=1 ;;  # the install part alone, no records (benchmarks/gpu_chapters_smoke.sh)
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
if { [ "$INSTALL_ONLY" = 0 ] && [ $# -ne 1 ]; } || [ $# -gt 1 ]; then
  echo "usage: bash benchmarks/gpu_first_run.sh [--plan | --dry-run] OUT   (OUT: the folder for the records)" >&2
  exit 2
fi
OUT=${1:-}
[ -n "$OUT" ] && [[ "$OUT" != /* ]] && OUT=$CALLER/$OUT  # relative to where it was called from
PYTHON=${PYTHON:-$(command -v python3 || command -v python)}
WHEELS=${WHEELS:-$REPO/.gpu-wheels}
[[ "$WHEELS" != /* ]] && WHEELS=$CALLER/$WHEELS
SITE=${FIRST_RUN_SITE:-${TMPDIR:-/tmp}/dit-first-run-site}
PARTS=${PARTS:-install tests profiles ladder sampling ema}
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1

DRY=()
[ "$MODE" = dry ] && DRY=(--dry-run)

# name, time limit, command (quoted for bash -c)
declare -a NAMES LIMITS COMMANDS
add() {
  local name=$1 limit=$2
  shift 2
  local var="LIMIT_${name^^}"
  NAMES+=("$name")
  LIMITS+=("${!var:-$limit}")
  COMMANDS+=("$(printf '%q ' "$@")")
}
add install 45 install_wheels
read -ra CUDA_TESTS <<<"${CUDA_TESTS:-tests/test_cuda.py tests/test_cuda_sampling.py}"
add tests 90 "$PYTHON" -m pytest -q -rA -p no:cacheprovider "${CUDA_TESTS[@]}"
add profiles 150 "$PYTHON" benchmarks/gpu_profiles.py --profiles rtx3060-12gb imagenette-b2 imagenette-b2-fp16 \
  --steps "$([ "$MODE" = dry ] && echo 2 || echo 20)" --images 256 --timeout 75 --out "${TMPDIR:-/tmp}/dit-first-run-profiles" \
  --json "$OUT/profiles.json" "${DRY[@]}"
add ladder 120 "$PYTHON" benchmarks/gpu_speed.py --parts train --rungs official,fastest --batches 32 --large-batch 0 \
  --steps 4 --timeout 85 --record "$OUT/ladder.json" "${DRY[@]}"
add sampling 40 "$PYTHON" benchmarks/gpu_speed.py --parts sampling --sample-settings eager-b16 --sample-steps 50 \
  --timeout 30 --record "$OUT/sampling.json" "${DRY[@]}"
add ema 35 "$PYTHON" benchmarks/gpu_check.py --parts ema --record "$OUT/ema.json" "${DRY[@]}"

selected() { [[ " $PARTS " == *" $1 "* ]]; }

if [ "$MODE" = plan ]; then
  total=0
  echo "gpu_first_run.sh: the parts, in order (records under $OUT):"
  for i in "${!NAMES[@]}"; do
    selected "${NAMES[$i]}" || continue
    printf '  %-9s %4s s  %s\n' "${NAMES[$i]}" "${LIMITS[$i]}" "${COMMANDS[$i]}"
    total=$((total + LIMITS[i]))
  done
  echo "  time limits together: $total s"
  exit 0
fi

# The carried wheels: those whose distribution this interpreter lacks are installed (no index, no dependencies).
# It runs in a shell of its own under `timeout`, like every part; what it installs with --target (into $SITE) is
# put on PYTHONPATH for the later parts by the loop below.
install_wheels() {
  local missing
  if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    echo "no carried wheels in $WHEELS (make gpu-wheels fetches them): the parts that need bitsandbytes or diffusers report it"
    missing=""
  else
    missing=$("$PYTHON" - "$WHEELS" <<'PY'
import importlib.metadata as md
import sys
from pathlib import Path

for wheel in sorted(Path(sys.argv[1]).glob("*.whl")):
    try:
        md.distribution(wheel.name.split("-")[0])
    except md.PackageNotFoundError:
        print(wheel)
PY
)
  fi
  if [ -n "$missing" ]; then
    echo "installing $(echo "$missing" | wc -l) carried wheels (the others are installed already)"
    # shellcheck disable=SC2086
    if [ "$MODE" = dry ] || ! "$PYTHON" -m pip install -q --no-index --no-deps --no-compile $missing; then
      echo "into $SITE, put first on PYTHONPATH"
      rm -rf "$SITE"
      # shellcheck disable=SC2086
      "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" $missing || return 1
    fi
  fi
  local path=$PYTHONPATH
  [ -d "$SITE" ] && path="$SITE:$PYTHONPATH"
  PYTHONPATH=$path "$PYTHON" - "$WHEELS" <<'PY'
import importlib
import sys
import zipfile
from pathlib import Path

names = set()
for wheel in Path(sys.argv[1]).glob("*.whl"):
    with zipfile.ZipFile(wheel) as z:
        for entry in z.namelist():
            top = entry.split("/")[0]
            if "." in top.removesuffix(".py") or top.startswith("_"):  # metadata, data, vendored .libs, .pth
                continue
            if "/" in entry or top.endswith(".py"):
                names.add(top.removesuffix(".py"))
needed = ["torch", "numpy", "yaml", "pytest", "PIL", "tqdm", "safetensors", "huggingface_hub", "requests", "sklearn",
          "scipy", "matplotlib", "dit_core"]
failed = {}
for name in sorted(names) + needed:
    try:
        importlib.import_module(name)
    except Exception as err:  # noqa: BLE001 - report every one that does not import
        failed[name] = f"{type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}"
print(f"carried and needed packages importable: {len(names) + len(needed) - len(failed)} of {len(names) + len(needed)}")
for name, why in failed.items():
    print(f"  NOT importable: {name} ({why})")
sys.exit(1 if set(failed) & {"torch", "numpy", "yaml", "pytest", "dit_core"} else 0)
PY
}

export MODE WHEELS SITE PYTHON
export -f install_wheels
if [ "$INSTALL_ONLY" = 1 ]; then
  rm -rf "$SITE"
  timeout -k 10 "${LIMIT_INSTALL:-45}" bash -c install_wheels
  exit
fi

mkdir -p "$OUT"
rm -f "$OUT"/{first-run.md,first-run.json,first-run.log,profiles.json,ladder.json,sampling.json,ema.json}
LOG=$OUT/first-run.log
: >"$LOG"
PART_OUT=$(mktemp)
trap 'rm -f "$PART_OUT"' EXIT

# After each part: first-run.json gets the part's status, time and output tail; first-run.md is rendered again.
summarize() {
  "$PYTHON" - "$OUT" "$@" <<'PY'
import json
import sys
import time
from pathlib import Path

out, name, rc, wall, limit, command, part_out = sys.argv[1:8]
out = Path(out)
path = out / "first-run.json"
record = json.loads(path.read_text()) if path.exists() else {"parts": {}}
if name == "machine":
    record["machine"] = json.loads(Path(part_out).read_text())
else:
    rc = int(rc)
    status = "ok" if rc == 0 else (f"timed out after {limit} s" if rc in (124, 137) else f"failed (exit {rc})")
    tail = Path(part_out).read_text(errors="replace").splitlines()[-40:]
    record["parts"][name] = {"status": status, "exit": rc, "wall_s": float(wall), "limit_s": int(limit),
                             "command": command, "tail": tail}
path.write_text(json.dumps(record, indent=1))

m = record.get("machine", {})
lines = [f"# First GPU run on {m.get('gpu', '?')}", "",
         f"`bash benchmarks/gpu_first_run.sh{' --dry-run' if m.get('dry_run') else ''} OUT` on {m.get('date', '?')}: "
         f"torch {m.get('torch', '?')} (CUDA {m.get('cuda') or '-'}), Python {m.get('python', '?')}, nvidia-smi: "
         f"{m.get('driver') or '-'}" + (" (DRY RUN on a CPU: tiny sizes, no figure means anything)" if m.get("dry_run") else "")
         + ".", "", "| part | status | seconds | limit |", "| --- | --- | ---: | ---: |"]
for part, r in record["parts"].items():
    lines.append(f"| {part} | {r['status']} | {r['wall_s']:.0f} | {r['limit_s']} |")
tables = {"profiles": "profiles.json", "ladder": "ladder.json", "sampling": "sampling.json", "ema": "ema.json"}
for part, r in record["parts"].items():
    lines += ["", f"## {part}", "", f"`{r['command']}`", ""]
    data = None
    if part in tables and (out / tables[part]).exists():
        data = json.loads((out / tables[part]).read_text())
    table = (data or {}).get("table") or ((data or {}).get("ema") or {}).get("table")
    if table and "```" in table:  # already markdown (benchmarks/gpu_speed.py): its sections, one level down
        lines += ["#" + line if line.startswith("#") else line for line in table.strip("\n").splitlines()
                  if not line.startswith("# ")]
    elif table:
        lines += ["```", table.strip("\n"), "```"]
    else:  # the end of the part's output: the tests' summary, or what went wrong
        lines += ["```", *r["tail"][-15:], "```"]
(out / "first-run.md").write_text("\n".join(lines) + "\n")
PY
}

# The machine, first: what the record is about.
"$PYTHON" - >"$PART_OUT" 2>>"$LOG" <<'PY'
import json, platform, shutil, subprocess, sys, time

import torch

driver = None
if shutil.which("nvidia-smi"):
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=20).stdout.strip() or None
    except Exception:  # noqa: BLE001
        driver = None
cuda = torch.cuda.is_available()
print(json.dumps({"gpu": torch.cuda.get_device_name(0) if cuda else "no CUDA device (CPU)", "torch": torch.__version__,
                  "cuda": torch.version.cuda, "python": platform.python_version(), "driver": driver,
                  "date": time.strftime("%Y-%m-%d %H:%M"), "cpus": __import__("os").cpu_count()}))
PY
if [ "$MODE" = dry ]; then
  "$PYTHON" -c 'import json, sys; d = json.load(open(sys.argv[1])); d["dry_run"] = True; json.dump(d, open(sys.argv[1], "w"))' "$PART_OUT"
elif ! "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu_first_run.sh needs a CUDA GPU; --dry-run checks the script on a CPU, --plan prints what it would run" >&2
  exit 1
fi
rm -f "$OUT/first-run.json"
summarize machine 0 0 0 "" "$PART_OUT"
head -3 "$OUT/first-run.md"

start=$(date +%s)
for i in "${!NAMES[@]}"; do
  name=${NAMES[$i]}
  selected "$name" || continue
  limit=${LIMITS[$i]}
  echo "== $name (at most $limit s): ${COMMANDS[$i]}" | tee -a "$LOG"
  [ "$name" = install ] && rm -rf "$SITE"
  t0=$(date +%s%N)
  timeout -k 10 "$limit" bash -c "${COMMANDS[$i]}" 2>&1 | tee -a "$LOG" >"$PART_OUT"
  rc=${PIPESTATUS[0]}
  wall=$(( ($(date +%s%N) - t0) / 1000000 ))
  wall=$((wall / 1000)).$(printf '%03d' $((wall % 1000)))
  cat "$PART_OUT"
  if [ "$name" = install ] && [ -d "$SITE" ]; then
    export PYTHONPATH="$SITE:$PYTHONPATH"  # the carried packages, for every later part and its processes
  fi
  summarize "$name" "$rc" "$wall" "$limit" "${COMMANDS[$i]}" "$PART_OUT"
  echo "== $name: exit $rc, $wall s" | tee -a "$LOG"
done
echo "all parts in $(( $(date +%s) - start )) s; records: $(ls "$OUT" | tr '\n' ' ')" | tee -a "$LOG"
