"""The GPU run's scripts, checked on the CPU: they parse, their plan is the parts in order within 8 minutes,
their subprocesses keep the caller's PYTHONPATH (where carried wheels are), the first run writes its records
as each part ends and a part that hangs costs that part alone, and the wheels folder stays out of git."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((REPO / "benchmarks").glob("*.sh"))


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _wheel(folder: Path, name: str = "carried_probe", version: str = "0.1") -> Path:
    """A minimal pure-Python wheel of one package whose ``VALUE`` is 42 (a stand-in for a carried wheel)."""
    files = {f"{name}/__init__.py": b"VALUE = 42\n",
             f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{name}-{version}.dist-info/WHEEL":
                 b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{k},sha256={base64.urlsafe_b64encode(hashlib.sha256(v).digest()).rstrip(b'=').decode()},{len(v)}"
              for k, v in files.items()] + [f"{name}-{version}.dist-info/RECORD,,"]
    files[f"{name}-{version}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for k, v in files.items():
            z.writestr(k, v)
    return path


def _env(tmp_path: Path, **extra) -> dict:
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1", TMPDIR=str(tmp_path),
               FIRST_RUN_SITE=str(tmp_path / "site"), **extra)
    env.pop("PYTHONPATH", None)
    return env


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_the_shell_scripts_parse(script):
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_part_processes_keep_the_callers_pythonpath(tmp_path, monkeypatch):
    """A folder the caller put on PYTHONPATH (wheels installed with --target) stays importable in every part's
    process, after the repository."""
    carried = tmp_path / "carried"
    carried.mkdir()
    (carried / "carried_probe.py").write_text("VALUE = 42\n")
    monkeypatch.setenv("PYTHONPATH", str(carried))
    for name in ("gpu_check", "gpu_profiles", "gpu_speed"):
        module = _load(name)
        assert module.child_env()["PYTHONPATH"].split(os.pathsep) == [str(REPO), str(carried)], name
    gpu_check = _load("gpu_check")
    result = gpu_check.run([sys.executable, "-c", "import carried_probe, dit_core; print(carried_probe.VALUE)"],
                           timeout=120)
    assert result["returncode"] == 0 and "42" in result["tail"], result["tail"]
    monkeypatch.delenv("PYTHONPATH")
    assert _load("gpu_speed").child_env()["PYTHONPATH"] == str(REPO)


def test_the_first_runs_plan(tmp_path):
    proc = subprocess.run(["bash", "benchmarks/gpu_first_run.sh", "--plan", str(tmp_path / "out")], cwd=REPO,
                          capture_output=True, text=True, env=_env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    parts = [line.split()[0] for line in proc.stdout.splitlines()[1:-1]]
    assert parts == ["install", "tests", "profiles", "ladder", "sampling", "ema"]
    limits = [int(line.split()[1]) for line in proc.stdout.splitlines()[1:-1]]
    assert sum(limits) <= 8 * 60 and f"time limits together: {sum(limits)} s" in proc.stdout
    text = proc.stdout
    assert "tests/test_cuda.py tests/test_cuda_sampling.py" in text
    assert "--profiles rtx3060-12gb imagenette-b2 imagenette-b2-fp16 --steps 20" in text
    assert "official\\,fastest" in text and "--parts sampling" in text and "--parts ema" in text
    assert not (tmp_path / "out").exists()  # a plan runs nothing
    bad = subprocess.run(["bash", "benchmarks/gpu_first_run.sh"], cwd=REPO, capture_output=True, text=True,
                         env=_env(tmp_path))
    assert bad.returncode == 2 and "usage" in bad.stderr


@pytest.mark.slow
def test_the_first_run_writes_each_parts_record_and_a_hang_costs_one_part(tmp_path):
    """A dry run of two parts with a carried wheel: the wheel goes into a folder put on PYTHONPATH (a dry run
    never installs into the interpreter), and the tests part, here a test that imports the carried package, sees
    it. Then the same with the tests part's limit at 1 s: it is stopped, recorded as timed out, and the next part
    runs and is recorded."""
    wheels = tmp_path / "wheels"
    _wheel(wheels)
    probe = tmp_path / "test_probe.py"
    probe.write_text("import carried_probe\n\n\ndef test_the_carried_package_imports():\n"
                     "    assert carried_probe.VALUE == 42\n")
    out = tmp_path / "out"
    env = _env(tmp_path, WHEELS=str(wheels), PARTS="install tests", CUDA_TESTS=str(probe))
    proc = subprocess.run(["bash", "benchmarks/gpu_first_run.sh", "--dry-run", str(out)], cwd=REPO,
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((out / "first-run.json").read_text())
    assert record["machine"]["dry_run"] is True
    assert {k: v["status"] for k, v in record["parts"].items()} == {"install": "ok", "tests": "ok"}
    assert any("1 passed" in line for line in record["parts"]["tests"]["tail"])
    assert (tmp_path / "site" / "carried_probe" / "__init__.py").is_file()
    assert "| tests | ok |" in (out / "first-run.md").read_text()
    assert sorted(p.name for p in out.iterdir()) == ["first-run.json", "first-run.log", "first-run.md"]

    slow = tmp_path / "test_slow.py"
    slow.write_text("import time\n\n\ndef test_hangs():\n    time.sleep(60)\n")
    env.update(PARTS="tests ema", CUDA_TESTS=str(slow), LIMIT_TESTS="1")
    proc = subprocess.run(["bash", "benchmarks/gpu_first_run.sh", "--dry-run", str(out)], cwd=REPO,
                          capture_output=True, text=True, env=env, timeout=300)
    record = json.loads((out / "first-run.json").read_text())
    assert record["parts"]["tests"]["status"] == "timed out after 1 s" and record["parts"]["tests"]["wall_s"] < 20
    assert record["parts"]["ema"]["status"] == "ok" and (out / "ema.json").is_file()
    assert "install" not in record["parts"]  # the records of an earlier run are not mixed in
    assert len(list(out.iterdir())) <= 8


@pytest.mark.notebook
def test_the_chapters_smoke_run_records_each_chapter(tmp_path):
    """The chapters' GPU branch at SMOKE size, here on the CPU (--dry-run) and for chapter 00 alone: the record
    holds the chapter, written as it finished."""
    out = tmp_path / "out"
    env = _env(tmp_path, CHAPTERS="00_environment", WORK=str(tmp_path / "work"), WHEELS=str(tmp_path / "none"))
    proc = subprocess.run(["bash", "benchmarks/gpu_chapters_smoke.sh", "--dry-run", str(out)], cwd=REPO,
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((out / "dry-run-cpu-gpu-track.json").read_text())
    assert data["complete"] is True and list(data["chapters"]) == ["00_environment"]
    assert data["chapters"]["00_environment"]["error"] is None
    assert "no carried wheels" in (out / "chapters-smoke.log").read_text()
    plan = subprocess.run(["bash", "benchmarks/gpu_chapters_smoke.sh", "--plan", str(out)], cwd=REPO,
                          capture_output=True, text=True, env=env)
    assert "gpu_track.sh --smoke" in plan.stdout and "--install-only" in plan.stdout


def test_the_wheels_folder_is_ignored_and_fetched_for_the_gpu_machine():
    ignored = subprocess.run(["git", "check-ignore", "-q", ".gpu-wheels/bitsandbytes-0-py3-none-any.whl"], cwd=REPO)
    assert ignored.returncode == 0
    dry = subprocess.run(["make", "-n", "gpu-wheels"], cwd=REPO, capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr
    command = next(line for line in dry.stdout.replace("\\\n", " ").splitlines() if "pip download" in line)
    for flag in ("--no-deps", "--only-binary=:all:", "--python-version 3.12", "--platform manylinux_2_28_x86_64",
                 "--dest .gpu-wheels"):
        assert flag in command, flag
    wanted = {arg.split("==")[0] for arg in command.split() if "==" in arg}
    assert {"bitsandbytes", "diffusers", "papermill", "nbclient", "ipykernel", "ipywidgets"} <= wanted
    assert not wanted & {"torch", "numpy", "pyyaml", "pytest"}  # what the GPU machine has
