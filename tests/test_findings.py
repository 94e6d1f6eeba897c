"""The paper's findings in miniature (dit_book.findings, chapter 7c): the study's grids, one real run at toy size,
and the reading of its records (spreads over seeds, Gflops-quality correlations, the size-patch trade-offs), on
records made up here and on the paper's own Table 4 (dit_book.paper), read by the same code; the GPU track's
variants, cost estimates and the plan that fits its cell."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dit_book import findings, findings_gpu, paper, study
from dit_book import track as tracks


def _run(variant, seed, fds, accs, gflops=1e-3, steps=(100, 200), batch=64, study_name="scaling", params=1000):
    return {"study": study_name, "variant": variant, "seed": seed, "settings": {}, "max_steps": steps[-1],
            "batch_size": batch, "params": params, "gflops": gflops, "tokens": 16, "train_seconds": 10.0,
            "evals": [{"step": s, "frechet_distance": f, "class_accuracy": a, "real_floor": 0.5, "seconds": 1.0}
                      for s, f, a in zip(steps, fds, accs)]}


def test_the_grids():
    assert list(findings.variants("blocks")) == ["in-context", "cross-attention", "adaln", "adaln-zero",
                                                 "cross-attention-raw"]
    scaling = findings.variants("scaling")
    assert len(scaling) == 9 and scaling["d4w128/2"] == dict(depth=4, hidden_size=128, num_heads=4, patch_size=2,
                                                              block="adaln-zero")
    assert not any(v.split("/")[0] in ("S", "B", "L", "XL") for v in scaling), "the tiny sizes read as DiT's"
    with pytest.raises(ValueError, match="unknown study 'sizes'"):
        findings.variants("sizes")
    # the costs are counted on the trainer's model for the digits: d4w128/2 is the digits profile's model
    l2, l1, s4 = (findings.model_facts(scaling[v]) for v in ("d4w128/2", "d4w128/1", "d2w64/4"))
    assert l2["params"] == 1_274_888 and l2["tokens"] == 16 and l1["tokens"] == 64 and s4["tokens"] == 4
    assert s4["gflops"] < l2["gflops"] < l1["gflops"]
    ic = findings.model_facts(findings.variants("blocks")["in-context"])
    assert ic["tokens"] == 18 and ic["gflops"] > l2["gflops"]
    raw, normed = (findings.model_facts(findings.variants("blocks")[v]) for v in ("cross-attention-raw",
                                                                                   "cross-attention"))
    assert raw == normed  # the context's LayerNorm has no weights and no counted multiply-adds


def test_one_real_run_at_toy_size(tmp_path):
    record = findings.run_one("blocks", "cross-attention", 0, tmp_path, max_steps=4, eval_every=2, per_class=2,
                              eval_steps=2, overrides=dict(depth=1, hidden_size=32, num_heads=2, warmup_steps=0))
    assert [e["step"] for e in record["evals"]] == [2, 4]
    assert all(0 <= e["class_accuracy"] <= 1 and e["frechet_distance"] > 0 for e in record["evals"])
    assert record["settings"]["block"] == "cross-attention" and record["tokens"] == 16 and record["cfg_scale"] == 1.0
    assert record["cpu_seconds_this_call"] > 0 and record["classifier_val_accuracy"] > 0.9
    # what the class does to the model, measured at every score
    last = record["evals"][-1]
    assert 0 < last["class_effect"] and 0 < last["class_attention"] < 1 and 0 < last["class_read"] < 1
    assert last["class_rms"] > 0 and last["time_rms"] > 0
    out = tmp_path / "blocks" / "cross-attention" / "seed0"
    assert (out / "record.json").is_file() and not (out / "checkpoints").exists()
    assert findings.run_one("blocks", "cross-attention", 0, tmp_path) == record  # a finished run is read back


def test_spreads_tables_and_orderings():
    records = [_run("adaln-zero", s, [2.0 + s, 1.0 + 0.1 * s], [0.5, 0.9], study_name="blocks") for s in range(3)]
    records += [_run("in-context", s, [4.0 + s, 3.0 + 0.1 * s], [0.3, 0.6], study_name="blocks") for s in range(3)]
    rows = {r["variant"]: r for r in findings.summarize_curves(records)}
    final = rows["adaln-zero"]["final_fd"]
    assert (final["median"], final["min"], final["max"], final["seeds"]) == (1.1, 1.0, 1.2, 3)
    assert rows["adaln-zero"]["train_gflop"] == pytest.approx(3 * 1e-3 * 64 * 200)
    assert findings.ordering(list(rows.values()), "fd") == ["adaln-zero", "in-context"]
    assert findings.separated(rows["adaln-zero"]["final_fd"], rows["in-context"]["final_fd"])
    assert not findings.separated(rows["adaln-zero"]["fd"][0], rows["in-context"]["fd"][0])  # [2, 4] vs [4, 6]
    table = findings.format_blocks_table(list(rows.values()))
    assert "| adaln-zero | 1.00 |" in table and "1.10 [1.00, 1.20]" in table and "90.0 %" in table


def test_the_clear_of_report():
    """The order by median FD at each step, the designs whose seed range adaLN-Zero's stays clear of, and the count of
    comparisons with the number expected clear by chance alone (0.1 each for three seeds against three)."""
    records = [_run("adaln-zero", s, [4.0 + s, 1.0 + 0.1 * s], [0.2, 0.9], study_name="blocks") for s in range(3)]
    records += [_run("in-context", s, [3.0 + s, 3.0 + 0.1 * s], [0.5, 0.6], study_name="blocks") for s in range(3)]
    records += [_run("adaln", s, [5.0 + s, 1.1 + 0.1 * s], [0.1, 0.7], study_name="blocks") for s in range(3)]
    lines = findings.clear_of_report(findings.summarize_curves(records))
    assert lines[0] == ("step  100: best to worst by FD in-context > adaln-zero > adaln; adaLN-Zero clear of: none")
    assert lines[1] == ("step  200: best to worst by FD adaln-zero > adaln > in-context; adaLN-Zero clear of: "
                        "in-context")  # [1.0, 1.2] against adaln's [1.1, 1.3]: overlapping, not clear
    assert lines[2] == ("4 comparisons: about 0.4 would come out clear by chance alone; adaLN-Zero leads by the "
                        "median accuracy from step 200")
    # fewer seeds make a clear range likelier by chance: one seed against one is always "clear"
    one = findings.clear_of_report(findings.summarize_curves([r for r in records if r["seed"] == 0]))
    assert one[-1].startswith("4 comparisons: about 4.0 would come out clear by chance alone")


def test_three_seeds_apart_by_chance():
    # every ordering of six results equally likely: 2 of the C(6, 3) = 20 splits put one variant's three below
    assert findings.chance_apart(3, 3) == pytest.approx(0.1)
    assert findings.chance_apart(1, 1) == 1.0 and findings.chance_apart(5, 5) == pytest.approx(2 / 252)


def test_correlations_and_trade_offs():
    # FD falls with Gflops: a perfect rank correlation, whatever the size/patch mix
    grid = {"d2w64/4": 1.0, "d2w64/2": 4.0, "d3w96/4": 3.5, "d3w96/2": 14.0}
    records = [_run(v, s, [10 / g, 5 / g + 0.01 * s], [0.1, 0.5], gflops=g * 1e-3) for v, g in grid.items()
               for s in range(3)]
    rows = findings.summarize_curves(records)
    c = findings.correlations(rows)
    assert c["points"] == 4 and c["spearman_gflops_fd"] == pytest.approx(-1.0)
    assert c["pearson_log_gflops_log_fd"] == pytest.approx(-1.0, abs=1e-3)
    pairs = findings.trade_offs(rows)
    assert [(p["a"], p["b"]) for p in pairs] == [("d2w64/2", "d3w96/4")]  # 4.0 vs 3.5 Gflops
    assert not pairs[0]["overlap_fd"]  # 1.25 [1.25, 1.27] vs 1.43 [1.43, 1.45]
    assert pairs[0]["larger_patch"] == "d3w96/4" and pairs[0]["larger_patch_worse"]
    assert pairs[0]["fd_ratio"] == pytest.approx((5 / 3.5 + 0.01) / (5 / 4 + 0.01))
    assert math.isnan(findings.pearson([1, 2], [3, 4]))
    reach = findings.compute_to(rows, 3.0)  # FD <= 3: d2w64/4 never (10, 5), the others at their first step
    assert reach["d2w64/4"] is None and reach["d3w96/2"] == pytest.approx(3 * 14e-3 * 64 * 100)
    assert reach["d2w64/2"] == pytest.approx(findings.training_compute(4e-3, 64, 100))


def test_table_4_read_by_the_same_code():
    """The paper's Table 4 through the digits' analysis. The paper prints no coefficient (its Figure 8: "a strong
    negative correlation"); computed from Table 4's twelve models, Pearson's r of log Gflops and log FID is -0.94.
    Equal-Gflops pairs land together except where a patch-8 model is one of them."""
    rows = paper.scaling_rows()
    assert len(rows) == 12 and {r["variant"] for r in rows} == set(paper.SCALING)
    c = findings.correlations(rows)
    assert c["points"] == 12 and round(c["pearson_log_gflops_log_fd"], 2) == -0.94
    assert math.isnan(c["pearson_log_gflops_accuracy"])  # FID only: no class accuracy in the table
    pairs = {(p["a"], p["b"]): p for p in findings.trade_offs(rows)}
    assert pairs[("DiT-S/2", "DiT-B/4")]["fd_ratio"] == pytest.approx(68.40 / 68.38)  # the paper's example
    eights = [p for p in pairs.values() if "/8" in p["a"] + p["b"]]
    assert eights and all(p["larger_patch_worse"] and p["fd_ratio"] > 1.2 for p in eights)
    assert all(p["fd_ratio"] < 1.06 for p in pairs.values() if p not in eights)
    assert pairs[("DiT-B/4", "DiT-L/8")]["fd"][1]["median"] == 118.87  # another equal-Gflops pair: apart
    checks = findings.scaling_checks(rows)
    assert checks["larger_model"] and checks["smaller_patch"]  # Figure 6, at 400K steps
    assert findings.ordering(paper.design_rows()) == ["adaln-zero", "adaln", "cross-attention", "in-context"]
    # parameters as Table 4 prints them, and as the FLOP counter counts them
    from dit_core.measure.flops import count_params, design_table, meta_model

    for name, (gflops, params_m, _) in paper.SCALING.items():
        assert count_params(meta_model(name)) / 1e6 == pytest.approx(params_m, abs=1.0)
    counted = {r["block"]: r for r in design_table("DiT-XL/2")}
    for design, (gflops, params_m, _) in paper.DESIGNS.items():
        assert counted[design]["params"] / 1e6 == pytest.approx(params_m, abs=1.0)
        assert counted[design]["gmacs"] == pytest.approx(gflops, rel=0.02)


def test_beside_the_paper_reads_both_through_one_table():
    designs = [_run(d, s, [3.0, f + 0.01 * s], [0.2, 0.8], study_name="blocks")
               for d, f in (("in-context", 1.2), ("adaln-zero", 0.6), ("adaln", 1.3), ("cross-attention", 1.1))
               for s in range(3)]
    grid = {"d2w64/4": (1.0, 2.8), "d2w64/2": (4.0, 7.0), "d3w96/4": (3.5, 1.4), "d3w96/2": (14.0, 3.9)}
    scaling = [_run(v, s, [9.0, f], [0.1, 0.5], gflops=g * 1e-3, params=1000 * (1 + v.startswith("d3")))
               for v, (g, f) in grid.items() for s in range(3)]
    table = findings.beside_the_paper(paper.design_rows(), findings.summarize_curves(designs), paper.scaling_rows(),
                                      findings.summarize_curves(scaling), target=1.5)
    assert table.startswith("| | the paper (Table 4")
    assert "adaln-zero 19.47 < adaln 25.21 < cross-attention 26.14 < in-context 35.24" in table
    assert "| adaLN-Zero over in-context | 0.55 | 0.50 |" in table
    assert "-0.94 (12 models)" in table
    assert "no: d2w64/2 above d2w64/4, d3w96/2 above d3w96/4" in table  # the smaller patch worse here
    assert "d3w96/4, " in table.splitlines()[-1]  # the least compute to FD 1.5


def test_committed_records_load_under_the_codes_names(tmp_path):
    """The committed scaling record names its sizes S, B, L; the code names them d2w64, d3w96, d4w128 and reads the
    record under those names, the same figures. A file's labels give its runs of a design the name the code gives
    that design (the record's unnormalised cross-attention runs are cross-attention-raw)."""
    assert study.code_name("S/4") == "d2w64/4" and study.code_name("L/1") == "d4w128/1"
    assert study.code_name("adaln-zero") == "adaln-zero" and study.code_name("DiT-S/2") == "DiT-S/2"
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"labels": {"cross-attention": "cross-attention-raw"},
                                "settings": {"variants": {"S/2": {}, "cross-attention": {}}},
                                "runs": [_run("S/2", 0, [1, 2], [0.1, 0.2]), _run("cross-attention", 0, [3, 4], [0.1, 0.2])]}))
    data = study.load_records(path)
    assert [r["variant"] for r in data["runs"]] == ["d2w64/2", "cross-attention-raw"]
    assert list(data["settings"]["variants"]) == ["d2w64/2", "cross-attention-raw"]


