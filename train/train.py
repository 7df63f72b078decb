"""DDP training program; run it with torchrun (plain `python train.py` runs one process).

    torchrun --standalone --nproc_per_node=2 train/train.py --config train/configs/cpu-smoke.yaml \\
        --max-steps 100 --checkpoint-dir runs/ckpt --resume auto

Options (each flag is a shorthand for a config key; --set reaches every key):
  --config PATH            YAML config (default: configs/cpu-smoke.yaml beside this file)
  --max-steps N            run.max_steps: total optimizer steps to reach (a resumed run continues towards it)
  --steps N                run.steps: train N steps on top of the checkpoint resumed from (wins over --max-steps)
  --checkpoint-dir DIR     checkpoint.dir: ckpt-00000123.pt files (none: no checkpoints, no resume)
  --checkpoint-every N     checkpoint.every: save every N steps (always at the end); 0 = only at the end
  --keep-last K            checkpoint.keep_last: keep the newest K checkpoints; 0 = all
  --resume auto|never|PATH checkpoint.resume: newest valid checkpoint / start fresh / that checkpoint
  --output-dir DIR         metrics.output_dir: metrics.jsonl, summary.json (default: the checkpoint dir)
  --seed N                 run.seed
  --set SECTION.KEY=VALUE  any config key (value parsed as YAML), repeatable, e.g. --set ddp.comm_hook=fp16
  --print-config           print the resolved config as YAML and exit

Exit status: 0 done, 2 bad config or arguments (every rank, before any process group exists), 1 failure,
128+signal when stopped by SIGTERM/SIGINT (torchrun's stop; the process group is destroyed on the way out).
"""

import sys

from ddp_train import cli

if __name__ == "__main__":
    if (answered := cli.main(sys.argv[1:])) is not None:
        sys.exit(answered)
    from ddp_train.main import exit_with, main

    exit_with(main())
