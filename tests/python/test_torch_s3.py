"""strata.torch with an object store: a run with one directory and one s3:// path, checkpoints into
a bucket that resume bit for bit, keep_checkpoints in a bucket. Against a real S3 server
(SeaweedFS's `weed mini`, started on 127.0.0.1 by tools/s3-server.sh for this module and stopped
after), with the same AWS_* variables as the C++ tools."""

import os
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import strata  # noqa: E402
from strata import _core  # noqa: E402
from front_helpers import make_model, same, strata_opt, train  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.s3


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    if not _core.has_s3:
        pytest.skip("this build of strata has no S3 tier (libcurl and libcrypto were not found)")
    state = tmp_path_factory.mktemp("s3-server")
    subprocess.run(["bash", str(ROOT / "tools" / "s3-server.sh"), "start", str(state)], check=True)
    env_file = state / "env"
    if not env_file.exists():
        if os.environ.get("STRATA_REQUIRE_S3"):
            pytest.fail("no S3 server could be started (STRATA_REQUIRE_S3 is set)")
        pytest.skip("no S3 server (weed) on this machine: tools/install-deps.sh installs one")
    saved = dict(os.environ)
    env = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    os.environ.update({k: v for k, v in env.items() if k.startswith("AWS_")})
    try:
        yield env["S3_TEST_BUCKET"]
    finally:
        os.environ.clear()
        os.environ.update(saved)
        subprocess.run(["bash", str(ROOT / "tools" / "s3-server.sh"), "stop", str(state)], check=False)


def test_a_run_with_a_directory_and_a_bucket_checkpoints_into_the_bucket_and_resumes_exactly(tmp_path, s3):
    whole = make_model()
    train(whole, strata_opt(whole, tmp_path / "whole"), 6)

    paths = [tmp_path / "nvme", f"s3://{s3}/live"]
    part = make_model()
    op = strata_opt(part, tmp_path, paths=paths, checkpoint_dir=f"s3://{s3}/ck", cache=0)
    train(part, op, 3)
    assert all(t["bytes_written"] > 0 for t in op.path_totals())  # both paths hold state
    sd = op.state_dict()
    assert sd["strata"]["checkpoint"].startswith("step-000000003-")
    assert sd["strata"]["checkpoint_dir"] == f"s3://{s3}/ck"
    torch.save({"model": part.state_dict(), "opt": sd}, tmp_path / "run.pt")
    op.close()

    saved = torch.load(tmp_path / "run.pt")
    resumed = make_model(seed=6)
    resumed.load_state_dict(saved["model"])
    orr = strata_opt(resumed, tmp_path, paths=paths, checkpoint_dir=f"s3://{s3}/ck")
    orr.load_state_dict(saved["opt"])
    assert orr.native.step_count == 3
    train(resumed, orr, 3, first=3)
    assert same(whole, resumed)
    orr.close()


def test_keep_checkpoints_removes_this_run_s_older_checkpoints_from_the_bucket(tmp_path, s3):
    model = make_model()
    ck = f"s3://{s3}/keep"
    opt = strata_opt(model, tmp_path, paths=[tmp_path / "nvme"], checkpoint_dir=ck, keep_checkpoints=2)
    names = []
    for t in range(3):
        train(model, opt, 1, first=t)
        names.append(opt.state_dict()["strata"]["checkpoint"])
    with pytest.raises(strata.Error):
        _core.verify_checkpoint(f"{ck}/{names[0]}/strata.0")
    assert _core.verify_checkpoint(f"{ck}/{names[1]}/strata.0") == 2
    assert _core.verify_checkpoint(f"{ck}/{names[2]}/strata.0") == 3
