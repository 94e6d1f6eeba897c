"""The own-images study: does the `small-images` profile learn folders it was not tuned on?

Record: ``benchmarks/results/own-images.md`` (with ``own-images.json``). The bench is :mod:`dit_core.data.bench`
(glyphs, shapes, textures; any seed); each folder's judge is :mod:`dit_core.eval.bench` (fitted on another seed's
files, prepared as the run prepares them). A run trains a profile at its defaults for a fixed number of steps (no
time budget, so a loaded machine trains the same run), keeps its checkpoints at :data:`KEEP` steps, and scores each
with the run's own sampling settings: the guidance the run chose (``guidance.json``) or the profile's constant
scale. Runs and scores are resumable: a killed command continues where it stopped.

The held-out folders (:data:`HELD_OUT`) were fixed, with this script, before any setting was tuned; tuning used
other seeds (:data:`TUNE_SEEDS`). They are scored once, at the end, for both profiles:

- ``old``: the profile as it was before the folder decided flips, crop and guidance
  (``benchmarks/own_images_old_profile.yaml``, a copy of ``dit_core/configs/small-images.yaml`` at 541b631);
- ``new``: ``dit_core/configs/small-images.yaml``.

Commands (one thread per run; run two side by side on two cores)::

    python benchmarks/own_images.py run --profile new --kind glyphs --folder-seed 0 --seed 0 [--set key=value ...]
    python benchmarks/own_images.py heldout --profile old --seeds 0,1,2 [--train-only]
    python benchmarks/own_images.py score --profile old --kind glyphs --folder-seed 101 --seed 0
    python benchmarks/own_images.py table [--name new] [--folders heldout]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: The held-out folders: one per kind, scored once at the end. Never tune on these seeds.
HELD_OUT = {"glyphs": 101, "shapes": 102, "textures": 103}
#: Folder seeds that tuning may use.
TUNE_SEEDS = (0, 1, 2)
#: Training seeds of the held-out runs.
SEEDS = (0, 1, 2)
#: Steps at which checkpoints are kept and scored (the last one is the run's length).
KEEP = (600, 1200, 2450, 5000)
PROFILES = {"old": str(REPO / "benchmarks" / "own_images_old_profile.yaml"), "new": "small-images"}
#: Samples a class for each score (the same noise for every checkpoint and profile).
PER_CLASS = 50
SAMPLE_SEED = 0
WORK = os.environ.get("OWN_IMAGES_WORK", "/tmp/own-images")


def folder(kind: str, seed: int, work: Path) -> Path:
    from dit_core.data.bench import generate_bench

    return generate_bench(work / "data" / f"{kind}-s{seed}", kind, seed=seed)


def run_dir(name: str, kind: str, folder_seed: int, seed: int, work: Path) -> Path:
    return work / "runs" / name / f"{kind}-s{folder_seed}" / f"seed{seed}"


def result_path(name: str, kind: str, folder_seed: int, seed: int, work: Path) -> Path:
    return work / "results" / name / f"{kind}-s{folder_seed}-seed{seed}.json"


def parse_sets(items) -> dict:
    out = {}
    for item in items or []:
        key, _, value = item.partition("=")
        if not _:
            raise SystemExit(f"--set takes key=value, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def _prune(ckpts: Path, keep: set, stop: threading.Event) -> None:
    """Delete the kept checkpoints the study does not score, while the run writes them (each is written whole
    and renamed into place, so a finished file is safe to delete)."""
    while not stop.wait(5.0):
        _prune_now(ckpts, keep)


def train_run(profile: str, kind: str, folder_seed: int, seed: int, work: Path, name: str, steps: int,
              sets: dict) -> Path:
    """Train one run (resumed when its folder holds one); returns its folder."""
    from dit_core.train import make_config, train

    out = run_dir(name, kind, folder_seed, seed, work)
    keep = {s for s in KEEP if s <= steps} | {steps}
    summary_file = out / "summary.json"
    if summary_file.is_file() and json.loads(summary_file.read_text()).get("steps") == steps and \
            all((out / "checkpoints" / f"step_{s:07d}.pt").is_file() for s in keep):
        config = json.loads(json.dumps(__import__("yaml").safe_load((out / "config.yaml").read_text())))
        if config.get("guidance_search") and not (out / "guidance.json").is_file():  # trained, not yet chosen
            from dit_core.eval.guidance import choose_guidance

            choose_guidance(out)
        return out
    data = folder(kind, folder_seed, work)
    cfg = make_config(PROFILES.get(profile, profile), {
        "data_path": str(data), "out": str(out), "seed": seed, "max_steps": steps, "max_minutes": 0,
        "ckpt_every": 50, "keep_every": 50, "log_every": 50, "sample_every": 0, "sample_at_end": True,
        "sample_per_class": 8, "tensorboard": False, "progress": False, "resume": "auto", "cpu_processes": 1,
        **sets})
    out.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    pruner = threading.Thread(target=_prune, args=(out / "checkpoints", keep, stop), daemon=True)
    pruner.start()
    try:
        summary = train(cfg)
    finally:
        stop.set()
        pruner.join()
        _prune_now(out / "checkpoints", keep)
    if summary.get("interrupted"):
        raise KeyboardInterrupt(f"{out}: interrupted at step {summary.get('steps')}; run again to resume")
    return out


def _prune_now(ckpts: Path, keep: set) -> None:
    for path in ckpts.glob("step_*.pt"):
        if int(path.stem.split("_")[1]) not in keep:
            path.unlink(missing_ok=True)


def score_run(out: Path, kind: str, result: Path, also_constant: float | None = 2.0) -> dict:
    """Score every kept checkpoint of the run in ``out`` with its bench judge; written to ``result`` as it goes."""
    import torch

    from dit_core.atomic import atomic_write_text
    from dit_core.diffusion import process_of
    from dit_core.eval import bench
    from dit_core.eval.classwise import sample_and_score
    from dit_core.sample import load_model

    record = json.loads(result.read_text()) if result.is_file() else {}
    config = torch.load(out / "checkpoints" / "last.pt", map_location="cpu", weights_only=True, mmap=True)["config"]
    size, crop = config["sample_shape"][-1], config.get("crop", "adm")
    judge = bench.judge(kind, size, crop)
    record.update(kind=kind, run=str(out), image_size=size, crop=crop, flip=config.get("flip"),
                  precision=config.get("precision"), ceiling=judge.val_accuracy,
                  judge_mirror_accuracy=judge.mirror_accuracy, real_mirrored_rate=judge.real_mirrored_rate,
                  real_frame_rate=judge.real_frame_rate, judge_seconds=judge.seconds)
    for extra in ("probe.json", "guidance.json", "summary.json"):
        if (out / extra).is_file():
            record[extra.split(".")[0]] = json.loads((out / extra).read_text())
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    record["steps_per_s"] = [[m["step"], m.get("steps_per_s")] for m in metrics if m.get("steps_per_s")]
    scores = record.setdefault("scores", {})
    settings = []
    for path in sorted((out / "checkpoints").glob("step_*.pt")):
        settings.append((path, None))
        if also_constant is not None and (out / "guidance.json").is_file() and path == max(
                (out / "checkpoints").glob("step_*.pt")):
            settings.append((path, also_constant))
    for path, constant in settings:
        key = path.stem.split("_")[1].lstrip("0") + ("" if constant is None else f"@cfg{constant:g}")
        if key in scores and "empty_rate" in scores[key]:
            continue
        model, info = load_model(path)
        scale = info.get("cfg_scale") if constant is None else constant
        interval = info.get("guidance_interval") if constant is None else None
        started = time.perf_counter()
        with torch.random.fork_rng(devices=[]):
            out_ = sample_and_score(model, process_of(info, model.learn_sigma), judge, class_names=info["label_names"],
                                    per_class=PER_CLASS, cfg_scale=scale, sampler=info["sampler"],
                                    steps=info["steps"], seed=SAMPLE_SEED, amp="auto", guidance_interval=interval)
        extra = bench.score(out_["images"], out_["judge_labels"], judge)
        scores[key] = {"step": int(path.stem.split("_")[1]), "cfg_scale": scale, "interval": interval,
                       "class_accuracy": extra["class_accuracy"], "per_class": extra["per_class_accuracy"],
                       "mirrored_rate": extra["mirrored_rate"], "mirrored_per_class": extra["mirrored_rate_per_class"],
                       "frame_rate": extra["frame_rate"], "empty_rate": extra["empty_rate"],
                       "mirrored_rate_drawn": extra["mirrored_rate_drawn"], "real_empty_rate": extra["real_empty_rate"],
                       "frechet_distance": extra["frechet_distance"],
                       "real_floor": extra["real_floor"], "samples": len(out_["images"]),
                       "seconds": round(time.perf_counter() - started, 1)}
        result.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(result, json.dumps(record, indent=1) + "\n")
        print(f"{result.name} {key}: {scores[key]['class_accuracy']:.1%} right, mirrored "
              f"{scores[key]['mirrored_rate']:.1%}, frame {scores[key]['frame_rate']:.1%}", flush=True)
    atomic_write_text(result, json.dumps(record, indent=1) + "\n")
    return record


def one(args, kind, folder_seed, seed) -> None:
    work = Path(args.work)
    name = args.name or args.profile
    out = train_run(args.profile, kind, folder_seed, seed, work, name, args.steps, parse_sets(args.set))
    if not args.train_only:
        score_run(out, kind, result_path(name, kind, folder_seed, seed, work))


def _groups(runs, folders: str) -> dict:
    """``{(folder, profile): [run, ...]}`` of :func:`summary_json`'s runs, folders "heldout", "tune" or "all"."""
    out: dict = {}
    for r in runs:
        if folders == "all" or (folders == "heldout") == r["held_out"]:
            out.setdefault((f"{r['kind']}-s{r['folder_seed']}", r["profile"]), []).append(r)
    return out


