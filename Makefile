# Entry points for users and CI. `make help` lists them.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

ROOT := $(abspath .)
VENV := $(ROOT)/.venv
BIN := $(VENV)/bin
ifeq ($(findstring $(BIN):,$(PATH)),)
export PATH := $(BIN):$(PATH)
endif
export DDP_REPO_ROOT := $(ROOT)
export ANSIBLE_CONFIG := $(ROOT)/ansible.cfg
# One id per make command, inherited by its sub-makes: every test host, test network, shared directory and VM
# set the command creates carries it, so two commands (two roles, or one role twice) run side by side and each
# cleans up only its own (molecule/testrun.sh). Set DDP_TEST_RUN to choose it.
ifeq ($(DDP_TEST_RUN),)
DDP_TEST_RUN := t$(shell od -An -N4 -tx1 /dev/urandom | tr -d ' \n')
endif
export DDP_TEST_RUN

INVENTORY ?= inventory/local
RESUME ?= auto
# More playbook variables for `make train`, as ansible-playbook -e takes them: EXTRA_VARS="train_steps=500",
# EXTRA_VARS='{"train_program_args": ["a", "b"]}' or EXTRA_VARS=@vars.yml
ROLE ?=
# Roles whose scenarios `make test` runs, in dependency order (nfs_client's scenario runs on QEMU VMs and
# covers nfs_server too). A role joins this list once its scenarios pass on a clean clone.
MOLECULE_ROLES ?= ca_trust ssh_mesh firewall nfs_client gpu_stack docker slurm train_image train
# `make test` runs two lanes at once: lint, unit and the container roles; and the image builds, the roles on QEMU
# VMs, e2e, then the container roles in AFTER_E2E_ROLES, so that both lanes end about together (docs/testing.md
# has the times). A third lane only made every stage slower on 2 cores. Test runs never collide (molecule/testrun.sh).
VM_ROLES := nfs_client
AFTER_E2E_ROLES := slurm docker ca_trust
CONTAINER_ROLES := $(filter-out $(VM_ROLES) $(AFTER_E2E_ROLES),$(MOLECULE_ROLES))

.PHONY: help setup lint unit molecule molecule-all test-hosts test train status logs stop runs report doctor envs envs-prune bench bench-scale gpu-check mutate bench-comm clean-test-hosts lab lab-down e2e

help: ## List the targets
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

setup: $(VENV)/.installed ## Create .venv with the pinned toolchain (quick when already done)

$(VENV)/.installed: requirements.txt constraints.txt pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements.txt -c constraints.txt
	@# The launcher's `ddp` command; editable, so the source tree is what runs. Its dependencies came above.
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

lint: setup ## yamllint, ansible-lint (production profile), ruff
	yamllint --strict .
	ansible-lint --profile production
	ruff check .
	ruff format --check .

unit: setup ## pytest on the controller (train/, helpers, inventory logic); installs Chromium and iperf3 if absent
	tests/host/ensure-tools.sh
	tests/run-pytest.sh tests/unit --durations=15

test-hosts: setup ## Docker engine up, systemd test-host images built (only when their recipe changed)
	@# Under a lock: scenarios started together (make test's lanes) must not build twice. --close: the docker
	@# daemon this may start must not inherit (and hold) the lock.
	flock --close /tmp/ddp-test-hosts.lock bash -c 'tests/host/ensure-docker.sh && \
	  molecule/images/build.sh debian12 debian13'

molecule: setup test-hosts ## Run every scenario of one role: make molecule ROLE=ssh_mesh
	@test -n "$(ROLE)" || { echo "usage: make molecule ROLE=<role>  (roles: $(MOLECULE_ROLES))"; exit 2; }
	@test -d ansible/roles/$(ROLE)/molecule || { echo "role '$(ROLE)' has no molecule scenarios"; exit 2; }
	@# A make of its own removes its whole run afterwards; inside a larger run (make test), only the role's hosts.
	trap '$(ROOT)/molecule/cleanup.sh $(if $(filter 0,$(MAKELEVEL)),,$(ROLE))' EXIT; molecule/run-role.sh $(ROLE)

