"""The README's PyTorch usage block runs as it stands and trains."""

import os
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

README = Path(__file__).resolve().parents[2] / "README.md"


def _block(marker):
    text = README.read_text()
    m = re.search(re.escape(marker) + r"\s*```python\n(.*?)```", text, re.S)
    assert m, f"README.md has no python block after {marker!r}"
    return m.group(1)


def test_readme_pytorch_usage_runs_and_updates_the_model(tmp_path, monkeypatch):
    code = _block("<!-- test: pytorch usage -->")
    assert len(code.strip().splitlines()) == 5
    monkeypatch.chdir(tmp_path)
    scope = {}
    exec(compile(code, str(README), "exec"), scope)
    opt, model = scope["opt"], scope["model"]
    assert opt.native.step_count == 1
    assert opt.stats()["host_memory_peak"] <= 256 << 20
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())  # (torch 1.13 zeroes them)
    assert sorted(os.listdir(tmp_path / "offload")) == ["nvme", "pfs"]
    opt.close()
