"""The Python code of README.md, docs/getting-started.md, docs/pytorch.md and docs/distributed.md,
run as the pages show it.

Each `# doc-snippet: NAME` ... `# doc-snippet-end` region below is a Python block of those pages
(tools/check-docs.py checks that the page shows it unchanged); each test runs its region for real,
in a fresh directory, and asserts what the page says about it."""

import copy
import os
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import strata  # noqa: E402
from strata import _core  # noqa: E402
from strata.torch import OffloadedAdamW  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


def max_rel(a, b):
    return max(((x - y).abs().max() / x.abs().max()).item() for x, y in zip(a.parameters(), b.parameters()))


def small_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))


def batch(step):
    return torch.randn(8, 64, generator=torch.Generator().manual_seed(100 + step))


def train(model, opt, first, steps):
    for step in range(first, first + steps):
        model(batch(step)).square().mean().backward()
        opt.step()
        opt.zero_grad()


# --- Getting started ---------------------------------------------------------------------------


def test_the_five_line_usage_takes_a_step_with_its_state_under_both_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # doc-snippet: usage
    import torch, strata.torch
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.GELU(), torch.nn.Linear(512, 512))
    opt = strata.torch.OffloadedAdamW(model.parameters(), lr=1e-3, paths=["offload/nvme", "offload/pfs"], host_memory_budget=256 << 20)
    model(torch.randn(16, 512)).square().mean().backward()
    opt.step(); opt.zero_grad()
    # doc-snippet-end
    assert opt.stats()["steps"] == 1 and opt.native.step_count == 1
    assert opt.stats()["host_memory_peak"] <= 256 << 20
    assert sorted(t["name"] for t in opt.path_totals()) == ["offload/nvme", "offload/pfs"]
    assert all(t["bytes_written"] > 0 for t in opt.path_totals())  # the state is spread over both
    assert any(f.startswith("strata.0.") for f in os.listdir("offload/nvme"))
    assert any(f.startswith("strata.0.") for f in os.listdir("offload/pfs"))
    opt.close()


def test_other_rules_and_bf16_moments_take_the_same_arguments_as_torchs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model, twin = small_model(), small_model()
    # doc-snippet: other_rules
    from strata.torch import OffloadedLion, OffloadedSGD
    sgd = OffloadedSGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, paths=["sgd"])  # torch.optim.SGD's
    lion = OffloadedLion(twin.parameters(), lr=1e-4, betas=(0.9, 0.99), weight_decay=0.1, paths=["lion"])
    small = OffloadedAdamW(small_model().parameters(), lr=1e-3, state_dtype="bf16", paths=["adamw16"])
    print(small.native.state_format)  # [('exp_avg', 'bf16'), ('exp_avg_sq', 'bf16')]: 8 bytes a parameter, not 12
    tiny = OffloadedAdamW(small_model().parameters(), lr=1e-3, state_dtype="int8", paths=["adamw8"])
    print(tiny.native.state_format)  # [('exp_avg', 'q8'), ('exp_avg_sq', 'uq8')]: about 6 bytes a parameter
    # doc-snippet-end
    ref_model = small_model()
    ref = torch.optim.SGD(ref_model.parameters(), lr=0.1, momentum=0.9, nesterov=True, foreach=False)
    train(model, sgd, 0, 3)
    train(ref_model, ref, 0, 3)
    assert max_rel(ref_model, model) < 1e-6
    train(twin, lion, 0, 1)
    assert lion.native.rule == "lion" and small.native.rule == "adamw-bf16"
    assert small.native.state_format == [("exp_avg", "bf16"), ("exp_avg_sq", "bf16")]
    assert tiny.native.rule == "adamw-8bit" and tiny.native.state_format == [("exp_avg", "q8"), ("exp_avg_sq", "uq8")]
    for o in (sgd, lion, small):
        o.close()


# --- Training as torch.optim.AdamW does --------------------------------------------------------


