"""Converging faster, measured: steps (and seconds) to 95 % class accuracy and to a Fréchet distance, per method.

    python benchmarks/convergence.py                    # the full grid: ~ hours on one thread per run (--estimate)
    python benchmarks/convergence.py --jobs 4           # 4 runs at a time, one thread each (an idle 4-core machine)
    python benchmarks/convergence.py --quick            # smoke test: tiny budgets, 3 methods, 1 seed (minutes)
    python benchmarks/convergence.py --estimate         # time a few steps of every method, project the full run
    python benchmarks/convergence.py --datasets digits --methods dit,flow --seeds 1    # one pair
    python benchmarks/convergence.py --datasets shapes --jobs 2 --max-steps 1000 --eval-every 250 \
        --per-class 50 --eval-steps 25         # the committed shapes grid: a smaller budget (2-core machine)

For each dataset (the digits profile; the small-images profile on a generated shapes folder) and each method
of :data:`dit_book.convergence.METHODS` (DiT's recipe ``dit``, ``flow``, ``logit_normal``,
``min_snr``, ``mask``, ``repa``), then the best combination (``best``: every single method that beat DiT's
steps to 95 %, joined; chosen from the single runs' records), with seeds 0, 1, 2: train for the profile's
budget with the real trainer, score the EMA model every ``eval_every`` steps with the dataset's judge, and
record class accuracy and Fréchet distance against steps and training seconds
(:func:`dit_book.convergence.run_one`). Every method gets the same steps, batch and schedule.

Resumable: each (dataset, method, seed) run keeps its state under ``--work`` (default ``runs/convergence``) and
writes its record atomically when complete; a killed benchmark started again continues. After every run
``benchmarks/results/convergence-<dataset>.json`` is rewritten (atomically) with all records so far, the
summary and the table, which is also printed at the end. ``--quick`` writes under ``--work`` instead.

Threads: every run uses one thread (``torch.set_num_threads(1)``), also with ``--jobs``, so that seconds are
comparable between methods; run it on an otherwise idle machine, since the seconds are part of the record.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dit_core.atomic import atomic_write_text  # noqa: E402
from dit_book import convergence as conv  # noqa: E402
from dit_book import study  # noqa: E402

SINGLES = list(conv.METHODS)
QUICK = {  # tiny budgets: every code path of the full run, in minutes
    "digits": dict(max_steps=60, eval_every=20, per_class=5, eval_steps=10),
    "shapes": dict(max_steps=40, eval_every=20, per_class=5, eval_steps=10),
}


def write_results(path: Path, dataset: str, records: list[dict], settings: dict) -> str:
    rows = conv.summarize(records)
    table = conv.format_table(rows)
    data = {"dataset": dataset, "settings": settings, "environment": study.environment(), "runs": records,
            "summary": rows, "table": table}
    atomic_write_text(path, json.dumps(data, indent=1, default=str) + "\n")
    return table


def run_grid(args) -> int:
    work = Path(args.work)
    results = work if args.quick else Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    seeds = list(range(args.seeds))
    for dataset in args.datasets:
        kw = dict(QUICK[dataset]) if args.quick else {}
        for key in ("max_steps", "eval_every", "per_class", "eval_steps"):
            if getattr(args, key):
                kw[key] = getattr(args, key)
        singles = [m for m in args.methods if m != "best"]
        path = results / f"convergence-{dataset}{'-quick' if args.quick else ''}.json"
        settings = {"methods": {m: conv.config_overrides(m, kw.get("max_steps", 0) or 1) for m in singles},
                    "seeds": seeds, "dataset": conv.DATASETS[dataset], "overrides": kw, "quick": args.quick}
        records = _execute([dict(dataset=dataset, method=m, seed=s, work=str(work), kw=kw)
                            for m in singles for s in seeds], args.jobs, path, dataset, settings, [])
        if "best" in args.methods:
            best = conv.best_combination(records)
            print(f"{dataset}: the best combination is {best}", flush=True)
            settings["best"] = best
            if best not in singles:
                records = _execute([dict(dataset=dataset, method=best, seed=s, work=str(work), kw=kw) for s in seeds],
                                   args.jobs, path, dataset, settings, records)
        print(f"\n{dataset} ({path}):\n{write_results(path, dataset, records, settings)}\n", flush=True)
    return 0


def _execute(jobs: list[dict], n: int, path: Path, dataset: str, settings: dict, records: list[dict]) -> list[dict]:
    records = list(records)

    def done(record):
        records.append(record)
        records.sort(key=lambda r: (r["method"], r["seed"]))
        write_results(path, dataset, records, settings)
        reached = conv.first_reaching(record["evals"], "class_accuracy", conv.ACCURACY_TARGET)
        print(f"  {dataset} {record['method']} seed {record['seed']}: {conv.ACCURACY_TARGET:.0%} at step "
              f"{reached['step'] if reached else '> ' + str(record['max_steps'])}, final accuracy "
              f"{record['evals'][-1]['class_accuracy']:.1%}, FD {record['evals'][-1]['frechet_distance']:.2f}, "
              f"{record['train_seconds']:.0f} s training", flush=True)

    study.run_jobs([{"fn": conv.run_one, "args": (j["dataset"], j["method"], j["seed"], j["work"]), "kw": j["kw"]}
                    for j in jobs], n, done)
    return records


def estimate(args) -> int:
    """Time ``--estimate-steps`` steps and one evaluation of every method on one thread; project the grid."""
    import tempfile

    import torch

    torch.set_num_threads(1)
    total = 0.0
    print(f"{'dataset':8} {'method':13} {'s/step':>8} {'s/eval':>7} {'setup s':>8} {'run min':>8}")
    for dataset in args.datasets:
        profile = conv.DATASETS[dataset]
        with tempfile.TemporaryDirectory() as tmp:
            data = conv.prepare_data(dataset, Path(args.work))  # generated once, kept for the real run
            for method in [m for m in args.methods if m != "best"]:
                n = args.estimate_steps
                r = conv.run_one(dataset, method, 0, tmp, max_steps=n, eval_every=n, overrides={"data_path": data})
                per_step = r["train_seconds"] / n
                per_eval = r["wall_seconds_this_call"] - r["train_seconds"] - (r["setup_seconds"] or 0)
                from dit_core.train.config import read_profile

                budget = (args.max_steps or profile.get("max_steps")
                          or read_profile(profile["profile"]).get("max_steps", 1000))
                minutes = (budget * per_step + budget // profile["eval_every"] * per_eval + (r["setup_seconds"] or 0)) / 60
                total += minutes * args.seeds * (1 + ("best" in args.methods) / len(SINGLES))
                print(f"{dataset:8} {method:13} {per_step:8.3f} {per_eval:7.1f} {r['setup_seconds'] or 0:8.1f} "
                      f"{minutes:8.1f}", flush=True)
    print(f"\nprojected CPU time of the grid ({args.seeds} seeds, with the best combination): {total / 60:.1f} h on "
          "one thread (divide by --jobs on an idle machine with that many cores)")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", default="digits,shapes", help="digits, shapes (comma-separated)")
    p.add_argument("--methods", default=None, help=f"{', '.join(SINGLES)}, best, or combinations such as flow+repa "
                                                   "(comma-separated; default: all and best; --quick: dit,flow,repa)")
    p.add_argument("--seeds", type=int, default=None, help="seeds 0 .. N-1 (default 3; --quick: 1)")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time, one thread each")
    p.add_argument("--max-steps", type=int, default=None, help="steps of every run (default: the profile's for digits, 1,000 for shapes)")
    p.add_argument("--eval-every", type=int, default=None, help="score every N steps (default: the dataset's)")
    p.add_argument("--per-class", type=int, default=None, help="samples per class in a score (default: the dataset's)")
    p.add_argument("--eval-steps", type=int, default=None, help="sampler steps of a score (default: the dataset's)")
    p.add_argument("--work", default=str(REPO / "runs" / "convergence"), help="runs' state (resumable)")
    p.add_argument("--results", default=str(REPO / "benchmarks" / "results"), help="where the records go")
    p.add_argument("--quick", action="store_true", help="tiny budgets, methods dit,flow,repa, 1 seed")
    p.add_argument("--estimate", action="store_true", help="time a few steps per method; project the grid's time")
    p.add_argument("--estimate-steps", type=int, default=40)
    args = p.parse_args(argv)
    args.datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    default_methods = "dit,flow,repa" if args.quick else ",".join(SINGLES + ["best"])
    args.methods = [m.strip() for m in (args.methods or default_methods).split(",") if m.strip()]
    args.seeds = args.seeds or (1 if args.quick else 3)
    if args.quick:
        args.work = str(Path(args.work).with_name(Path(args.work).name + "-quick"))
    for d in args.datasets:
        if d not in conv.DATASETS:
            p.error(f"unknown dataset {d!r}; choose from {', '.join(conv.DATASETS)}")
    for m in args.methods:
        if m != "best":
            conv.method_settings(m)
    if "dit" not in args.methods:
        p.error("the baseline 'dit' is part of every comparison: add it to --methods")
    import signal

    signal.signal(signal.SIGTERM, study.pass_on_stop)  # kill PID: the runs in progress save and stop
    return estimate(args) if args.estimate else run_grid(args)


if __name__ == "__main__":
    sys.exit(main())
