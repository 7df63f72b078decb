"""The launcher: what a user runs on the controller (`ddp train`, `ddp status`, ... or the make targets).

Modules, each with one job:
  cli       the `ddp` command: one subcommand per user action, each with --help
  contract  what the nodes' runner prints and run.json holds: the report kinds and the record's version
  control   runs under control from any terminal (status, logs, stop, runs, report) and the Ansible runner
  train     a run's launch and its account on screen (`ddp train`, `make train`)
  doctor    is the cluster fit to train? (`ddp doctor`)
  bench     the figures of merit (`ddp bench`)
  report    a run's report.html
"""