def _mean(values, scale: float = 100.0) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    mean = scale * sum(values) / len(values)
    return f"{mean:.1f} %" if len(values) == 1 else \
        f"{mean:.1f} % ({scale * min(values):.0f}-{scale * max(values):.0f})"


def table(runs, folders: str = "heldout") -> str:
    """Two markdown tables of :func:`summary_json`'s runs: the share of samples right at each kept step (mean over
    the training seeds, range in brackets) beside the judge's ceiling; and at the last step, per class, the mirrored,
    frame and empty rates beside the data's own, the guidance each run chose and the score at constant guidance 2."""
    last = str(KEEP[-1])
    acc = ["| folder | profile | judge's ceiling | " + " | ".join(f"{s:,} steps" for s in KEEP) + " |",
           "|---" * (3 + len(KEEP)) + "|"]
    end = ["| folder | profile | per class at 5,000 steps | mirrored (data) | mirrored, drawn samples | touching the "
           "frame (data) | empty | guidance | at constant 2 |", "|---" * 9 + "|"]
    for (f, name), rs in sorted(_groups(runs, folders).items()):
        seeds = f"{name} ({len(rs)} seed{'s' if len(rs) > 1 else ''})"
        acc.append(f"| {f} | {seeds} | {100 * rs[0]['ceiling']:.1f} % | "
                   + " | ".join(_mean([r['scores'].get(str(s), {}).get('class_accuracy') for r in rs]) for s in KEEP)
                   + " |")
        at = [r["scores"][last] for r in rs if last in r.get("scores", {})]
        if not at:
            continue
        classes = list(at[0]["per_class"])
        per_class = ", ".join(f"{c} {100 * sum(a['per_class'][c] for a in at) / len(at):.0f}" for c in classes)
        chosen = [((r.get("guidance") or {}).get("chosen")) for r in rs]
        guide = "; ".join(sorted({f"{c['cfg_scale']:g}" + (f" t<={c['interval'][1]:g}" if c['interval'] else "")
                                  for c in chosen if c})) or "2 (constant)"
        const = [r["scores"].get(f"{last}@cfg2", {}).get("class_accuracy") for r in rs]
        end.append(f"| {f} | {seeds} | {per_class} % | {_mean([a['mirrored_rate'] for a in at])} "
                   f"({100 * rs[0]['real_mirrored_rate']:.1f} %) | {_mean([a.get('mirrored_rate_drawn') for a in at])} | "
                   f"{_mean([a['frame_rate'] for a in at])} ({100 * rs[0]['real_frame_rate']:.1f} %) | "
                   f"{_mean([a.get('empty_rate') for a in at])} | {guide} | {_mean(const)} |")
    return "\n".join(acc) + "\n\n" + "\n".join(end)


