"""One rank of HF Trainer under DistributedDataParallel (gloo, CPU), started by test_hf.py with
the torchrun environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): trains GPT-2 from a config
with strata's or torch's AdamW, saves or resumes, and writes its final weights."""

import argparse
import faulthandler
import os
import sys

import torch
import transformers

sys.path.insert(0, os.path.dirname(__file__))
from test_hf import Tokens, gpt2  # noqa: E402

import strata.hf  # noqa: E402
from strata.torch import OffloadedAdamW  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--optimizer", choices=["torch", "strata"], required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--save-steps", type=int, default=0)
    ap.add_argument("--resume", default=None)
    ap.add_argument("--callback", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    faulthandler.enable()  # an abort or a crash prints where each thread was
    rank = int(os.environ["RANK"])
    model = gpt2(args.seed)
    if args.optimizer == "torch":
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0, foreach=False)
    else:
        opt = OffloadedAdamW(model.parameters(), lr=3e-3, weight_decay=0.0, subgroup_size=4096, threads=1,
                             paths=[os.path.join(args.out, "state-{rank}")])
    targs = transformers.TrainingArguments(
        output_dir=os.path.join(args.out, "trainer"), per_device_train_batch_size=2, learning_rate=3e-3,
        lr_scheduler_type="constant", max_steps=args.steps, logging_steps=100, report_to=[], seed=0, use_cpu=True,
        ddp_backend="gloo", dataloader_num_workers=0, disable_tqdm=True, log_level="error",
        save_strategy="steps" if args.save_steps else "no", save_steps=args.save_steps or 500)
    trainer = transformers.Trainer(model=model, args=targs, train_dataset=Tokens(), optimizers=(opt, None),
                                   callbacks=[strata.hf.SaveShards()] if args.callback else None)
    try:
        trainer.train(resume_from_checkpoint=args.resume)
    except Exception as e:  # noqa: BLE001 (the test checks what was refused)
        with open(os.path.join(args.out, f"error-{rank}.txt"), "w") as f:
            f.write(f"{type(e).__name__}: {e}")
        return 3
    torch.save(model.state_dict(), os.path.join(args.out, f"weights-{rank}.pt"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