def test_a_subset_never_overwrites_the_whole_record(tmp_path):
    path = findings.record_path(tmp_path, "blocks")
    path.write_text(json.dumps({"runs": [_run("adaln-zero", 0, [1], [0.5], study_name="blocks")]}))
    with pytest.raises(FileExistsError, match="holds runs of adaln-zero.*--tag NAME"):
        findings.run_grid("blocks", tmp_path / "w", tmp_path, [0], only=["in-context"])
    with pytest.raises(ValueError, match="unknown blocks variant.*film"):
        findings.run_grid("blocks", tmp_path / "w", tmp_path, [0], only=["film"])
    assert findings.record_path(tmp_path, "blocks", "cross-attention").name == "paper-findings-blocks-cross-attention.json"


def test_the_gpu_study_variants_and_costs():
    assert findings_gpu.variants("blocks")["cross-attention"] == {"model": "DiT-S/4", "block": "cross-attention"}
    assert list(findings_gpu.variants("scaling")) == ["DiT-S/8", "DiT-S/4", "DiT-B/8", "DiT-B/4"]
    assert findings_gpu.gflops({"model": "DiT-B/4"}) == pytest.approx(paper.SCALING["DiT-B/4"][0], rel=0.01)
    fast, slow = tracks.card_peak("NVIDIA H100 80GB HBM3"), tracks.card_peak("NVIDIA GeForce RTX 3060")
    h100, rtx = findings_gpu.costs(fast, "blocks"), findings_gpu.costs(slow, "blocks")
    assert rtx["total"] == pytest.approx(h100["total"] * fast / slow) and h100["train"] > 0 and h100["fid"] > 0
    assert findings_gpu.costs(fast, "blocks", steps=4000)["train"] == pytest.approx(2 * h100["train"])


