"""Loose inputs the front refuses as strata.ConfigError (a ValueError too), naming the input, before
anything is made on disk: hyper-parameters that are not numbers in torch's ranges, paths that are
not directories or s3:// prefixes, a STRATA_* variable set but empty."""

import pytest

torch = pytest.importorskip("torch")

import strata  # noqa: E402
from front_helpers import make_model, strata_opt  # noqa: E402

pytestmark = pytest.mark.reliability


@pytest.mark.parametrize("option, value, message", [
    ("lr", "abc", "lr is 'abc', not a number"),
    ("lr", -1e-3, "lr is -0.001; it must be >= 0.0"),
    ("lr", float("nan"), "lr is nan"),
    ("eps", None, "eps is None, not a number"),
    ("weight_decay", "0.1", "weight_decay is '0.1', not a number"),
    ("betas", (0.9, "x"), r"betas\[1\] is 'x', not a number"),
    ("betas", (0.9, 1.0), r"betas\[1\] is 1.0; it must be in \[0.0, 1.0\)"),
    ("betas", "ab", "betas must be two numbers"),
])
def test_a_hyper_parameter_that_is_not_a_number_in_range_is_a_config_error(tmp_path, option, value, message):
    with pytest.raises(strata.ConfigError, match=message):
        strata_opt(make_model(), tmp_path, **{option: value})
    assert not list(tmp_path.iterdir())  # refused before any path was made


def test_a_param_group_with_a_bad_lr_is_refused_and_not_added(tmp_path):
    model = make_model()
    opt = strata_opt(model, tmp_path, params=[{"params": [model[0].weight]}])
    with pytest.raises(strata.ConfigError, match="group 1's lr is 'fast', not a number"):
        opt.add_param_group({"params": [model[0].bias], "lr": "fast"})
    assert len(opt.param_groups) == 1


def test_a_scheduler_that_sets_a_bad_lr_is_a_config_error_at_step(tmp_path):
    model = make_model()
    opt = strata_opt(model, tmp_path)
    model(torch.ones(1, model[0].in_features)).sum().backward()
    opt.param_groups[0]["lr"] = "oops"
    with pytest.raises(strata.ConfigError, match="group 0's lr is 'oops', not a number"):
        opt.step()


@pytest.mark.parametrize("path, message", [
    ("s3:/x", "'s3:/x' is not an object store URL"),
    ("https://host/x", "is a URL of a kind strata does not take"),
    ("", "the path is empty"),
])
def test_a_path_that_is_neither_a_directory_nor_an_s3_prefix_is_a_config_error(tmp_path, monkeypatch, path, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(strata.ConfigError, match=message):
        strata_opt(make_model(), tmp_path, paths=[path])
    assert not list(tmp_path.iterdir())  # no folder "s3:" or "https:"


def test_an_empty_strata_variable_is_a_config_error_even_when_the_run_does_not_read_it(tmp_path, monkeypatch):
    monkeypatch.setenv("STRATA_NODE_LIMITER_DIR", "")
    with pytest.raises(strata.ConfigError, match="STRATA_NODE_LIMITER_DIR is set but empty"):
        strata_opt(make_model(), tmp_path)
