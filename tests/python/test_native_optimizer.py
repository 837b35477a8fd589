"""strata.Optimizer, the native optimizer over flat parameters: a step declared before backward
(begin_step) updates each subgroup as its gradients are all handed over, bit-identically to the
step after backward."""

import pytest
import torch

import strata


def make(tmp_path, name, early, n, sg):
    weights = torch.linspace(-1.0, 1.0, n)
    return strata.Optimizer.create(weights, preset="strata", paths=[str(tmp_path / name)], subgroup_size=sg,
                                   cache_subgroups=1, threads=2, update_as_gradients_land=early)


def test_begin_step_updates_subgroups_as_gradients_land_bit_identically_to_the_step_after_backward(tmp_path):
    n, sg = 6 * 4096, 4096
    a, b = make(tmp_path, "a", True, n, sg), make(tmp_path, "b", False, n, sg)
    try:
        model_a, model_b = torch.zeros(n, dtype=torch.bfloat16), torch.zeros(n, dtype=torch.bfloat16)
        gen = torch.Generator().manual_seed(3)
        for t in range(4):
            grads = torch.randn(n, generator=gen)
            lr = 1e-3 * (t + 1)
            a.begin_step(lr, model_a)
            for first in reversed(range(0, n, sg)):  # as backward hands them over: the last layers first
                a.accept_gradients(first, grads[first:first + sg])
                b.accept_gradients(first, grads[first:first + sg])
            sa, sb = a.step(lr, None, model_a), b.step(lr, None, model_b)
            assert sa["early_updates"] == 6  # every subgroup landed before step(): updated by then
            assert sb["early_updates"] == 0
            assert sa["subgroups"] == sb["subgroups"] == 6
            assert torch.equal(model_a, model_b)
        ma, mb = torch.empty(n), torch.empty(n)
        a.read_master(ma)
        b.read_master(mb)
        assert torch.equal(ma, mb)
    finally:
        a.close()
        b.close()


def test_begin_step_refuses_a_second_declaration_and_a_step_with_other_rates(tmp_path):
    n, sg = 2 * 4096, 4096
    a = make(tmp_path, "a", True, n, sg)
    try:
        a.begin_step(1e-3)
        with pytest.raises(strata.ConfigError, match="declared already"):
            a.begin_step(1e-3)
        for first in range(0, n, sg):
            a.accept_gradients(first, torch.ones(sg))
        with pytest.raises(strata.ConfigError, match="declared"):
            a.step(2e-3)
        assert a.step(1e-3)["subgroups"] == 2
    finally:
        a.close()
