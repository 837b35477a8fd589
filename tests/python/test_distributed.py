"""strata.torch.OffloadedAdamW under torch.distributed (gloo, 2 and 3 ranks on this machine): each
rank holds and updates one shard of the state (ZeRO-1) and every rank's model matches DDP +
torch.optim.AdamW's; a checkpoint of every rank's shard resumes exactly on the same world size and
is refused, naming both sizes, on another; FSDP2's DTensor shards are offloaded as they are."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("this torch has no torch.distributed", allow_module_level=True)

from front_helpers import record  # noqa: E402

WORKER = Path(__file__).with_name("dist_worker.py")
REL = 1e-6


def run(scenario, world, tmp_path, timeout=240):
    tmp_path.mkdir(parents=True, exist_ok=True)
    init = f"file://{tmp_path}/rendezvous-{scenario}-{world}"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(WORKER), scenario, "--rank", str(r), "--world", str(world),
                               "--init", init, "--dir", str(tmp_path)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(world)]
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:  # (a rank that hangs must not outlive the test)
            if p.poll() is None:
                p.kill()
    # Every rank that failed, with its exit code (a rank stuck at the last barrier is often the
    # symptom of another one that died first).
    failed = [f"rank {r} of {scenario} exited {p.returncode}:\n{text}"
              for r, (p, text) in enumerate(zip(procs, outputs)) if p.returncode != 0]
    assert not failed, "\n".join(failed)
    out = [json.loads((tmp_path / f"{scenario}-{r}.json").read_text()) for r in range(world)]
    for o in out:
        if "max_rel" in o:
            record(o["max_rel"])
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_ddp_with_a_sharded_state_trains_as_ddp_with_torch_adamw_at_one_shard_a_rank(tmp_path, world):
    out = run("ddp", world, tmp_path)
    numel = out[0]["numel"]
    subgroup = out[0]["segments"][0]["subgroup_size"]
    shares = [o["segments"][0]["share"] for o in out]
    assert shares[0][0] == 0 and shares[-1][1] == numel
    assert all(a[1] == b[0] for a, b in zip(shares, shares[1:]))  # contiguous, every parameter once
    for o, (lo, hi) in zip(out, shares):
        assert o["max_rel"] < REL and o["same"]
        assert abs((hi - lo) - numel / world) <= subgroup  # 1/N of the state, within one subgroup
        assert o["handover"] == "step"
        assert o["files"] and all(f.startswith(f"strata.r{out.index(o)}.") for f in o["files"])


def test_ddp_shards_resume_exactly_on_the_same_world_and_are_refused_on_another(tmp_path):
    run("ddp", 2, tmp_path)  # the uninterrupted run's weights
    saved = run("save", 2, tmp_path)
    name = saved[0]["checkpoint"]
    assert name.startswith("step-000000003-") and saved[1]["checkpoint"] == name  # (the ranks agree on it)
    assert sorted(os.listdir(tmp_path / "ck" / name)) == ["strata.r0.0", "strata.r1.0"]  # one part a rank
    resumed = run("resume", 2, tmp_path)
    assert all(o.get("equal") for o in resumed), resumed
    three = tmp_path / "three"
    three.mkdir()
    (three / "run.pt").write_bytes((tmp_path / "run.pt").read_bytes())
    refused = run("resume_other_world", 3, three)
    for o in refused:
        assert o["error"] == "ConfigError"
        assert "saved by 2 ranks" in o["message"] and "this run has 3" in o["message"]


def test_an_optimizer_built_before_the_process_group_shards_by_torchrun_s_environment(tmp_path):
    out = run("built_before_init", 2, tmp_path)
    assert [o["share"][0] for o in out] == [0, out[0]["share"][1]]
    for o in out:
        assert o["max_rel"] < REL and o["same"]
        assert o["node_limited"]  # the ranks of a node share the node-wide I/O limiter


def test_a_parameter_with_a_gradient_on_one_rank_only_gets_state_on_every_rank(tmp_path):
    out = run("join_on_one_rank", 2, tmp_path, timeout=120)
    assert [o["segments"] for o in out] == [2, 2]
    assert all(o["same"] for o in out)


def test_strata_s_own_clipping_with_a_whole_state_on_every_rank_takes_the_norm_of_the_all_reduced_gradients(
        tmp_path):
    for o in run("replicated_clip", 2, tmp_path):
        assert o["max_rel"] < REL and o["same"] and o["clip"] < 1


def test_every_rank_scales_the_loss_alike_also_one_without_a_share(tmp_path):
    out = run("scaling_empty_share", 2, tmp_path)
    assert sorted(o["share"][1] - o["share"][0] for o in out) == [0, 72]  # one rank holds nothing
    assert out[0]["scales"] == out[1]["scales"] == [1024.0, 1024.0, 1024.0, 512.0]


def test_without_ddp_each_rank_updates_its_shard_and_every_model_matches(tmp_path):
    for o in run("no_ddp", 2, tmp_path):
        assert o["max_rel"] < REL and o["same"]


def test_fsdp2_dtensor_shards_are_offloaded_as_they_are(tmp_path):
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    if (major, minor) < (2, 4):
        pytest.skip(f"torch {torch.__version__} has no FSDP2 (fully_shard, torch >= 2.4)")
    out = run("fsdp2", 2, tmp_path)
    for o in out:
        assert o["max_rel"] < REL
        assert sum(s["numel"] for s in o["segments"]) == o["local_numel"]
        assert o["restored"]
    assert out[0]["parts"] == out[1]["parts"] == ["strata.r0.0", "strata.r0.1", "strata.r1.0", "strata.r1.1"] or \
        all(p.startswith("strata.r") for p in out[0]["parts"])