def test_two_groups_a_scheduler_accumulation_and_clipping_agree_with_torch_adamw_to_1e_6(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(7)
    # doc-snippet: agreement
    def make_model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))

    def groups(m):  # weight decay on the weights only, half the rate for the biases
        return [{"params": [m[0].weight, m[2].weight], "weight_decay": 0.1},
                {"params": [m[0].bias, m[2].bias], "weight_decay": 0.0, "lr": 5e-3}]

    ref_model, model = make_model(), make_model()
    ref = torch.optim.AdamW(groups(ref_model), lr=1e-2, foreach=False)
    opt = OffloadedAdamW(groups(model), lr=1e-2, paths=["state"], subgroup_size=1000)  # subgroups cross parameters
    scheds = [torch.optim.lr_scheduler.OneCycleLR(o, max_lr=[1e-2, 5e-3], total_steps=10, cycle_momentum=False)
              for o in (ref, opt)]
    for step in range(10):
        micro_batches = [torch.randn(8, 64) for _ in range(2)]
        for net, o, sched in ((ref_model, ref, scheds[0]), (model, opt, scheds[1])):
            for x in micro_batches:  # gradient accumulation: two backwards, one step
                net(x).square().mean().backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5)
            o.step()
            o.zero_grad()
            sched.step()
    worst = max(((a - b).abs().max() / a.abs().max()).item() for a, b in zip(ref_model.parameters(), model.parameters()))
    print(f"largest difference: {worst:.1e} of a tensor's largest weight")
    # doc-snippet-end
    assert worst < 1e-6
    assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in ref.param_groups]
    assert opt.native.step_count == 10


def test_gradients_copied_during_backward_are_used_only_while_unchanged(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    # doc-snippet: handover
    model = torch.nn.Linear(64, 64)
    opt = OffloadedAdamW(model.parameters(), lr=1e-3, paths=["state"], handover="backward")
    x = torch.randn(8, 64)
    model(x).square().mean().backward()  # each gradient is copied to host memory as backward makes it
    opt.step()
    assert opt.handover_used == "backward"  # ... and step() used those copies
    assert opt.last_step_stats["handover"] == {"backward": 2, "step": 0, "none": 0}
    opt.zero_grad()
    model(x).square().mean().backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)  # changes every gradient after its copy
    opt.step()
    assert opt.handover_used == "step"  # ... so step() read each one again
    # doc-snippet-end
    torch.manual_seed(0)
    twin = torch.nn.Linear(64, 64)
    ot = OffloadedAdamW(twin.parameters(), lr=1e-3, paths=["twin"], handover="step")
    twin(x).square().mean().backward()
    ot.step()
    ot.zero_grad()
    twin(x).square().mean().backward()
    torch.nn.utils.clip_grad_norm_(twin.parameters(), 1e-3)
    ot.step()
    assert same(model, twin)  # every hand-over mode gives the same bits


def test_weights_written_into_the_model_between_steps_are_what_the_next_step_starts_from(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def run(make_opt):
        torch.manual_seed(0)
        model = torch.nn.Linear(32, 32)
        opt = make_opt(model)
        x = torch.randn(8, 32)
        # doc-snippet: truth
        model(x).square().mean().backward()
        opt.step(); opt.zero_grad()
        with torch.no_grad():
            model.weight.data.clamp_(-0.05, 0.05)  # through .data: no version counter sees it
        model(x).square().mean().backward()
        opt.step(); opt.zero_grad()  # updates the clamped weights, as torch's AdamW does
        # doc-snippet-end
        return model

    ref = run(lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2, foreach=False))
    mine = run(lambda m: OffloadedAdamW(m.parameters(), lr=1e-2, paths=["state"]))
    assert max_rel(ref, mine) < 1e-6


