"""The convergence measurement (dit_book.convergence, benchmarks/convergence.py): method settings, reading
steps-to-target off records, the table, choosing the combination, and one tiny resumable run."""

from __future__ import annotations

import json
import math

import pytest

from dit_book import convergence as conv


def record(method, seed, accuracies, fds, every=50, budget=None):
    evals = [{"step": every * (i + 1), "seconds": 2.0 * every * (i + 1), "class_accuracy": a, "frechet_distance": f}
             for i, (a, f) in enumerate(zip(accuracies, fds))]
    return {"method": method, "seed": seed, "max_steps": budget or every * len(evals), "evals": evals,
            "train_seconds": 2.0 * every * len(evals)}


RECORDS = [
    record("dit", 0, [0.5, 0.9, 0.96, 0.97], [9, 5, 3, 2.0]),
    record("dit", 1, [0.5, 0.8, 0.9, 0.95], [9, 6, 3, 2.4]),
    record("dit", 2, [0.6, 0.9, 0.93, 0.94], [8, 6, 4, 2.2]),
    record("flow", 0, [0.96, 0.97, 0.98, 0.99], [4, 2, 1.5, 1.0]),
    record("flow", 1, [0.9, 0.96, 0.98, 0.99], [5, 2.1, 1.6, 1.1]),
    record("flow", 2, [0.95, 0.97, 0.98, 0.99], [4, 2.2, 1.4, 1.2]),
    record("mask", 0, [0.5, 0.6, 0.7, 0.8], [9, 8, 7, 6]),
    record("repa", 0, [0.7, 0.96, 0.97, 0.98], [7, 2.5, 2.0, 1.8]),
]


def test_steps_to_targets_medians_ranges_and_speedups():
    rows = {r["method"]: r for r in conv.summarize(RECORDS)}
    assert [r["method"] for r in conv.summarize(RECORDS)] == ["dit", "flow", "mask", "repa"]
    dit, flow, mask = rows["dit"], rows["flow"], rows["mask"]
    # 95 %: DiT at 150 and 200 and never (> 200): median 200, range 150 .. > budget
    assert (dit["steps_to_accuracy"]["median"], dit["steps_to_accuracy"]["min"]) == (200, 150)
    assert math.isinf(dit["steps_to_accuracy"]["max"]) and dit["steps_to_accuracy"]["reached"] == 2
    assert flow["steps_to_accuracy"]["median"] == 50 and flow["steps_speedup_accuracy"] == pytest.approx(4.0)
    assert math.isinf(mask["steps_to_accuracy"]["median"]) and mask["steps_speedup_accuracy"] is None
    # the distance target: DiT's median final distance (2.2); DiT's median run meets it at the end
    assert dit["targets"]["fd"] == pytest.approx(2.2)
    assert dit["steps_to_fd"]["median"] == 200 and flow["steps_to_fd"]["median"] == 100
    assert flow["seconds_to_accuracy"]["median"] == pytest.approx(100.0) and dit["seconds_per_step"] == 2.0
    table = conv.format_table(conv.summarize(RECORDS))
    assert "| dit | 3 | 200 [150, >200] | 1.00 |" in table and "| mask | 1 | >200 | - |" in table
    assert "| flow | 3 | 50 [50, 100] | 4.00 |" in table


def test_the_combination_joins_the_methods_that_beat_dit():
    assert conv.best_combination(RECORDS) == "flow+repa"
    assert conv.best_combination([r for r in RECORDS if r["method"] in ("dit", "mask", "flow")]) == "flow"
    assert conv.best_combination([r for r in RECORDS if r["method"] in ("dit", "mask")]) == "mask"  # none helped
    with pytest.raises(ValueError, match="need DiT's"):
        conv.best_combination([r for r in RECORDS if r["method"] == "flow"])


# The shapes at a short budget: nobody reaches 95 %; DiT's recipe stays near chance, flow learns the classes.
SHORT = [record("dit", s, [0.3, 0.35], [40, 38 - s]) for s in range(3)] + \
        [record("flow", s, [0.4, 0.6 + 0.05 * s], [20, 15]) for s in range(3)] + \
        [record("min_snr", s, [0.3, 0.3 + 0.04 * s], [40, 30]) for s in range(3)]


def test_without_a_hit_the_final_accuracy_decides_with_its_spread():
    rows = {r["method"]: r for r in conv.summarize(SHORT)}
    flow, dit, snr = rows["flow"], rows["dit"], rows["min_snr"]
    assert flow["final_accuracy_range"] == pytest.approx((0.6, 0.7)) and flow["final_accuracy"] == pytest.approx(0.65)
    assert conv.verdict(flow, dit) == "better final accuracy (neither reaches 95%)"
    assert conv.verdict(snr, dit) == "no clear difference in final accuracy (neither reaches 95%)"
    assert conv.verdict(dit, flow).startswith("worse")
    # with a hit, the steps decide, as before; one seed gives no verdict
    full = {r["method"]: r for r in conv.summarize(RECORDS)}
    assert conv.verdict(full["flow"], full["dit"]) == "faster"  # 50 [50, 100] vs 200 [150, >200]
    assert conv.verdict(full["repa"], full["dit"]) == "one seed: no verdict"
    assert "| flow | 3 | >100 | - |" in conv.format_table(conv.summarize(SHORT))
    assert "| 65.0% [60%, 70%] |" in conv.format_table(conv.summarize(SHORT))
    # the combination to measure: the methods above DiT's median final accuracy (min-SNR's 34 % is below its 35 %)
    assert conv.best_combination(SHORT) == "flow"
    assert conv.best_combination(SHORT + [record("repa", s, [0.4, 0.5], [20, 18]) for s in range(3)]) == "flow+repa"


