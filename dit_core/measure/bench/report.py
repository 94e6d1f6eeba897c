"""The benchmark's results as text: the ladder's table, a summary of several runs, a recorded file, one row.

Results are plain data (``dit-bench --json``, ``benchmarks/results/*.json``); chapter 06 prints the recorded
GPU runs with :func:`format_record` and checks the planner against them with :func:`recheck_planner`.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

from ...atomic import atomic_write_text
from .. import memory
from .rungs import BenchSpec, as_rung, model_shape, rung_setup


def ratio_text(row: dict, missing: str = "nan") -> str:
    """The row's speed-up over the official step; ``~`` marks one whose reference time was derived, not
    measured in the run (``benchmarks/rebase_official.py``)."""
    ratio = row.get("speedup_vs_official")
    if ratio is None:
        return missing
    return ("~" if row.get("official_derived") else "") + f"{ratio:.2f}"


def row_summary(row: dict) -> str:
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
    plan = result.get("plan")
    if plan and plan.get("card_gib") is not None:
        lines += [n for n in plan["notes"] if not n.startswith("runs ")]
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
        base = f"{r['speedup_vs_baseline']:.2f}" if r.get("speedup_vs_baseline") is not None else "-"
        line = (f"{r['label']:<44}{r['step_s_median'] * 1e3:>10.1f}{r.get('step_s_min', float('nan')) * 1e3:>10.1f}"
                f"{r['images_per_s']:>9.2f}{ratio_text(r, '-'):>11}{base:>8}"
                f"{fmt(r.get('peak_bytes')):>12}")
        if gpu:
            line += f"{fmt(r.get('planned_peak_bytes')):>11}{r.get('mfu', float('nan')):>7.1%}"
        else:
            line += f"{fmt(r.get('tensor_peak_bytes')):>11}{fmt(r.get('planned_peak_bytes')):>11}"
        lines.append(line)
    by_key = {r["rung"]: r for r in result["rows"]}
    for ref, name in (("official", "x official"), ("baseline", "x base")):
        if ref in by_key and by_key[ref].get("status") != "ok":
            lines.append(f"'{name}': no ratio, the {ref} rung did not run ({by_key[ref].get('status')})")
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
    time, throughput, speed-up over the official step (TF32 on, as train.py), measured and planned peak memory, MFU."""
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
        lines.append(f"{batch:>5}  {row['label']:<44}{row['step_s_median'] * 1e3:>10.1f}{row['images_per_s']:>9.2f}"
                     f"{ratio_text(row, '-'):>11}{gib(meas):>12}{gib(row.get('planned_peak_bytes')):>10}"
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


def format_record(data: dict) -> str:
    """A recorded benchmark file (``benchmarks/results/*.json``) as its table: a ladder (``dit-bench --json``,
    ``benchmarks/gpu_ladder.sh``) or a file that carries its own ``table`` (the planner check, the profiles)."""
    if "results" in data:
        text = format_summary(data["results"], data.get("planner_choice", []))
    elif "table" in data:
        text = data["table"]
    elif "rows" in data and "environment" in data:
        text = format_summary([data], [])
    else:
        raise ValueError(f"not a benchmark record (no 'results', 'table' or ladder 'rows'; keys: "
                         f"{', '.join(sorted(data)[:8])}): format_record prints dit-bench's and the GPU scripts' files")
    return text + (f"\nnote: {data['note']}" if data.get("note") else "")


def recheck_planner(data: dict, cards_gib=(12, 24)) -> list[dict]:
    """Every measured row of a recorded GPU ladder (``dit-bench --json``, ``benchmarks/gpu_ladder.sh``) against
    the planner as it is: the measured peak (``max_memory_allocated``), the peak predicted for the rung's step,
    the error, whether the VAE encoder ran in the loop, and for each card of ``cards_gib`` whether the
    *measured* peak fits the planner's budget for that card (:func:`memory.card_budget`)."""
    out = []
    runs = data["results"] if "results" in data else [data]
    for run in runs:
        spec = BenchSpec(**{k: v for k, v in run["spec"].items() if k in BenchSpec.__dataclass_fields__})
        device = run["environment"]["device"]
        for row in list(run["rows"]) + list(data.get("planner_choice", []) if run is runs[0] else []):
            if row.get("status") != "ok" or not row.get("peak_bytes") or "tricks" not in row:
                continue
            rung = as_rung(dict(key=row["rung"], label=row["label"], **row["tricks"]))
            batch = row.get("batch_size", spec.batch_size)
            accum = row.get("grad_accum", spec.grad_accum)
            s = replace(spec, batch_size=batch, grad_accum=accum)
            setup = rung_setup(s, rung, device, row.get("precision"))
            planned = memory.estimate(model_shape(s), setup).peak
            measured = row["peak_bytes"]
            out.append(dict(rung=row["rung"], label=row["label"], batch=batch, vae_in_loop=setup.vae_in_loop,
                            precision=setup.precision, tf32=bool(row["tricks"].get("tf32")), measured=measured,
                            planned=planned, error=memory.relative_error(planned, measured),
                            fits={c: measured <= memory.card_budget(c) for c in cards_gib}))
    return out