def test_frozen_parameters_hold_no_state_until_they_get_a_gradient_and_added_groups_start_then(tmp_path,
                                                                                              monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    # doc-snippet: frozen
    base = torch.nn.Linear(64, 64).requires_grad_(False)  # frozen: in param_groups, no state
    adapter = torch.nn.Linear(64, 64, bias=False)
    opt = OffloadedAdamW(base.parameters(), lr=1e-3, paths=["state"])
    opt.add_param_group({"params": [adapter.weight], "lr": 1e-2})  # LoRA-style, added later
    for step in range(3):
        x = torch.randn(8, 64)
        (base(x) + adapter(x)).square().mean().backward()
        opt.step(); opt.zero_grad()
    assert [s["numel"] for s in opt.segments] == [64 * 64]  # only the adapter holds state
    base.requires_grad_(True)  # unfrozen: its state starts at the next step, as in torch
    # doc-snippet-end
    before = base.weight.detach().clone()
    x = torch.randn(8, 64)
    (base(x) + adapter(x)).square().mean().backward()
    opt.step()
    assert [s["numel"] for s in opt.segments] == [64 * 64, 64 * 64 + 64]
    assert not torch.equal(before, base.weight)
    assert len(opt.param_groups) == 2


def test_mixed_dtypes_and_per_group_betas_make_one_segment_each(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    # doc-snippet: mixed
    emb = torch.nn.Embedding(100, 32)  # float32
    body = torch.nn.Linear(32, 32).to(torch.bfloat16)
    opt = OffloadedAdamW([{"params": [emb.weight]},
                          {"params": [body.weight, body.bias], "betas": (0.9, 0.95)}], lr=1e-3, paths=["state"])
    body(emb(torch.tensor([1, 2, 3])).bfloat16()).float().square().mean().backward()
    opt.step()
    for s in opt.segments:
        print(s["dtype"], s["numel"], s["prefix"])  # torch.float32 3200 strata.0, then torch.bfloat16 1056 strata.1
    # doc-snippet-end
    assert [(s["dtype"], s["numel"], s["prefix"]) for s in opt.segments] == [
        ("torch.float32", 3200, "strata.0"), ("torch.bfloat16", 1056, "strata.1")]
    master = torch.empty(1056)
    opt._segments[1].core.read_master(master)  # the bf16 weights are the fp32 master rounded
    assert torch.equal(torch.cat([p.detach().reshape(-1) for p in body.parameters()]), master.to(torch.bfloat16))


def test_a_scheduler_that_cycles_betas_is_a_config_error_before_any_update(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = small_model()
    before = [p.detach().clone() for p in model.parameters()]
    refused = None
    # doc-snippet: cycling
    opt = OffloadedAdamW(model.parameters(), lr=1e-3, paths=["state"])
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=100)  # cycles betas too
    model(torch.randn(8, 64)).square().mean().backward()
    try:
        opt.step()
    except strata.ConfigError as e:  # "... (a scheduler cycling momentum ... needs cycle_momentum=False)"
        refused = e
    # doc-snippet-end
    assert refused is not None and "cycle_momentum=False" in str(refused)
    assert opt.native.step_count == 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    del sched


# --- Checkpoints -------------------------------------------------------------------------------


def test_a_run_saved_with_torch_save_resumes_torch_equal_to_the_uninterrupted_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    make_model = small_model
    whole = make_model()
    train(whole, OffloadedAdamW(whole.parameters(), lr=1e-2, paths=["whole"]), 0, 6)
    model = make_model()
    opt = OffloadedAdamW(model.parameters(), lr=1e-2, paths=["state/nvme", "state/pfs"])
    train(model, opt, 0, 3)
    # doc-snippet: save
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, "run.pt")
    opt.close()  # releases the paths (the state files stay); or let the process end
    # doc-snippet-end
    name = torch.load("run.pt")["opt"]["strata"]["checkpoint"]
    assert name.startswith("step-000000003-")
    assert os.listdir("state/nvme/strata-checkpoints/" + name) == ["strata.0"]
    del model, opt
    make_model = lambda: small_model(seed=5)  # noqa: E731  (other weights: the checkpoint decides)
    # doc-snippet: resume
    model = make_model()
    opt = OffloadedAdamW(model.parameters(), lr=1e-2, paths=["state/nvme", "state/pfs"])
    saved = torch.load("run.pt")
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])  # checks the whole checkpoint before it gives up any state
    # doc-snippet-end
    assert opt.stats()["steps"] == 3
    train(model, opt, 3, 3)
    assert same(whole, model)


def test_keep_checkpoints_keeps_the_newest_and_an_older_dict_is_refused_by_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = small_model()
    # doc-snippet: keep
    opt = OffloadedAdamW(model.parameters(), lr=1e-3, paths=["nvme/job"], checkpoint_dir="pfs/job/ckpt",
                         keep_checkpoints=2)
    for step in range(1, 5):
        model(torch.randn(8, 64)).square().mean().backward()
        opt.step(); opt.zero_grad()
        torch.save(opt.state_dict(), f"opt-{step}.pt")
    print(sorted(os.listdir("pfs/job/ckpt")))  # its journal and the newest two: step-000000003-..., step-000000004-...
    # doc-snippet-end
    listing = sorted(os.listdir("pfs/job/ckpt"))
    assert listing[0] == ".strata-checkpoints.strata"
    assert [n[:15] for n in listing[1:]] == ["step-000000003-", "step-000000004-"]
    assert not os.path.exists("nvme/job/strata-checkpoints")
    with pytest.raises(strata.ConfigError, match="removed by keep_checkpoints"):
        opt.load_state_dict(torch.load("opt-1.pt"))
    again = opt.state_dict()  # nothing changed since the last save: nothing is written
    assert again["strata"]["checkpoint"] == torch.load("opt-4.pt")["strata"]["checkpoint"]
    assert sorted(os.listdir("pfs/job/ckpt")) == listing
    opt.load_state_dict(torch.load("opt-3.pt"))
    assert opt.native.step_count == 3