def summary_json(work: Path, names) -> dict:
    """Every scored run of ``names`` as the record's JSON keeps it: the scores at each kept step, the judge's own
    figures, the probe's and the guidance search's decisions, the training time."""
    runs = []
    for name in names:
        for path in sorted((work / "results" / name).glob("*.json")):
            r = json.loads(path.read_text())
            folder, seed = path.stem.rsplit("-seed", 1)
            kind, fseed = folder.rsplit("-s", 1)
            probe, guidance = r.get("probe") or {}, r.get("guidance") or {}
            runs.append({
                "profile": name, "kind": kind, "folder_seed": int(fseed), "seed": int(seed),
                "held_out": HELD_OUT.get(kind) == int(fseed), "image_size": r["image_size"], "crop": r["crop"],
                "flip": r["flip"], "precision": r["precision"], "ceiling": r["ceiling"],
                "judge_mirror_accuracy": r["judge_mirror_accuracy"], "real_mirrored_rate": r["real_mirrored_rate"],
                "real_frame_rate": r["real_frame_rate"],
                "train_seconds": (r.get("summary") or {}).get("train_seconds"),
                "probe": {k: probe.get(k) for k in ("mirror", "mirror_tested", "flipped", "centre_cut", "object_size",
                                                     "seconds")} if probe else None,
                "guidance": {"chosen": guidance.get("chosen"), "ceiling": guidance.get("ceiling"),
                             "seconds": guidance.get("seconds"),
                             "candidates": [{k: c[k] for k in ("cfg_scale", "interval", "accuracy", "spread",
                                                               "frechet_distance")}
                                            for c in guidance.get("candidates", [])]} if guidance else None,
                "scores": r.get("scores", {})})
    return {"record": "own-images.md", "held_out": HELD_OUT, "tune_seeds": list(TUNE_SEEDS), "keep": list(KEEP),
            "per_class": PER_CLASS, "runs": runs}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    for cmd in ("run", "score", "heldout"):
        c = sub.add_parser(cmd)
        c.add_argument("--profile", default="new", help="old, new, or a profile name or YAML file")
        c.add_argument("--name", default=None, help="the runs' name in the work folder (default: the profile)")
        c.add_argument("--steps", type=int, default=KEEP[-1])
        c.add_argument("--set", action="append", help="a setting changed for a tuning run, key=value")
        c.add_argument("--train-only", action="store_true", help="train (or resume), score later")
        c.add_argument("--work", default=WORK)
        if cmd == "heldout":
            c.add_argument("--seeds", default=",".join(str(s) for s in SEEDS))
            c.add_argument("--kinds", default=",".join(HELD_OUT))
        else:
            c.add_argument("--kind", required=True)
            c.add_argument("--folder-seed", type=int, required=True)
            c.add_argument("--seed", type=int, default=0)
    t = sub.add_parser("table")
    t.add_argument("--name", action="append", default=None)
    t.add_argument("--folders", choices=("heldout", "tune", "all"), default="heldout")
    t.add_argument("--work", default=WORK)
    t.add_argument("--json", default=None, help="also write every scored run to this JSON file (the record's)")
    args = p.parse_args(argv)
    if args.command == "table":
        names = args.name or ["old", "new"]
        summary = summary_json(Path(args.work), names)
        print(table(summary["runs"], args.folders))
        if args.json:
            from dit_core.atomic import atomic_write_text

            atomic_write_text(args.json, json.dumps(summary, indent=1) + "\n")
        return 0
    if args.command == "heldout":
        for kind in args.kinds.split(","):
            for seed in (int(s) for s in args.seeds.split(",")):
                one(args, kind, HELD_OUT[kind], seed)
        return 0
    if args.folder_seed in HELD_OUT.values() and args.command == "run" and args.name not in (None, "old", "new"):
        print(f"folder seed {args.folder_seed} is held out: tune on {TUNE_SEEDS}", file=sys.stderr)
        return 2
    if args.command == "score":
        name = args.name or args.profile
        work = Path(args.work)
        score_run(run_dir(name, args.kind, args.folder_seed, args.seed, work), args.kind,
                  result_path(name, args.kind, args.folder_seed, args.seed, work))
        return 0
    one(args, args.kind, args.folder_seed, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
