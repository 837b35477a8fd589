"""Shared fixtures of the Python front's tests. With STRATA_CUDA_TESTS=1 (the `cuda` ctest
entry) a machine without a CUDA device ends the session with 77, which ctest reports as skipped."""

import os

import pytest


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("STRATA_CUDA_TESTS") == "1" and not _cuda_available():
        session.exitstatus = 77
    # bench/scripts/torch_agreement.sh: each test's largest difference from torch's AdamW.
    out = os.environ.get("STRATA_AGREEMENT_JSON")
    if out:
        import json
        import sys

        helpers = sys.modules.get("front_helpers")
        with open(out, "w") as f:
            json.dump(getattr(helpers, "AGREEMENT", {}), f, indent=1, sort_keys=True)


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="torch sees no CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