def test_a_fresh_optimizer_writes_no_checkpoint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = small_model()
    opt = OffloadedAdamW(model.parameters(), lr=1e-3, paths=["state"])
    assert opt.state_dict()["strata"]["checkpoint"] is None  # what accelerate asks when it wraps it
    assert not os.path.exists("state/strata-checkpoints")


def test_a_damaged_checkpoint_is_an_integrity_error_and_the_run_goes_on(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model, twin = small_model(), small_model()
    opt = OffloadedAdamW(model.parameters(), lr=1e-2, paths=["state"])
    ot = OffloadedAdamW(twin.parameters(), lr=1e-2, paths=["twin"])
    train(model, opt, 0, 2)
    train(twin, ot, 0, 2)
    sd = opt.state_dict()
    part = Path("state/strata-checkpoints") / sd["strata"]["checkpoint"] / "strata.0"
    data = next(f for f in part.iterdir() if f.suffix == ".bin")
    raw = bytearray(data.read_bytes())
    raw[100] ^= 1
    data.write_bytes(bytes(raw))
    refused = None
    # doc-snippet: damaged
    try:
        opt.load_state_dict(sd)
    except strata.IntegrityError as e:  # the checkpoint is damaged; the running state is as it was
        refused = e
    # doc-snippet-end
    assert refused is not None
    train(model, opt, 2, 2)
    train(twin, ot, 2, 2)
    assert same(model, twin)


def test_torch_state_dict_moves_a_run_to_torch_adamw_and_back(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = small_model()
    opt = OffloadedAdamW(model.parameters(), lr=1e-2, paths=["state"])
    train(model, opt, 0, 3)
    twin, twin2 = copy.deepcopy(model), copy.deepcopy(model)
    # doc-snippet: torch_format
    state = opt.torch_state_dict()  # torch.optim.AdamW's format: every moment in host memory
    torch_opt = torch.optim.AdamW(twin.parameters(), lr=1e-2, foreach=False)
    torch_opt.load_state_dict(state)  # torch's AdamW continues the run ...
    back = OffloadedAdamW(twin2.parameters(), lr=1e-2, paths=["state2"])
    back.load_state_dict(torch_opt.state_dict())  # ... and strata takes torch's state (the model's weights)
    # doc-snippet-end
    assert sorted(state["state"]) == [0, 1, 2, 3] and float(state["state"][0]["step"]) == 3
    train(model, opt, 3, 2)
    train(twin, torch_opt, 3, 2)
    train(twin2, back, 3, 2)
    assert max_rel(model, twin) < 1e-6 and max_rel(model, twin2) < 1e-6


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    """A real S3 server (tools/s3-server.sh) and its AWS_* variables, or a skip."""
    if not _core.has_s3:
        pytest.skip("this build of strata has no S3 tier")
    state = tmp_path_factory.mktemp("s3-server")
    subprocess.run(["bash", str(ROOT / "tools" / "s3-server.sh"), "start", str(state)], check=True)
    env_file = state / "env"
    if not env_file.exists():
        if os.environ.get("STRATA_REQUIRE_S3"):
            pytest.fail("no S3 server could be started (STRATA_REQUIRE_S3 is set)")
        pytest.skip("no S3 server (weed) on this machine")
    saved = dict(os.environ)
    env = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    os.environ.update({k: v for k, v in env.items() if k.startswith("AWS_")})
    try:
        yield env["S3_TEST_BUCKET"]
    finally:
        os.environ.clear()
        os.environ.update(saved)
        subprocess.run(["bash", str(ROOT / "tools" / "s3-server.sh"), "stop", str(state)], check=False)


@pytest.mark.s3
def test_state_and_checkpoints_go_into_a_bucket_beside_a_directory(tmp_path, monkeypatch, bucket):
    monkeypatch.chdir(tmp_path)
    model = small_model()
    # doc-snippet: s3
    opt = OffloadedAdamW(model.parameters(), lr=1e-3, paths=["nvme", f"s3://{bucket}/run/state"],
                         checkpoint_dir=f"s3://{bucket}/run/ckpt")
    model(torch.randn(8, 64)).square().mean().backward()
    opt.step()
    sd = opt.state_dict()  # the checkpoint goes into the bucket
    # doc-snippet-end
    assert all(t["bytes_written"] > 0 for t in opt.path_totals())
    assert sd["strata"]["checkpoint_dir"] == f"s3://{bucket}/run/ckpt"
    assert _core.verify_checkpoint(f"s3://{bucket}/run/ckpt/{sd['strata']['checkpoint']}/strata.0") == 1
    opt.close()


# --- Hugging Face --------------------------------------------------------------------------------


def test_trainer_takes_it_as_it_is_and_resumes_from_its_checkpoint_torch_equal(tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    import strata.hf

    monkeypatch.chdir(tmp_path)

    def gpt2(seed):
        torch.manual_seed(seed)
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=96, n_positions=32, n_embd=48, n_layer=2, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0))

    rows = torch.randint(0, 96, (32, 16), generator=torch.Generator().manual_seed(7))
    data = [{"input_ids": r, "labels": r} for r in rows]
    model = gpt2(0)
    # doc-snippet: hf_trainer
    args = transformers.TrainingArguments(output_dir="out", max_steps=4, save_steps=2, save_total_limit=2,
                                          per_device_train_batch_size=4, use_cpu=True, report_to=[])
    opt = OffloadedAdamW(model.parameters(), lr=args.learning_rate, paths=["state/nvme", "state/pfs"])
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, optimizers=(opt, None),
                                   callbacks=[strata.hf.SaveShards()])  # needed under DDP, harmless without
    trainer.train()
    # doc-snippet-end
    assert opt.stats()["steps"] == 4
    assert sorted(os.listdir("out")) == ["checkpoint-2", "checkpoint-4"]
    saved = sorted(n[:15] for n in os.listdir("state/nvme/strata-checkpoints") if n.startswith("step-"))
    assert saved == ["step-000000002-", "step-000000004-"]
    whole = model
    opt.close()
    model = gpt2(3)  # other weights: the checkpoint decides
    # doc-snippet: hf_resume
    opt = OffloadedAdamW(model.parameters(), lr=args.learning_rate, paths=["state/nvme", "state/pfs"])
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, optimizers=(opt, None),
                                   callbacks=[strata.hf.SaveShards()])
    trainer.train(resume_from_checkpoint="out/checkpoint-2")
    # doc-snippet-end
    assert same(whole, model)


