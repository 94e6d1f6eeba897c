"""The "Runs on a GPU" box that GPU-track cells show on a build without a GPU (dit_book.gpu_box)."""

from __future__ import annotations

import json

import pytest

from dit_book.gpu_box import gpu_only
from dit_book.timings import RESULTS


def _results(tmp_path, records=()):
    folder = tmp_path / "results"
    folder.mkdir()
    for name, rec in records:
        (folder / name).write_text(json.dumps(rec))
    return folder


def test_without_any_record_it_says_not_yet_measured(tmp_path):
    box = gpu_only("07_sampling", "samples of the official DiT-XL/2", data={"chapters": {}},
                   results=_results(tmp_path))
    text, page = repr(box), box._repr_html_()
    assert text.startswith("Runs on a GPU") and "not yet measured on a GPU" in text
    assert "samples of the official DiT-XL/2." in text
    assert 'class="admonition attention dit-gpu-only"' in page and "Runs on a GPU" in page
    assert "not yet measured on a GPU" in page and not box.measured


def test_a_gpu_book_build_is_shown_with_its_date_and_machine(tmp_path):
    data = {"chapters": {"07_sampling": {"gpu": {"seconds": 754.0, "date": "2027-02-03", "commit": "abc1234",
                                                 "machine": "NVIDIA H100", "how": "`make book`"}}}}
    box = gpu_only("07_sampling", "FID of both models", data=data, results=_results(tmp_path))
    text = repr(box)
    assert box.measured and "not yet measured" not in text
    assert "12.6 min" in text and "2027-02-03" in text and "abc1234" in text and "NVIDIA H100" in text


def test_gpu_track_records_give_time_and_memory_and_skip_dry_runs(tmp_path):
    row = {"wall_s": 90.0, "wall_at_defaults_s": 960.0, "peak_allocated_gib": 21.25, "error": None}
    rec = {"gpu": "NVIDIA H200", "dry_run": False, "date": "2027-01-01", "chapters": {"05_training": row}}
    dry = {**rec, "gpu": "dry-run-cpu", "dry_run": True}
    folder = _results(tmp_path, [("nvidia-h200-gpu-track.json", rec), ("dry-run-cpu-gpu-track.json", dry)])
    box = gpu_only("05_training", "the loss curve of DiT-B/2", data={"chapters": {}}, results=folder)
    text = repr(box)
    assert box.measured and "NVIDIA H200" in text and "2027-01-01" in text
    assert "~16 min at the chapter's defaults" in text and "21.2 GiB" in text
    assert "nvidia-h200-gpu-track.json" in text and "random weights" in text
    assert "dry-run-cpu" not in text
    # another chapter of the same record is not measured
    assert "not yet measured" in repr(gpu_only("07_sampling", "x", data={"chapters": {}}, results=folder))


def test_a_failed_chapter_is_reported_but_not_a_measurement(tmp_path):
    rec = {"gpu": "NVIDIA H200", "dry_run": False, "date": "2027-01-01",
           "chapters": {"07_sampling": {"wall_s": 5.0, "error": "RuntimeError: boom"}}}
    box = gpu_only("07_sampling", "x", data={"chapters": {}}, results=_results(tmp_path, [("a-gpu-track.json", rec)]))
    assert not box.measured and "boom" in repr(box) and "stopped" in repr(box)


def test_related_records_are_named_and_must_exist(tmp_path):
    folder = _results(tmp_path, [("nvidia-h200-dit-xl2.json", {})])
    box = gpu_only("07_sampling", "x", related=["nvidia-h200-dit-xl2.json"], data={"chapters": {}}, results=folder)
    assert "benchmarks/results/nvidia-h200-dit-xl2.json" in repr(box)
    assert "<code>benchmarks/results/nvidia-h200-dit-xl2.json</code>" in box._repr_html_()
    with pytest.raises(FileNotFoundError, match="no record"):
        gpu_only("07_sampling", "x", related=["nowhere.json"], data={"chapters": {}}, results=folder)


def test_the_repositorys_records_named_by_the_chapters_exist():
    box = gpu_only("07_sampling", "sampling speed", related=["gpu-ladder-h200.md"])
    assert "gpu-ladder-h200.md" in repr(box)
    assert (RESULTS / "gpu-ladder-h200.md").is_file()


@pytest.mark.parametrize("stem", ["07_sampling.ipynb", "book/07_sampling", "", 7])
def test_bad_stems_are_refused(stem):
    with pytest.raises(ValueError, match="stem must be"):
        gpu_only(stem, "x", data={"chapters": {}})


def test_what_is_required():
    with pytest.raises(ValueError, match="what the cell shows"):
        gpu_only("07_sampling", "  ", data={"chapters": {}})


def test_html_is_escaped(tmp_path):
    box = gpu_only("07_sampling", "a <b> & c", data={"chapters": {}}, results=_results(tmp_path))
    assert "a &lt;b&gt; &amp; c" in box._repr_html_()