@pytest.mark.parametrize("card", ["NVIDIA GeForce RTX 3060", "NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 4090",
                                  "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"])
def test_both_gpu_studies_fit_one_cell_on_every_card_of_the_routes(card):
    peak = tracks.card_peak(card)
    p = findings_gpu.plan(peak)
    both = sum(findings_gpu.costs(peak, s, steps=p["steps"], eval_every=p["eval_every"],
                                  fid_samples=p["fid_samples"])["total"] for s in findings_gpu.STUDIES)
    assert both == pytest.approx(p["seconds"]) and both <= tracks.cell_budget() < tracks.CELL_TIMEOUT_S
    assert p["steps"] % p["eval_every"] == 0 and p["fid_samples"] % 10 == 0 and p["steps"] >= 100 and p["fits"]
    full = sum(findings_gpu.costs(peak, s)["total"] for s in findings_gpu.STUDIES)
    assert p["reduced"] == (full > tracks.cell_budget()) and (p["note"].startswith("the sizes as set") != p["reduced"])


def test_the_gpu_plan_cuts_in_order():
    fast, slow = tracks.card_peak("NVIDIA H100 SXM"), tracks.card_peak("NVIDIA GeForce RTX 3060")
    assert findings_gpu.plan(fast)["steps"] == 2000 and not findings_gpu.plan(fast)["reduced"]
    fewer = findings_gpu.plan(tracks.card_peak("NVIDIA GeForce RTX 4090"))
    assert fewer["steps"] == 1000 and fewer["eval_every"] == 1000 and fewer["fid_samples"] == 1000  # one interval
    small = findings_gpu.plan(slow)
    assert small["eval_every"] == small["steps"] < 1000 and small["fid_samples"] < 1000 and "smaller plan" in small["note"]
    assert findings_gpu.chapter_seconds(fast) == findings_gpu.plan(fast)["seconds"]
    as_set = findings_gpu.plan(slow, fit=False)  # GPU_FIT_CELL = False: the sizes as set, their estimate said
    assert (as_set["steps"], as_set["eval_every"], as_set["fid_samples"]) == (2000, 1000, 1000)
    assert not as_set["reduced"]
    assert not as_set["fits"] and f"about {as_set['seconds'] / 60:.0f} min (estimate), past this cell's budget" in \
        as_set["note"]