molecule-all: setup test-hosts ## Run the scenarios of every role
	@$(if $(filter 0,$(MAKELEVEL)),trap '$(ROOT)/molecule/cleanup.sh' EXIT;) \
	for role in $(MOLECULE_ROLES); do \
	  tests/stage.sh "molecule $$role" $(MAKE) --no-print-directory molecule ROLE=$$role || exit 1; \
	done

test: setup ## Everything CI runs, in two lanes at once: lint, unit, container roles | image builds, VM roles, e2e, slurm
	@# The host's own apt installs first, alone: the VM lane installs with apt too, and dpkg takes one at a time.
	tests/host/ensure-tools.sh
	@# The VM lane, the longest, starts at once: its image builds mostly wait on the Debian mirror, beside lint and
	@# unit. The container roles wait for the test-host images under test-hosts' lock if the builds still run.
	trap molecule/cleanup.sh EXIT; tests/lanes.sh \
	  containers "tests/stage.sh lint $(MAKE) --no-print-directory lint && \
	              tests/stage.sh unit $(MAKE) --no-print-directory unit && \
	              $(MAKE) --no-print-directory molecule-all MOLECULE_ROLES='$(CONTAINER_ROLES)'" \
	  vms "tests/stage.sh hosts $(MAKE) --no-print-directory test-hosts vm-images && \
	       $(MAKE) --no-print-directory molecule-all MOLECULE_ROLES='$(VM_ROLES)' && \
	       tests/stage.sh e2e $(MAKE) --no-print-directory e2e && \
	       $(MAKE) --no-print-directory molecule-all MOLECULE_ROLES='$(AFTER_E2E_ROLES)'"

clean-test-hosts: ## Remove every test run's test hosts, networks and shared directories left behind
	molecule/cleanup.sh --all

# PROGRAM, ARGS, WORKDIR, JOB, DATA, REQUIREMENTS and EXTRA_VARS reach the recipe through the environment (make exports what the
# command line sets), so that quotes, spaces and JSON in them arrive untouched.
train: setup ## Train on INVENTORY (default: inventory/local); RESUME=auto|never; PROGRAM=x.py ARGS='..' [WORKDIR JOB DATA=dir[:name] REQUIREMENTS=f DETACH=1 WAIT=1]
	$(BIN)/ddp train --inventory "$(INVENTORY)" --resume "$(RESUME)" \
	  $${PROGRAM:+--program "$$PROGRAM"} $${ARGS:+--args "$$ARGS"} $${WORKDIR:+--workdir "$$WORKDIR"} \
	  $${JOB:+--job "$$JOB"} $${DATA:+--data "$$DATA"} $${REQUIREMENTS:+--requirements "$$REQUIREMENTS"} \
	  $${EXTRA_VARS:+--extra-vars "$$EXTRA_VARS"} $(if $(filter 1 true yes,$(DETACH)),--detach) \
	  $(if $(filter 1 true yes,$(WAIT)),--wait)

# A run under control from any terminal; RUN defaults to the newest run (make runs lists them).
status: setup ## Each node's state, heartbeat age, the master's step/loss/throughput and ETA: [RUN=id] [EXTRA_VARS=..]
	$(BIN)/ddp status $${RUN:+--run "$$RUN"} $${EXTRA_VARS:+--extra-vars "$$EXTRA_VARS"}

logs: setup ## The nodes' logs, prefixed by node: [RUN=id] [NODE=name] [FOLLOW=1]
	$(BIN)/ddp logs $${RUN:+--run "$$RUN"} $${NODE:+--node "$$NODE"} \
	  $(if $(filter 1 true yes,$(FOLLOW)),--follow)

stop: setup ## Stop a run on every node, then collect it: [RUN=id] [EXTRA_VARS=..]
	$(BIN)/ddp stop $${RUN:+--run "$$RUN"} $${EXTRA_VARS:+--extra-vars "$$EXTRA_VARS"}