def test_method_settings_and_their_config_keys():
    assert conv.method_settings("dit") == conv.OFF
    combo = conv.config_overrides("flow+mask+repa", 800)
    assert combo["objective"] == "flow" and combo["learn_sigma"] is False and combo["mask_ratio"] == 0.5
    assert combo["mask_finetune_steps"] == 80 and combo["repa_weight"] == 0.5
    from dit_core.train import make_config

    for method in conv.METHODS:  # every method is a valid training config on both profiles
        for spec in conv.DATASETS.values():
            make_config(spec["profile"], conv.config_overrides(method, 100))
    with pytest.raises(ValueError, match="unknown method 'sit'"):
        conv.method_settings("flow+sit")


def test_training_seconds_add_up_the_logging_windows(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [{"step": 10, "steps_per_s": 5.0}, {"step": 20, "steps_per_s": 2.0},
                                                      {"step": 30, "steps_per_s": 10.0}]) + "\n")
    assert conv.training_seconds(path) == {10: 2.0, 20: 7.0, 30: 8.0}


def test_one_tiny_run_is_recorded_and_resumes(tmp_path):
    kw = dict(max_steps=20, eval_every=10, per_class=2, eval_steps=3,
              overrides=dict(depth=2, hidden_size=32, num_heads=2, batch_size=16))
    rec = conv.run_one("digits", "flow", 0, tmp_path, **kw)
    out = tmp_path / "digits" / "flow" / "seed0"
    assert [e["step"] for e in rec["evals"]] == [10, 20] and rec["settings"]["objective"] == "flow"
    assert all(0 <= e["class_accuracy"] <= 1 and e["seconds"] > 0 for e in rec["evals"])
    assert not list((out / "checkpoints").glob("step_*.pt"))  # scored checkpoints are removed
    assert json.loads((out / "record.json").read_text()) == rec
    # a run killed after scoring, before its record: continues without training again
    (out / "record.json").unlink()
    again = conv.run_one("digits", "flow", 0, tmp_path, **kw)
    assert again["evals"] == rec["evals"] and again["setup_seconds"] is None


def test_an_interrupted_run_writes_no_record(tmp_path, monkeypatch):
    """SIGTERM makes the trainer save and return (``interrupted``); the benchmark must not then score the partial
    run and record it as complete (it did: a killed benchmark left a record that ended at step 450 of 800)."""
    import dit_core.train as train_pkg

    monkeypatch.setattr(train_pkg, "train", lambda cfg: {"interrupted": "SIGTERM", "steps": 7, "wall_seconds": 1.0,
                                                         "train_seconds": 1.0})
    with pytest.raises(KeyboardInterrupt, match="interrupted .*SIGTERM.* at step 7"):
        conv.run_one("digits", "flow", 0, tmp_path, max_steps=20, eval_every=10, per_class=2, eval_steps=3,
                     overrides=dict(depth=2, hidden_size=32, num_heads=2, batch_size=16))
    assert not (tmp_path / "digits" / "flow" / "seed0" / "record.json").exists()


@pytest.mark.slow
def test_a_terminated_benchmark_stops_its_workers_and_they_save(tmp_path):
    """``kill PID`` of the benchmark reaches the main process only: its pool's workers trained on as orphans (they
    did, writing into the same run folders as the next start). Now they are stopped, after saving."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    work = tmp_path / "w"
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, str(repo / "benchmarks" / "convergence.py"), "--quick", "--datasets",
                             "digits", "--methods", "dit,flow", "--jobs", "2", "--work", str(work)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    runs = [work.with_name("w-quick") / "digits" / m / "seed0" for m in ("dit", "flow")]
    workers = []
    try:
        deadline = time.time() + 240
        while not all((r / "metrics.jsonl").exists() for r in runs) and proc.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None, proc.stdout.read()
        children = subprocess.run(["ps", "-ww", "-o", "pid=,args=", "--ppid", str(proc.pid)], capture_output=True,
                                  text=True).stdout.splitlines()
        workers = [int(line.split()[0]) for line in children if "spawn_main" in line]
        assert len(workers) == 2, children
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=120)[0]
        assert proc.returncode != 0 and "stopped by signal 15" in output
        time.sleep(1)
        for pid in workers:  # gone (an orphan would be adopted by init and keep running)
            assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
        for run in runs:  # each saved where it stopped, recorded nothing
            assert (run / "checkpoints" / "last.pt").exists() and not (run / "record.json").exists()
    finally:
        proc.kill()
        for pid in workers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_the_curves_plot_with_each_studys_styles():
    """Chapter 07b's curves (DiT's recipe thicker, combinations dashed) and chapter 7c's through one plot function."""
    import matplotlib

    matplotlib.use("Agg")
    records = RECORDS + [dict(record("flow+repa", 0, [0.9, 0.97, 0.98, 0.99], [5, 2, 1.5, 1.1]))]
    fig = conv.plot_curves(records, x="seconds")
    lines = {line.get_label(): line for line in fig.axes[0].get_lines() if not line.get_label().startswith("_")}
    assert lines["dit"].get_linewidth() == 2.2 and lines["flow"].get_linewidth() == 1.4
    assert lines["flow+repa"].get_linestyle() == "--" and fig.axes[1].get_yscale() == "log"
    assert list(lines["dit"].get_xdata()) == [100.0, 200.0, 300.0, 400.0]  # the seeds' median training seconds
