#!/usr/bin/env bash
# The chapters' GPU branch at SMOKE size on the GPU, in about 3 minutes: chapters 00, 01, 02, 05b and 07 executed
# with papermill as `make book` does, with TRACK = "gpu" and SMOKE = True, on tiny stand-ins for every download
# (benchmarks/gpu_track.sh --smoke), so that every GPU-track cell has run on a CUDA device before a reader meets it.
#
#   bash benchmarks/gpu_chapters_smoke.sh OUT             # on the GPU machine; OUT: a folder for the records (made)
#   bash benchmarks/gpu_chapters_smoke.sh --plan OUT      # print what it would run
#   bash benchmarks/gpu_chapters_smoke.sh --dry-run OUT   # on a CPU: the same chapters and stand-ins (checks the script)
#
# Expected on the GPU machine, and carried: as benchmarks/gpu_first_run.sh's header says; these chapters need the
# notebook-running stack and diffusers from the wheels of `make gpu-wheels` (installed first, the same way).
# Records under OUT: <gpu>-gpu-track-smoke.json and .md (rewritten after each chapter), chapters-smoke.log, and the
# executed notebook of each chapter that failed (with its outputs: the error is in it). Time limits: LIMIT (240 s)
# for the chapters together, CHAPTER_TIMEOUT (120 s) for one cell; CHAPTERS picks some.
set -uo pipefail
CALLER=$PWD
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO=$PWD

MODE=run
while [[ "${1:-}" == --* ]]; do
  case "$1" in
    --plan) MODE=plan ;;
    --dry-run) MODE=dry ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
if [ $# -ne 1 ]; then
  echo "usage: bash benchmarks/gpu_chapters_smoke.sh [--plan | --dry-run] OUT   (OUT: the folder for the records)" >&2
  exit 2
fi
OUT=$1
[ -n "$OUT" ] && [[ "$OUT" != /* ]] && OUT=$CALLER/$OUT  # relative to where it was called from
PYTHON=${PYTHON:-$(command -v python3 || command -v python)}
SITE=${FIRST_RUN_SITE:-${TMPDIR:-/tmp}/dit-first-run-site}
WORK=${WORK:-${TMPDIR:-/tmp}/dit-chapters-smoke}
LIMIT=${LIMIT:-240}
export PYTHON FIRST_RUN_SITE=$SITE CHAPTER_TIMEOUT=${CHAPTER_TIMEOUT:-120}
TRACK_MODE=--smoke
INSTALL=(bash benchmarks/gpu_first_run.sh --install-only)
if [ "$MODE" = dry ]; then
  TRACK_MODE=--dry-run
  INSTALL=(bash benchmarks/gpu_first_run.sh --dry-run --install-only)
fi

if [ "$MODE" = plan ]; then
  echo "gpu_chapters_smoke.sh (records under $OUT):"
  echo "  install  ${LIMIT_INSTALL:-45} s  ${INSTALL[*]}"
  echo "  chapters $LIMIT s  OUT=$OUT WORK=$WORK CHAPTER_TIMEOUT=$CHAPTER_TIMEOUT bash benchmarks/gpu_track.sh $TRACK_MODE"
  exit 0
fi

mkdir -p "$OUT"
LOG=$OUT/chapters-smoke.log
: >"$LOG"
start=$(date +%s)
echo "== install the carried wheels" | tee -a "$LOG"
"${INSTALL[@]}" 2>&1 | tee -a "$LOG"
if [ -d "$SITE" ]; then
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"  # what --install-only put there, for papermill's kernels too
fi
echo "== the chapters' GPU branch at SMOKE size (at most $LIMIT s)" | tee -a "$LOG"
rm -rf "$WORK/executed"
OUT=$OUT WORK=$WORK timeout -k 10 "$LIMIT" bash benchmarks/gpu_track.sh "$TRACK_MODE" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
# the executed notebooks of the chapters that failed, outputs and error included
"$PYTHON" - "$OUT" "$WORK" <<'PY' 2>&1 | tee -a "$LOG"
import json
import shutil
import sys
from pathlib import Path

out, work = Path(sys.argv[1]), Path(sys.argv[2])
records = sorted(out.glob("*-gpu-track*.json"))
chapters = json.loads(records[-1].read_text()).get("chapters", {}) if records else {}
for stem, row in chapters.items():
    executed = work / "executed" / f"{stem}.ipynb"
    if row.get("error") and executed.exists():
        shutil.copy(executed, out / f"{stem}.failed.ipynb")
        print(f"{stem} failed: {row['error']} (its executed notebook: {out / (stem + '.failed.ipynb')})")
PY
echo "== exit $rc after $(( $(date +%s) - start )) s; records: $(ls "$OUT" | tr '\n' ' ')" | tee -a "$LOG"
exit "$rc"