runs: setup ## One line per run: id, job, status, steps, final loss, samples/s, duration, code, env, owner
	$(BIN)/ddp runs

doctor: setup ## Versions, interfaces, TCP per node pair, allreduce sweep, known log failures -> verdicts: [INVENTORY]
	$(BIN)/ddp doctor --inventory "$(INVENTORY)" $${EXTRA_VARS:+--extra-vars "$$EXTRA_VARS"}

envs: setup ## The job environments on shared storage: key, size, last use, runs, packages
	$(BIN)/ddp envs --inventory "$(INVENTORY)"

envs-prune: setup ## Remove the job environments no launch used for DAYS days (default 30), but those of running runs
	$(BIN)/ddp envs --inventory "$(INVENTORY)" --prune-days "$(or $(DAYS),30)"

bench: setup ## Figures of merit p1-p4, p6 (allreduce/link, scaling, no-op rerun, checkpoint stall, launch) -> bench.json
	$(BIN)/ddp bench --inventory "$(INVENTORY)"

report: setup ## Rebuild a run's report.html (plots, settings, versions): [RUN=id] [COMPARE=other id]
	$(BIN)/ddp report $${RUN:+--run "$$RUN"} $${COMPARE:+--compare "$$COMPARE"}

mutate: setup ## Mutation check, by hand: [MODULE=filters|ddp_node|train|checkpoint|..] [MAX=N]; prints survivors
	nice -n 10 $(BIN)/python tests/mutate.py $(if $(MODULE),--module $(MODULE)) $(if $(MAX),--max-mutants $(MAX))

bench-scale: setup test-hosts ## By hand: site.yml's container-tier stages on 2, 4, 8 test hosts [NODES='2 4 8' STAGES=..]
	trap molecule/cleanup.sh EXIT; DDP_TEST_NET=$$(molecule/testrun.sh network) \
	  $(BIN)/python tests/scale/bench_scale.py $(if $(NODES),--nodes $(NODES)) $(if $(STAGES),--stages $(STAGES))

gpu-check: setup ## On a machine with NVIDIA GPUs: nccl sweep, bf16/fp16+GradScaler/PowerSGD runs, MFU (< 8 min)
	$(BIN)/python train/gpu_check.py

bench-comm: setup ## Allreduce benchmark with 2 local processes
	OMP_NUM_THREADS=1 $(BIN)/torchrun --standalone --nproc_per_node=2 train/bench_allreduce.py

# --- VM tier (nfs) ---
# QEMU VMs with the Debian 12 distribution kernel, for what containers cannot do (kernel NFS). The VM
# scenario also runs in `make molecule ROLE=nfs_client` (and molecule-all); these targets run the tier alone.
.PHONY: vm-images vm-test vm-clean

vm-images: ## QEMU installed when absent, the Debian 12 VM image built (only when its recipe changed)
	molecule/vm/ensure-qemu.sh
	molecule/vm/image.sh >/dev/null

vm-test: setup vm-images ## The VM-tier scenarios: kernel NFS server and client on two QEMU VMs
	trap molecule/cleanup.sh EXIT; molecule/run-role.sh nfs_client

vm-clean: ## Stop every VM a killed run left behind and remove its overlays
	molecule/vm/vmctl.sh down-all
# --- VM tier (nfs) ---

# --- The lab: the whole flow on two real-kernel VMs (tests/lab/lab.sh) ---
lab: setup ## site.yml on two QEMU VMs, then make train across both (docker runtime, checkpoints on NFS)
	tests/host/ensure-docker.sh
	tests/lab/lab.sh all

lab-down: ## Remove the lab's VMs and the SSH ports written for them (inventory/vm-lab stays)
	tests/lab/lab.sh down

e2e: setup ## The lab as tests: converge, rerun changed=0, train across both VMs, NFS restart mid-run
	tests/host/ensure-docker.sh
	tests/run-pytest.sh tests/e2e
