# Research compendium: the two commands are `make reproduce` and `make test`.
# Both bootstrap the project virtual environment (.venv) from pyproject.toml and
# requirements.lock when it is missing or older than those files.
#
#   make reproduce                  the experiment: every stage, embedded profile (MemeWorld + tiny models, CPU);
#                                   resumes after a kill, skips stages whose inputs are unchanged, replays the
#                                   committed model answers, and copies its results to results/embedded/
#   make reproduce NB=03            one stage (by number prefix or stem); FORCE=1 reruns up-to-date stages,
#                                   COLD=1 asks every model afresh; what it reads comes from the committed results,
#                                   and DEPS=1 regenerates first what is not committed (it says what and how long)
#   make reproduce PROFILE=paper    the same notebooks with params/paper.yaml
#   make reproduce PROFILE=paper-smoke   the paper profile's code on tiny stand-in models and data (CPU, ~6 min)
#   make test                       the code: committed-results checks, unit tests, every stage at test sizes
#                                   (PROFILE=ci, replaying the committed ci answers; COLD=1 asks afresh),
#                                   paper-smoke; leaves the working tree as it was
#   make test-answers               refresh the model answers make test replays (results/ci/, results/paper-smoke/)
#   make report                     the executed notebooks as a static HTML site (artifacts/<profile>/report/)
#   make lab                        JupyterLab on copies of the notebooks prepared for the ci profile (PROFILE=x: another),
#                                   in artifacts/<profile>/lab/, with this file's environment; the committed ones stay as they are
#   make gpu-check                  on a GPU machine with no pip: the paper profile's GPU checks at full shapes, one record and
#                                   a PASS/FAIL/SKIP line each (the machine's python, PYTHON=...); make test-gpu: the gpu tests

PROFILE ?= embedded
NB ?=
FORCE ?=
COLD ?=
DEPS ?=
RECORD ?=
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.stamp

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export PYTHONHASHSEED := 0
export MPLBACKEND := Agg

.PHONY: lab disk-check reproduce test test-answers test-unit test-notebooks test-gpu gpu-check data venv lock environment.yml check-params results clean-artifacts help report browser

help:
	@sed -n '1,20p' Makefile

$(STAMP): pyproject.toml requirements.lock requirements-nodeps.txt
	@echo ">> bootstrapping $(VENV) (python: $$($(PYTHON) --version))"
	@test -x $(PY) || $(MAKE) --no-print-directory disk-check
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c requirements.lock -e .
	$(PY) -m pip install --quiet --no-deps -r requirements-nodeps.txt
	@touch $(STAMP)

venv: $(STAMP)

# A new .venv takes about 6.5 GB (torch's CUDA build with its nvidia libraries: the build that
# runs both here on CPU and on GPUs) plus pip's unpacked downloads while installing.
VENV_GB ?= 8
disk-check:
	@for d in . "$${TMPDIR:-/tmp}"; do \
	  free=$$(df -Pk "$$d" | awk 'NR==2 {print int($$4 / 1048576)}'); \
	  if [ "$$free" -lt $(VENV_GB) ]; then \
	    echo "error: bootstrapping $(VENV) needs about $(VENV_GB) GB free; $$(cd "$$d" && pwd) has $$free GB (set VENV_GB to override)" >&2; \
	    exit 1; \
	  fi; \
	done

reproduce: $(STAMP)
	$(PY) -m lib.compendium.runner reproduce --profile $(PROFILE) $(if $(NB),--only $(NB),) $(if $(filter 1,$(FORCE)),--force,) $(if $(filter 1,$(COLD)),--cold,) $(if $(filter 1,$(DEPS)),--deps,)

data: $(STAMP)
	$(PY) -m lib.compendium.runner reproduce --profile $(PROFILE) --only 00

check-params: $(STAMP)
	$(PY) -m lib.compendium.params --profile $(PROFILE)

results: $(STAMP)
	$(PY) -m lib.compendium.results --readme README.md

test: $(STAMP) browser
	$(PY) -m lib.compendium.runner test $(if $(RECORD),--record $(RECORD),) $(if $(filter 1,$(COLD)),--cold,)

# The model answers `make test` replays (the ci and paper-smoke profiles'): run each profile from nothing
# (replaying what is committed, asking the models for the rest) and commit exactly the answers it used.
# KEEP=1 keeps the committed answers beside them: a CPU of another kind trains other weights, asks other
# keys, and adds its own answers, so that both kinds of machine replay.
test-answers: $(STAMP)
	$(PY) -m lib.compendium.runner reproduce --profile ci --force --fresh --no-publish
	$(PY) -m lib.compendium.runner answers --profile ci $(if $(filter 1,$(KEEP)),--keep,)
	$(PY) -m lib.compendium.runner reproduce --profile paper-smoke --force --fresh --no-publish
	$(PY) -m lib.compendium.runner answers --profile paper-smoke $(if $(filter 1,$(KEEP)),--keep,)

report: $(STAMP)
	$(PY) -m lib.compendium.report --profile $(PROFILE)

# the ci profile unless PROFILE is given on the command line (the embedded one is full size and publishes figures)
LAB_PROFILE = $(if $(filter command line environment,$(origin PROFILE)),$(PROFILE),ci)
lab: $(STAMP)
	$(PY) -m lib.compendium.lab --profile $(LAB_PROFILE) $(if $(filter 1,$(FRESH)),--fresh,)

# Headless Chromium (Debian's package) opens the rendered report in a test; installed once per machine.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { echo ">> installing chromium (Debian package) for the report test"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium) >/dev/null \
	    || echo "warning: could not install chromium; the report test fails under CI and is skipped elsewhere" >&2; }

test-unit: $(STAMP)
	$(PY) -m pytest -q tests -m "not results and not ci_run and not gpu"

test-notebooks: $(STAMP)
	$(PY) -m lib.compendium.runner test --skip-unit

# a GPU machine's image has torch, transformers and accelerate but may have no pip and no network: these two use
# its own python (PYTHON=..., default python3) with the checkout on PYTHONPATH, and never build .venv
GPU_PY := $(or $(PYTHON),python3)
test-gpu:
	PYTHONPATH=$(CURDIR) $(GPU_PY) -m pytest -q -p no:cacheprovider tests -m gpu

gpu-check:
	PYTHONPATH=$(CURDIR) $(GPU_PY) -m lib.compendium.gpu_check $(ARGS)

# Regenerate the resolved-version lock from the current environment.
lock: $(STAMP)
	$(PY) -m pip freeze --exclude-editable | grep -v '^-e ' > requirements.lock

environment.yml: pyproject.toml
	$(PY) -m lib.compendium.envfiles > environment.yml

clean-artifacts:
	rm -rf artifacts/$(PROFILE)
