"""The DDP training program's modules: config, data, models, DDP components, the loop, checkpoints, metrics and
the process group. train/train.py (run by torchrun) and `python -m ddp_train` start it; train/ beside this
package holds the scripts and configs."""