@pytest.mark.parametrize("card", ["Quadro P1000", None])
def test_a_card_without_a_known_peak_is_planned_as_the_slowest_known(card):
    """A card dit_book.track.GPU_PEAKS does not know (or no card) gets the plan of the slowest card it knows, which
    fits the cell there, and the note says so; not the sizes as set (about 2.5 h on an RTX 3060)."""
    assert tracks.card_peak(card) is None
    name, peak = findings_gpu.slowest_card()
    assert peak == min(p for _, p in tracks.GPU_PEAKS) and tracks.card_peak(f"NVIDIA GeForce RTX {name}") == peak
    unknown, slowest = findings_gpu.plan(tracks.card_peak(card)), findings_gpu.plan(peak)
    assert {k: v for k, v in unknown.items() if k != "note"} == {k: v for k, v in slowest.items() if k != "note"}
    assert unknown["reduced"] and unknown["fits"] and unknown["seconds"] <= tracks.cell_budget()
    assert unknown["note"].startswith(f"no peak known for this device, so planned as the slowest card") and \
        f"({name}, {peak:g} TFLOP/s" in unknown["note"] and unknown["note"].endswith(slowest["note"])
    row = findings_gpu.format_plans([card or "Quadro P1000"]).splitlines()[-1]
    assert f"(no peak known: planned as {name})" in row and f"~{unknown['seconds'] / 60:.0f} min |" in row


