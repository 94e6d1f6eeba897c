"""Add the "x official" ratios to a recorded ladder that measured the strict step but not the reference step.

The ladder's reference is ``official``: the step of the official ``train.py`` as it runs (fp32 with TF32, which
it turns on at its first lines, fused attention through timm's ``Attention``, the VAE in the loop); the strict
step is ``official-fp32`` (TF32 off, explicit attention; :mod:`dit_core.measure.bench.rungs`). Ratios against the
strict step alone would count TF32 as one of this library's tricks. For a recorded run that measured only the
strict step, the reference's time is derived from rungs of the same run, and every derived figure says so:

* on a GPU: the ``tf32`` rung (fp32 with TF32, VAE in the loop, the trainer's step with explicit attention),
  whose attention and step details changed fp32 steps by about 1 % in the same run (``sdpa`` vs ``baseline``,
  ``baseline`` vs the strict official step);
* on a CPU (no TF32): the strict official step times the ratio of the ``sdpa`` rung to the ``baseline`` rung
  (the effect of fused attention, measured in the same run).

Each row keeps ``speedup_vs_official_fp32`` (against the strict step, measured) and gets
``speedup_vs_official`` (against the derived reference, marked ``official_derived``).

    python benchmarks/rebase_official.py benchmarks/results/nvidia-h200-dit-xl2.json ...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

STRICT_LABEL = "official step, strict fp32 (no TF32, math)"


def reference_seconds(result: dict) -> tuple[float, str]:
    """The derived step time of the official reference, and how it was derived."""
    rows = {r["rung"]: r for r in result["rows"] if r.get("status") == "ok"}
    if "tf32" in rows:
        return rows["tf32"]["step_s_median"], "the TF32 rung of the same run (fp32 + TF32, VAE in the loop)"
    strict, sdpa, base = (rows[k]["step_s_median"] for k in ("official-fp32", "sdpa", "baseline"))
    return strict * sdpa / base, "the strict step x (sdpa rung / baseline rung) of the same run (no TF32 on a CPU)"


def rebase(result: dict, extra_rows: list[dict] = ()) -> str:
    """Rename the strict reference and derive the ratios against train.py's step, in place; returns the how."""
    for row in result["rows"]:
        if row["rung"] == "official" and row.get("label") != STRICT_LABEL and not row.get("rebased"):
            row.update(rung="official-fp32", label=STRICT_LABEL, rebased=True)
    t_ref, how = reference_seconds(result)
    images = result["spec"]["batch_size"] * result["spec"].get("grad_accum", 1)
    for row in list(result["rows"]) + list(extra_rows):
        if row.get("status") != "ok":
            continue
        if "speedup_vs_official" in row and "speedup_vs_official_fp32" not in row:
            row["speedup_vs_official_fp32"] = row.pop("speedup_vs_official")
        # per image, so that rows of another batch (the planner's choice) compare too
        row["speedup_vs_official"] = row["images_per_s"] / (images / t_ref)
        row["official_derived"] = how
    return how


def main(paths: list[str]) -> None:
    for name in paths:
        path = Path(name)
        data = json.loads(path.read_text())
        results = data["results"] if "results" in data else [data]
        for result in results:
            how = rebase(result, data.get("planner_choice", []) if result is results[0] else [])
        note = (f"x official: against the official train.py step (fp32 arithmetic with TF32 where the GPU has it, "
                f"fused attention, VAE in the loop), which this run did not measure; its time is derived from {how} (marked ~). The measured strict-fp32 step "
                f"(TF32 off) is the row '{STRICT_LABEL}'.")
        old = data.get("note", "").split("x official:")[0].strip()
        data["note"] = f"{old}\n{note}" if old else note
        path.write_text(json.dumps(data, indent=1) + "\n")
        print(f"{path}: {how}")


if __name__ == "__main__":
    main(sys.argv[1:])
