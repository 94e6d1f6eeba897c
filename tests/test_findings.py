"""The paper's findings in miniature (dit_book.findings, chapter 7c): the study's grids, one real run at toy size,
and the reading of its records (spreads over seeds, Gflops-quality correlations, the size-patch trade-offs), on
records made up here; and the GPU track's variants and cost estimates."""

from __future__ import annotations

import math

import pytest

from dit_book import findings, findings_gpu
from dit_book import track as tracks


def _run(variant, seed, fds, accs, gflops=1e-3, steps=(100, 200), batch=64, study="scaling"):
    return {"study": study, "variant": variant, "seed": seed, "settings": {}, "max_steps": steps[-1],
            "batch_size": batch, "params": 1000, "gflops": gflops, "tokens": 16, "train_seconds": 10.0,
            "evals": [{"step": s, "frechet_distance": f, "class_accuracy": a, "real_floor": 0.5, "seconds": 1.0}
                      for s, f, a in zip(steps, fds, accs)]}


def test_the_grids():
    assert list(findings.variants("blocks")) == ["in-context", "cross-attention", "adaln", "adaln-zero"]
    scaling = findings.variants("scaling")
    assert len(scaling) == 9 and scaling["L/2"] == dict(depth=4, hidden_size=128, num_heads=4, patch_size=2,
                                                         block="adaln-zero")
    with pytest.raises(ValueError, match="unknown study 'sizes'"):
        findings.variants("sizes")
    # the costs are counted on the trainer's model for the digits: L/2 is the digits profile's model
    l2, l1, s4 = (findings.model_cost(scaling[v]) for v in ("L/2", "L/1", "S/4"))
    assert l2["params"] == 1_274_888 and l2["tokens"] == 16 and l1["tokens"] == 64 and s4["tokens"] == 4
    assert s4["gflops"] < l2["gflops"] < l1["gflops"]
    ic = findings.model_cost(findings.variants("blocks")["in-context"])
    assert ic["tokens"] == 18 and ic["gflops"] > l2["gflops"]


def test_one_real_run_at_toy_size(tmp_path):
    record = findings.run_one("blocks", "in-context", 0, tmp_path, max_steps=4, eval_every=2, per_class=2,
                              eval_steps=2, overrides=dict(depth=1, hidden_size=32, num_heads=2, warmup_steps=0))
    assert [e["step"] for e in record["evals"]] == [2, 4]
    assert all(0 <= e["class_accuracy"] <= 1 and e["frechet_distance"] > 0 for e in record["evals"])
    assert record["settings"]["block"] == "in-context" and record["tokens"] == 18 and record["cfg_scale"] == 1.0
    assert record["cpu_seconds_this_call"] > 0
    out = tmp_path / "blocks" / "in-context" / "seed0"
    assert (out / "record.json").is_file() and not (out / "checkpoints").exists()
    assert findings.run_one("blocks", "in-context", 0, tmp_path) == record  # a finished run is read back


def test_spreads_tables_and_orderings():
    records = [_run("adaln-zero", s, [2.0 + s, 1.0 + 0.1 * s], [0.5, 0.9], study="blocks") for s in range(3)]
    records += [_run("in-context", s, [4.0 + s, 3.0 + 0.1 * s], [0.3, 0.6], study="blocks") for s in range(3)]
    rows = {r["variant"]: r for r in findings.summarize(records)}
    final = rows["adaln-zero"]["final_fd"]
    assert (final["median"], final["min"], final["max"], final["seeds"]) == (1.1, 1.0, 1.2, 3)
    assert rows["adaln-zero"]["train_gflop"] == pytest.approx(3 * 1e-3 * 64 * 200)
    assert findings.ordering(list(rows.values()), "fd") == ["adaln-zero", "in-context"]
    assert findings.separated(rows["adaln-zero"]["final_fd"], rows["in-context"]["final_fd"])
    assert not findings.separated(rows["adaln-zero"]["fd"][0], rows["in-context"]["fd"][0])  # [2, 4] vs [4, 6]
    table = findings.format_blocks_table(list(rows.values()))
    assert "| adaln-zero | 1.00 |" in table and "1.10 [1.00, 1.20]" in table and "90.0 %" in table


def test_correlations_and_trade_offs():
    # FD falls with Gflops: a perfect rank correlation, whatever the size/patch mix
    grid = {"S/4": 1.0, "S/2": 4.0, "B/4": 3.5, "B/2": 14.0}
    records = [_run(v, s, [10 / g, 5 / g + 0.01 * s], [0.1, 0.5], gflops=g * 1e-3) for v, g in grid.items()
               for s in range(3)]
    rows = findings.summarize(records)
    c = findings.correlations(rows)
    assert c["points"] == 4 and c["spearman_gflops_fd"] == pytest.approx(-1.0)
    assert c["pearson_log_gflops_log_fd"] == pytest.approx(-1.0, abs=1e-3)
    pairs = findings.trade_offs(rows)
    assert [(p["a"], p["b"]) for p in pairs] == [("S/2", "B/4")]  # 4.0 vs 3.5 Gflops, another size and patch
    assert not pairs[0]["overlap_fd"]  # 1.25 [1.25, 1.27] vs 1.43 [1.43, 1.45]
    assert math.isnan(findings.pearson([1, 2], [3, 4]))
    reach = findings.compute_to(rows, 3.0)  # FD <= 3: S/4 never (10, 5), S/2 (2.5) and B/2 (0.7) at their first step
    assert reach["S/4"] is None and reach["B/2"] == pytest.approx(3 * 14e-3 * 64 * 100)
    assert reach["S/2"] == pytest.approx(findings.training_compute(4e-3, 64, 100))


def test_the_gpu_study_variants_and_costs():
    assert findings_gpu.variants("blocks")["cross-attention"] == {"model": "DiT-S/4", "block": "cross-attention"}
    assert list(findings_gpu.variants("scaling")) == ["DiT-S/8", "DiT-S/4", "DiT-B/8", "DiT-B/4"]
    assert findings_gpu.gflops({"model": "DiT-B/4"}) == pytest.approx(5.56, rel=0.01)  # paper, Table 4
    fast, slow = tracks.card_peak("NVIDIA H100 80GB HBM3"), tracks.card_peak("NVIDIA GeForce RTX 3060")
    h100, rtx = findings_gpu.costs(fast, "blocks"), findings_gpu.costs(slow, "blocks")
    assert rtx["total"] == pytest.approx(h100["total"] * fast / slow) and h100["train"] > 0 and h100["fid"] > 0
    assert findings_gpu.costs(fast, "blocks", steps=4000)["train"] == pytest.approx(2 * h100["train"])
    # a slow card trains fewer steps, in whole evaluation intervals, to keep one cell within the book's limit
    assert findings_gpu.plan_steps(fast, "blocks") == 2000
    fewer = findings_gpu.plan_steps(slow, "scaling", budget_s=300)
    assert fewer < 2000 and fewer % 1000 == 0 and fewer >= 1000
    assert findings_gpu.plan_steps(None, "scaling") == 2000
