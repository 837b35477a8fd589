#!/usr/bin/env bash
# How close strata.torch.OffloadedAdamW trains to torch.optim.AdamW in each setup the Python tests
# cover (clipping, GradScaler, accumulation, model writes, frozen and skipped parameters, mixed
# dtypes, HF Trainer and accelerate, DDP, FSDP2): runs tests/python with the torch of PYTHON and
# prints, per test, the largest |strata - torch| / max |torch| over its tensors; then each rank's
# share of the state under DDP (examples/python/ddp.py, 2 and 3 ranks).
#
#   bench/scripts/torch_agreement.sh [PYTHON] [BUILD]     (defaults: .venv/bin/python, build/default)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
py=${1:-$root/.venv/bin/python}
build=${2:-$root/build/default}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export PYTHONPATH=$build/python PYTHONDONTWRITEBYTECODE=1
"$py" -c 'import sys, torch; print(f"python {sys.version.split()[0]} torch {torch.__version__}")'
STRATA_AGREEMENT_JSON=$out/agreement.json "$py" -m pytest -q -p no:cacheprovider -m "not cuda" \
  "$root/tests/python" >"$out/pytest.log" 2>&1 || { tail -30 "$out/pytest.log"; exit 1; }
tail -1 "$out/pytest.log"
"$py" - "$out/agreement.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
width = max(len(k.split("::", 1)[-1]) for k in rows)
print(f"{'test':<{width}}  largest difference from torch's AdamW")
for k, v in sorted(rows.items(), key=lambda kv: kv[0].split("::", 1)[-1]):
    print(f"{k.split('::', 1)[-1]:<{width}}  {v:.2e}")
PY
for ranks in 2 3; do
  echo "examples/python/ddp.py --ranks $ranks --width 256 --steps 4:"
  "$py" "$root/examples/python/ddp.py" --ranks "$ranks" --width 256 --steps 4 --dir "$out/ddp-$ranks"
done
