"""With no options, a step of strata.torch.OffloadedAdamW takes less resident memory than one of
torch.optim.AdamW on the same model: bench/scripts/torch_memory.py runs each in a fresh process
and splits the peak; strata's own share stays within its budget, which the model sets."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

BENCH = Path(__file__).resolve().parents[2] / "bench" / "scripts" / "torch_memory.py"


def test_a_step_with_default_options_needs_less_memory_than_torch_adamw(tmp_path):
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pytest.skip("this kernel does not let a process reset its peak RSS (/proc/self/clear_refs)")
    out = tmp_path / "memory.json"
    # glibc's dynamic mmap threshold would serve 16 MiB gradients from a heap whose holes vary from
    # run to run in either process: map them one by one so the peaks repeat to about 1 MB.
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
    subprocess.run([sys.executable, str(BENCH), "--params", "2e7", "--dtype", "float32", "--steps", "2",
                    "--threads", "2", "--dir", str(tmp_path / "state"), "--json", str(out)], env=env, check=True,
                   timeout=300)
    r = json.loads(out.read_text())["results"]
    t, s = r["torch"], r["strata"]
    assert s["opt_bytes"] <= s["opt_budget"] <= s["model_bytes"] // 2  # a quarter of torch's state by default
    assert s["step_peak"] <= t["step_peak"]
    # At least half the saving the budget promises (torch's moments minus strata's budget), where the
    # noise is about 1 MB; and no copy of the model or its gradients in the front (its rest).
    assert s["step_peak"] <= t["step_peak"] - (t["opt_bytes"] - s["opt_budget"]) // 2
    assert s["rest"] - t["rest"] <= 16 << 20