def test_a_plan_that_cannot_fit_says_so(monkeypatch):
    """On a card too slow for even the smallest plan (100 steps, one FID of 10 samples), the plan is that smallest one
    and its note gives the estimate against the budget instead of claiming a fit."""
    p = findings_gpu.plan(1.0)  # 1 TFLOP/s
    assert (p["steps"], p["eval_every"], p["fid_samples"]) == (100, 100, 10) and p["reduced"] and not p["fits"]
    assert p["seconds"] > tracks.cell_budget()
    assert p["note"].startswith("even the smallest plan") and "to fit" not in p["note"]
    assert (f"takes about {p['seconds'] / 60:.0f} min (estimate), past this cell's budget of "
            f"{tracks.cell_budget() / 60:.0f} min (the book stops a cell at {tracks.CELL_TIMEOUT_S / 60:.0f} min)"
            ) in p["note"]
    monkeypatch.setattr(tracks, "GPU_PEAKS", tracks.GPU_PEAKS + (("P1000", 1.0),))
    assert findings_gpu.format_plans(["Quadro P1000"]).splitlines()[-1] == (
        f"| Quadro P1000 | ~{findings_gpu.plan(1.0, fit=False)['seconds'] / 60:.0f} min | 100 steps, FID every 100 "
        f"of 10 samples (past the cell's budget) | ~{p['seconds'] / 60:.0f} min |")


