"""The five-line PyTorch usage that README.md and docs/getting-started.md show (the region below,
which tools/check-docs.py holds those pages to) runs as it stands and trains."""

import os

import pytest

torch = pytest.importorskip("torch")


def test_the_five_line_usage_steps_and_keeps_its_state_under_its_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # doc-snippet: usage
    import torch, strata.torch
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.GELU(), torch.nn.Linear(512, 512))
    opt = strata.torch.OffloadedAdamW(model.parameters(), lr=1e-3, paths=["offload/nvme", "offload/pfs"], host_memory_budget=256 << 20)
    model(torch.randn(16, 512)).square().mean().backward()
    opt.step(); opt.zero_grad()
    # doc-snippet-end
    assert opt.native.step_count == 1
    assert opt.stats()["host_memory_peak"] <= 256 << 20
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())  # (torch 1.13 zeroes them)
    assert sorted(os.listdir(tmp_path / "offload")) == ["nvme", "pfs"]
    opt.close()