# --- Memory, CUDA, errors, statistics -------------------------------------------------------------


def test_a_host_memory_budget_bounds_the_peak_and_cache_0_keeps_nothing_between_steps(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # doc-snippet: memory
    model = torch.nn.Linear(1024, 1024)  # 1,049,600 parameters: 12.6 MB of AdamW state in fp32
    default = OffloadedAdamW(model.parameters(), paths=["state-default"])
    assert default.stats()["host_memory_budget"] == 2 * 1049600  # a quarter of torch's two fp32 moments
    default.close()
    opt = OffloadedAdamW(model.parameters(), lr=1e-3, paths=["state"],
                         host_memory_budget=4 << 20,  # at most 4 MiB for the pipeline and the cache
                         cache=0)  # none of it keeps subgroups between steps
    for step in range(3):
        model(torch.randn(8, 1024)).square().mean().backward()
        opt.step(); opt.zero_grad()
    print(opt.stats()["host_memory_peak"])  # 442368: under 0.5 MB
    print(opt.last_step_stats["bytes_written"])  # 12595200: the whole state
    print(opt.last_step_stats["bytes_read"])  # 12595200, or less by the writes still landing
    # doc-snippet-end
    assert opt.stats()["host_memory_peak"] <= 4 << 20
    assert opt.last_step_stats["bytes_written"] == 12 * 1049600
    # Read back but for subgroups whose writes the last step left in flight and that this one
    # updates first (they stay in their pipeline slots).
    left = opt.last_step_stats["writes_left_bytes"]
    assert left > 0
    model(torch.randn(8, 1024)).square().mean().backward()
    opt.step()
    assert 12 * 1049600 - left <= opt.last_step_stats["bytes_read"] <= 12 * 1049600
    assert opt.last_step_stats["cache_hits"] == 0


@pytest.mark.cuda
def test_cuda_bf16_parameters_are_updated_in_place_from_the_fp32_master(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # doc-snippet: cuda
    model = torch.nn.Linear(256, 256).to("cuda", torch.bfloat16)
    opt = OffloadedAdamW(model.parameters(), lr=1e-3, paths=["state"])
    model(torch.randn(8, 256, device="cuda", dtype=torch.bfloat16)).float().square().mean().backward()
    opt.step()  # the gradients were copied to pinned host memory during backward
    assert opt.handover_used == "backward"
    # doc-snippet-end
    assert model.weight.is_cuda and opt.native.step_count == 1
    master = torch.empty(256 * 256 + 256)
    opt._segments[0].core.read_master(master)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()
    assert torch.equal(flat, master.to(torch.bfloat16))


def test_errors_are_typed_and_a_second_optimizer_shares_directories_by_prefix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model, other = small_model(), small_model()
    wrong_dtype = busy = None
    # doc-snippet: errors
    try:
        OffloadedAdamW(torch.nn.Linear(4, 4).double().parameters(), paths=["state"])
    except strata.ConfigError as e:  # also a ValueError: "... is torch.float64; strata keeps fp32 master weights ..."
        wrong_dtype = e
    first = OffloadedAdamW(model.parameters(), paths=["state"])
    try:
        OffloadedAdamW(other.parameters(), paths=["state"])  # the same directory and object prefix
    except strata.BusyError as e:
        busy = e
    second = OffloadedAdamW(other.parameters(), paths=["state"], object_prefix="other")  # shares "state"
    # doc-snippet-end
    assert isinstance(wrong_dtype, ValueError) and "torch.float64" in str(wrong_dtype)
    assert isinstance(busy, strata.Error) and "strata.0" in str(busy)
    assert second.segments[0]["prefix"] == "other.0"
    train(model, first, 0, 2)
    train(other, second, 0, 2)
    assert same(model, other)
    assert issubclass(strata.IOError, OSError) and issubclass(strata.ForeignFileError, strata.BusyError)
    assert issubclass(strata.Error, RuntimeError) and issubclass(strata.CudaError, strata.StreamError)
    for cls in (strata.CapacityError, strata.IntegrityError, strata.StreamError):
        assert issubclass(cls, strata.Error)


def test_stats_name_each_path_and_each_phase_of_the_last_step(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = small_model()
    opt = OffloadedAdamW(model.parameters(), lr=1e-3, paths=["nvme", "pfs"], cache=0)
    train(model, opt, 0, 2)
    # doc-snippet: stats
    for p in opt.path_totals():
        print(p["name"], p["bytes_read"], p["bytes_written"])  # since the optimizer was built
    last = opt.last_step_stats
    print(last["total_s"], last["read_wait_s"], last["compute_s"], last["write_wait_s"], last["handover"])
    print(opt.stats()["steps"], opt.stats()["cache_hits"], opt.native.step_count)
    # doc-snippet-end
    assert [p["name"] for p in opt.path_totals()] == ["nvme", "pfs"]
    # (a step may read nothing with cache=0: subgroups whose writes the last step left in flight
    # stay in their slots as the writes land; it writes the whole state)
    assert last["bytes_read"] == sum(s["bytes_read"] for s in last["segments"])
    assert last["bytes_written"] == sum(s["bytes_written"] for s in last["segments"]) > 0
    assert opt.stats()["steps"] == opt.native.step_count == 2


# --- torch.distributed (docs/distributed.md) ----------------------------------------------------------


def test_an_optimizer_built_before_init_process_group_takes_its_shard_and_rank_paths_from_torchrun(
        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for k, v in dict(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", STRATA_NODE_LIMITER_DIR=str(tmp_path / "limiters")).items():
        monkeypatch.setenv(k, v)
    model = torch.nn.Linear(256, 256)
    # doc-snippet: torchrun
    # started by torchrun (RANK, WORLD_SIZE, LOCAL_RANK set); built before init_process_group, as
    # Trainer and accelerate users build it
    opt = OffloadedAdamW(model.parameters(), lr=1e-3, paths=["nvme/strata-{local_rank}", "pfs/job"],
                         node_limiter_permits=2)
    # doc-snippet-end
    assert opt.sharded
    seg = opt.segments[0]
    assert seg["prefix"] == "strata.r1.0" and seg["share"][1] == seg["numel"] and 0 < seg["share"][0] < seg["numel"]
    assert os.path.isdir("nvme/strata-1")
    assert all(f.startswith(("strata.r1.", ".strata-")) for f in os.listdir("pfs/job"))
    assert all(p["node_limited"] for p in opt._options["paths"]) and opt._options["node_limiter_permits"] == 2
    opt.close()