def test_the_record_shows_its_json():
    """benchmarks/results/paper-findings.md's tables are its JSON records rendered by findings.record_tables (the
    scaling runs under the code's size names, the block-design runs' cross-attention as cross-attention-raw), and
    the figures it states in words are the JSON's."""
    from pathlib import Path

    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    text = (results / "paper-findings.md").read_text()
    tables = findings.record_tables(results)
    for name, table in tables.items():
        assert table in text, f"paper-findings.md: its {name} table is not its JSON's; paste findings.record_tables()"
    blocks = findings.summarize_curves(study.load_records(results / findings.RECORD_FILES["blocks"])["runs"])
    assert findings.leads(blocks, "adaln-zero", "accuracy") == 600 and findings.leads(blocks, "adaln-zero", "fd") == 400
    assert "highest median accuracy from step 600 on" in " ".join(text.split())


def test_chapter_7c_quotes_table_4_as_the_data_holds_it():
    """The paper's numbers in chapter 7c's prose are dit_book.paper's (Table 4), and its quotations are the paper's
    sentences as paper.QUOTES holds them."""
    from dit_book.records import prose

    text = prose(Path(__file__).resolve().parents[1] / "book" / "07c_paper_findings.ipynb")
    d, s = paper.DESIGNS, paper.SCALING
    assert (f"in-context {d['in-context'][2]:.2f}, cross-attention {d['cross-attention'][2]:.2f}, adaLN "
            f"{d['adaln'][2]:.2f}, adaLN-Zero {d['adaln-zero'][2]:.2f}") in text
    assert f"DiT-S/2 ({s['DiT-S/2'][0]:.2f} Gflops) and DiT-B/4 ({s['DiT-B/4'][0]:.2f}) end at {s['DiT-S/2'][2]:.2f} " \
           f"and {s['DiT-B/4'][2]:.2f}" in text
    assert f"Another pair of about equal Gflops, DiT-L/8 ({s['DiT-L/8'][0]:.2f}) and DiT-B/4, ends at " \
           f"{s['DiT-L/8'][2]:.2f} against {s['DiT-B/4'][2]:.2f}" in text
    for key in ("fig5", "half", "scaling", "similar", "correlation", "compute"):  # quoted whole, or their start
        assert paper.QUOTES[key][:80] in text, key
    assert "XL/4 is outperformed by XL/2 after roughly $10^{10}$ Gflops" in text
    assert "Figure 5 of the paper" in text and "gives curves, not a table" not in text
    assert "whatever mix of size and patch" not in text and "leaves aside" not in text


def test_the_papers_own_example_is_the_papers():
    """Chapter 7c and the record call DiT-S/2 and DiT-B/4 the paper's own example (its words: "e.g., DiT-S/2 and
    DiT-B/4") and name DiT-L/8 and DiT-B/4 as another pair of about equal Gflops, with Table 4's figures."""
    import re

    from dit_book.records import prose

    root = Path(__file__).resolve().parents[1]
    assert "(e.g., DiT-S/2 and DiT-B/4)" in paper.QUOTES["similar"]
    s = paper.SCALING
    for path in (root / "book" / "07c_paper_findings.ipynb", root / "benchmarks" / "results" / "paper-findings.md"):
        text = prose(path)
        examples = [m.end() for m in re.finditer(r"own example", text)]
        assert examples, f"{path.name}: names the paper's own example"
        for end in examples:
            models = re.findall(r"DiT-\w+/\d", text[end:end + 80])
            assert models[:2] == ["DiT-S/2", "DiT-B/4"], f"{path.name}: the paper's own example is {models[:2]}"
        assert re.search(r"another pair of about equal Gflops, DiT-L/8 \(" + f"{s['DiT-L/8'][0]:.2f}" + r"\) and "
                         r"DiT-B/4.{0,20}, ends at " + f"{s['DiT-L/8'][2]:.2f} against {s['DiT-B/4'][2]:.2f}",
                         text, re.I), path.name
        assert "chapter's other pair" not in text, path.name
