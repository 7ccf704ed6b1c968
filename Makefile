# Set-up and everyday commands. `make synth` and `make test` work on a fresh clone with no AWS credentials.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

ENV ?= dev
VENV := .venv
PY := $(VENV)/bin/python
# Extra CDK arguments, e.g. make synth CDK_ARGS="-c falcon.enabled=true"
CDK_ARGS ?=
# Extra pytest arguments for make test, e.g. make test PYTEST_ARGS="-x" or PYTEST_ARGS="-n 0" (one process)
PYTEST_ARGS ?=
# One pytest run over pytest-xdist workers, one per CPU, in groups (tests/conftest.py `xdist_group`: a module's tests
# together, the modules that synthesize in-process together). A third worker on 2 cores measured the same wall time
# with 9% more CPU (the tests' own servers and torchrun processes already fill the cores).
PYTEST_WORKERS ?= -n auto --dist loadscope

# jsii prints an end-of-life banner on Node 20; the CLI must not phone home from CI or offline desks.
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export CDK_DISABLE_CLI_TELEMETRY := true
export CDK_DISABLE_VERSION_CHECK := true
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: help install install-dev serving-stack synth synth-pipeline test lint format train-local serve-local bench-handler loadtest e2e clean falcon-benchmark
.PHONY: install-infra test-infra settings settings-schema docs test-tools image-venv image
.PHONY: image-lock bump-base image-venv-py313

help:  ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 16

# Every venv is made and filled by uv, pinned here: it resolves and installs in parallel and links each package
# from its cache (~/.cache/uv), so a second venv with the same packages (.venv-image beside .venv) costs seconds,
# not a second unpack. uv does not read pip's configuration: where pip finds torch's CPU wheel in a local folder
# (PIP_FIND_LINKS or pip's find-links, as on this project's machines), uv is pointed there too; elsewhere PyPI's
# torch==2.13.0 is the multi-GB CUDA build (TORCH_INDEX below names the CPU index for the image venv).
UV_VERSION := 0.13.9
UV := build/uv/bin/uv
FIND_LINKS ?= $(or $(PIP_FIND_LINKS),$(shell python3 -m pip config get global.find-links 2>/dev/null))
# Every install compiles what it installs to bytecode (uv's --compile-bytecode; pip does this by default, uv not).
# uv compiles only the packages of that one install, not the rest of the venv: with the flag on the last install
# alone, a fresh clone's .venv-image kept torch and .venv kept aws_cdk as source. Where PYTHONDONTWRITEBYTECODE is
# set, as on this project's machines and CI, nothing is cached at import, so every process compiled them again:
# `from transformers import Trainer` took 12 CPU-s, 5 with bytecode; importing the stacks 3.6, 1.0 with bytecode
# (2-vCPU Xeon; docs/figures.md). The cost is about 15 CPU-s on the first `make synth`, repaid by its second.
UV_INSTALL = $(UV) pip install --quiet --compile-bytecode $(if $(FIND_LINKS),--find-links $(FIND_LINKS))

$(UV):
	python3 -m venv build/uv
	build/uv/bin/python -m pip install --quiet uv==$(UV_VERSION)

$(PY): | $(UV)
	$(UV) venv --quiet --seed --python python3 $(VENV)

$(VENV)/.runtime: $(PY) requirements.txt constraints.txt
	$(UV_INSTALL) --python $(PY) -r requirements.txt -c constraints.txt
	touch $@

$(VENV)/.dev: $(VENV)/.runtime requirements-dev.txt training/requirements.txt constraints.txt
	$(UV_INSTALL) --python $(PY) -r requirements-dev.txt -c constraints.txt
	touch $@

$(VENV)/.infra: $(VENV)/.runtime requirements-infra.txt constraints.txt
	$(UV_INSTALL) --python $(PY) -r requirements-infra.txt -c constraints.txt
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

install: $(VENV)/.runtime node_modules/.installed  ## the app's Python packages and the pinned CDK CLI

install-dev: install $(VENV)/.dev image-venv image-venv-py313  ## plus test, training and lint tools, and the serving image's packages

install-infra: install $(VENV)/.infra  ## the app plus the infrastructure tests' tools, no torch (the pipeline's synth step)

synth: install  ## synthesize every stack of ENV (default dev) into cdk.out/
	rm -rf cdk.out
	npx cdk synth --quiet --no-notices -c env=$(ENV) $(CDK_ARGS)
	$(PY) -m stacks.summary cdk.out

synth-pipeline: install  ## synthesize the delivery pipeline (dev -> staging -> approval -> prod)
	rm -rf cdk.out
	npx cdk synth --quiet --no-notices -c pipeline.enabled=true $(CDK_ARGS) mlrecipes-pipeline
	$(PY) -m stacks.summary cdk.out

settings: $(VENV)/.runtime  ## every setting of ENV: value, source, type, allowed values (CDK_ARGS="-c key=value ...")
	$(PY) -m settings --env $(ENV) $(CDK_ARGS)

settings-schema: $(VENV)/.runtime  ## regenerate settings/cdk-context.schema.json after changing a setting
	$(PY) -m settings.schema --write

# The reference pages are generated from the code and checked for staleness by make test (tests/test_docs.py).
docs: install-dev settings-schema  ## after changing a setting or a CLI: regenerate docs/reference/ (settings, every --help) and the schema
	$(PY) -m docs.reference --write

# zip and unzip: the run-script tests build the training code archive with them (tests/test_training_user_data.py).
# Installed from Debian when missing, like Java below; under CI=true a test whose tool is missing fails, never skips.
test-tools:
	command -v zip >/dev/null && command -v unzip >/dev/null || { $(SUDO) apt-get update -qq && \
	  $(SUDO) apt-get install -y -qq --no-install-recommends zip unzip; }

test: install-dev test-tools  ## lint, then the whole test suite
	$(PY) -m ruff check .
	$(PY) -m pytest $(PYTEST_WORKERS) $(PYTEST_ARGS)

# The tests of the stacks, settings, LMI configuration and Lambda handlers: what requirements-infra.txt covers.
INFRA_TESTS := tests/test_settings.py tests/test_settings_schema.py tests/test_settings_cli.py \
  tests/test_settings_declarations.py tests/test_foundation_stacks.py tests/test_operations_stack.py \
  tests/test_sentiment_stack.py tests/test_training_stack.py tests/test_falcon_stack.py tests/test_lmi.py \
  tests/test_pipeline_stack.py tests/test_smoke_environment.py tests/test_lifecycle.py tests/lambdas \
  tests/test_lmi_conformance.py tests/test_lmi_vllm.py tests/test_sagemaker_pipeline_stack.py \
  tests/test_training_user_data.py tests/test_upgrade.py tests/test_test_quality.py tests/test_pipeline_publishing.py
test-infra: install-infra test-tools  ## lint, then the infrastructure tests only (the pipeline runs these before synth)
	$(PY) -m ruff check .
	$(PY) -m pytest $(INFRA_TESTS)

lint: install-dev  ## ruff only
	$(PY) -m ruff check .

format: install-dev  ## apply ruff's formatter and import order
	$(PY) -m ruff check --fix --select I .

e2e: install-dev  ## deploy the smoke environment in a real account, prove every part, tear it down (costs money)
	$(PY) -m tests.e2e.smoke $(ARGS)

# make falcon-benchmark ENV=dev MODES=dynamic,rolling_paged SHAPES=32x128 ARGS="--keep"; HELP=1 (or ARGS=--help)
# prints the tool's help: GNU make answers `make falcon-benchmark --help` itself, before reading this file.
falcon-benchmark: install-dev  ## deploy each Falcon batching mode, load-test it, tear down, compare (costs money; HELP=1)
	$(PY) -m inference.llm.falcon_benchmark $(if $(HELP),--help,--env $(ENV) $(if $(MODES),--modes $(MODES)) \
	  $(if $(SHAPES),--shapes $(SHAPES)) $(ARGS))

# make train ENV=dev; ARGS="--attach <execution ARN>" follows a running one; HELP=1 (or ARGS=--help) prints the help.
.PHONY: train
train: install-dev  ## start ENV's SageMaker training pipeline (training.backend=sagemaker) and follow it (costs money; HELP=1)
	$(PY) -m training.pipeline_cli $(if $(HELP),--help,--env $(ENV) $(ARGS))

# What `make train-local` leaves: the trained model directory and, packaged from it as the training pipeline packages
# (the accuracy gate, the ONNX graphs, int8 weights for the default ml.c7g endpoint), the archive the endpoint loads.
LOCAL_MODEL := artifacts/tiny-model
MODEL ?= $(LOCAL_MODEL).tar.gz
PORT ?= 8080
# The serving image's entry point, run from a venv with the image's pinned requirements: no Docker needed.
serve-local: image-venv  ## serve MODEL (default: train-local's model.tar.gz; a model dir works too) at 127.0.0.1:PORT (8080)
	$(IMAGE_VENV)/bin/python -m inference.sentiment.server serve --model-dir $(MODEL) --host 127.0.0.1 --port $(PORT) $(ARGS)

# make bench-handler ARGS="--preset tiny --rounds 1" (quick look); ARGS="--mode rss" (worker RSS over 10,000 requests);
# HELP=1 prints the tool's help. The toolkit row runs on TorchServe, installed here on demand (serving-stack); with
# HELP=1 or ARGS="--no-toolkit" (no toolkit row) nothing of it is installed.
bench-handler: install-dev $(if $(or $(HELP),$(findstring --no-toolkit,$(ARGS))),,serving-stack)  ## HF toolkit default vs our server in fp32 and at the gate's precision: real servers, RoBERTa-base size (HELP=1)
	$(PY) -m inference.sentiment.benchmark_server $(if $(HELP),--help,$(ARGS))

loadtest: install-dev  ## load-test a URL: make loadtest URL=http://127.0.0.1:8080/invocations ARGS="--kind sentiment"
	$(PY) -m inference.llm.loadtest --url $(URL) $(ARGS)

train-local: install-dev  ## tiny RoBERTa on the shipped sample: CPU, offline, about 20 s, then classify and package
	$(PY) -m training.train_sentiment --model-name-or-path tiny \
	  --train-file training/data/sample/train.jsonl --validation-file training/data/sample/validation.jsonl \
	  --test-file training/data/sample/test.jsonl --output-dir $(LOCAL_MODEL) \
	  --max-length 48 --num-train-epochs 20 --learning-rate 1e-3 --warmup-steps 0.1 --no-torch-compile \
	  --predict "Covid cases are increasing fast!" --predict "What a lovely day" --predict "The bus leaves at noon."
	$(PY) -m training.package --model-dir $(LOCAL_MODEL) --output $(LOCAL_MODEL).tar.gz

# The start-up calibration on Arm kernels: MODEL (default: train-local's archive, made for ml.c7g; trained first when
# missing) calibrated under QEMU's Neoverse V1 with the image's aarch64 wheels, unpacked into build/arm/ (about 260 MB
# from Debian and PyPI the first time, then reused). Not part of `make test`: emulation takes minutes.
.PHONY: check-arm
check-arm: install-dev  ## every pair of MODEL's archive checked on Arm kernels under QEMU (Graviton3), and one chosen (HELP=1)
	@if [ -z "$(HELP)" ] && [ "$(MODEL)" = "$(LOCAL_MODEL).tar.gz" ] && [ ! -f "$(MODEL)" ]; then \
	  $(MAKE) --no-print-directory train-local; fi
	$(PY) -m inference.sentiment.arm_check $(if $(HELP),--help,--model-dir $(MODEL) --uv $(UV) $(ARGS))

# make bench-train ARGS="--only plain,optimized+buckets"; HELP=1 (or ARGS=--help) prints the tool's help. On a GPU it
# measures RoBERTa-base sized runs (cold and warm compile cache); on a CPU the tiny model, once each, about two minutes.
.PHONY: bench-train
bench-train: install-dev  ## plain vs optimized through the Trainer (torchrun), samples/s, useful tokens/s, compiles, MFU (HELP=1)
	$(PY) -m training.bench_train $(if $(HELP),--help,$(ARGS))

# The GPU check (training/device_check.sh) runs where nothing can be fetched: the training packages the device image
# lacks or holds at other versions travel as wheels (Python 3.12, x86_64) in .whl/, which the device tool carries,
# at the versions our pins name.
DEVICE_WHEELS := $(shell grep -hE '^(transformers|accelerate|datasets|dill|multiprocess|fsspec)==' \
  training/requirements.txt constraints.txt | sort -u)
.PHONY: device-wheels
device-wheels:  ## the wheels training/device_check.sh installs on a lent GPU machine, into .whl/ (needs PyPI)
	python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  --platform any -d .whl $(DEVICE_WHEELS)
	@ls .whl

# make precision-gate MODEL=<model dir> (default: train-local's model directory); RANDOM=roberta-base gates a
# random-weight RoBERTa-base built on the spot.
.PHONY: precision-gate
precision-gate: install-dev  ## the accuracy gate's figures (torch fp32, bf16, int8; ONNX Runtime fp32, int8) for MODEL, or RANDOM=roberta-base
	$(PY) -m inference.sentiment.accuracy_check $(if $(RANDOM),--random-model $(RANDOM),--model-dir $(if $(filter file,$(origin MODEL)),$(LOCAL_MODEL),$(MODEL))) $(ARGS)

clean:  ## remove build output (keeps .venv and node_modules)
	rm -rf cdk.out .pytest_cache .ruff_cache artifacts build

# The toolkit baseline of make bench-handler: TorchServe and the SageMaker PyTorch toolkit as the retired Graviton
# image had them (sentiment.runtime=dlc until issue 43; versions and their source in
# inference/sentiment/serving/requirements.txt), in their own venv: they pin setuptools<81 and torchserve's
# dependencies apart from the project's. Java 17 comes from Debian only when no java is on PATH. Only bench-handler
# installs it: make synth and make test need none of it.
SERVING_VENV := .venv-serving
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
$(SERVING_VENV)/.installed: inference/sentiment/serving/requirements.txt
	command -v java >/dev/null || { $(SUDO) apt-get update -qq && \
	  $(SUDO) apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless; }
	test -x $(SERVING_VENV)/bin/python || python3 -m venv $(SERVING_VENV)
	$(SERVING_VENV)/bin/python -m pip install --quiet -r inference/sentiment/serving/requirements.txt
	touch $@

serving-stack: $(SERVING_VENV)/.installed  ## TorchServe, the SageMaker toolkit and Java (if missing) for bench-handler's toolkit row

# The sentiment serving image's Python packages in their own venv, so `make serve-local` and the server tests run
# exactly what the image runs (on this machine's Python and CPU torch). They install from the image's locks, every
# file checked against its hash: torch.lock (the CPU torch; here its x86_64 wheel from disk, elsewhere from
# TORCH_INDEX) and requirements.lock (everything else, with every platform's hashes, so one lock serves the
# image's linux/aarch64 CPython 3.13 and this machine). requirements.txt is the lock's input: what we pin.
IMAGE_VENV := .venv-image
IMAGE_DIR := inference/sentiment/image
IMAGE_REQUIREMENTS := $(IMAGE_DIR)/requirements.txt
IMAGE_LOCKS := $(IMAGE_DIR)/torch.lock $(IMAGE_DIR)/requirements.lock
# Where torch's CPU wheel comes from off this machine, e.g. TORCH_INDEX=https://download.pytorch.org/whl/cpu.
TORCH_INDEX ?=
$(IMAGE_VENV)/.installed: $(IMAGE_LOCKS) | $(UV)
	test -x $(IMAGE_VENV)/bin/python || $(UV) venv --quiet --python python3 $(IMAGE_VENV)
	$(UV_INSTALL) --python $(IMAGE_VENV)/bin/python --require-hashes --no-deps \
	  $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) -r $(IMAGE_DIR)/torch.lock
	$(UV_INSTALL) --python $(IMAGE_VENV)/bin/python --require-hashes --no-deps --only-binary :all: \
	  -r $(IMAGE_DIR)/requirements.lock
	$(UV) pip check --quiet --python $(IMAGE_VENV)/bin/python
	touch $@

image-venv: $(IMAGE_VENV)/.installed  ## the serving image's locked Python packages in .venv-image (no Docker)

# The server's pure-Python layers (HTTP app, batching, request decoding, precision choice, settings of the process)
# under CPython 3.13, the image's Python, where this machine has one (a python3.13 on PATH or pyenv's): the image's
# locked versions of the packages they import, hashed; no torch (PyPI's x86_64 torch is a CUDA build, and no CPU
# build for 3.13 is on this disk). tests/inference/test_python313.py runs their tests with it.
PY313 ?= $(shell for python in $(wildcard $(HOME)/.pyenv/versions/3.13*/bin/python3.13) $$(command -v python3.13); do \
  "$$python" -c 'import sys; assert sys.version_info[:2] == (3, 13)' 2>/dev/null && echo "$$python" && break; done)
PY313_VENV := .venv-image-py313
PY313_PACKAGES := starlette anyio idna typing-extensions uvicorn click h11 packaging pygments
$(PY313_VENV)/.installed: $(IMAGE_LOCKS) constraints.txt | $(UV)
	@if [ -z "$(PY313)" ]; then echo "no CPython 3.13 here: $(PY313_VENV) not built (its test skips)"; exit 0; fi; \
	set -e; test -x $(PY313_VENV)/bin/python || $(UV) venv --quiet --python $(PY313) $(PY313_VENV); \
	$(PY) -m inference.sentiment.image.supply_chain subset $(PY313_PACKAGES) > $(PY313_VENV)/server.lock; \
	$(UV_INSTALL) --python $(PY313_VENV)/bin/python --require-hashes --no-deps --only-binary :all: \
	  -r $(PY313_VENV)/server.lock; \
	$(UV_INSTALL) --python $(PY313_VENV)/bin/python --no-deps -c constraints.txt pytest iniconfig pluggy; \
	$(UV) pip check --quiet --python $(PY313_VENV)/bin/python; touch $@

image-venv-py313: $(PY313_VENV)/.installed  ## the server's pure-Python packages on CPython 3.13 (when one exists here)

# Re-resolve requirements.lock from requirements.txt for the image's platform (PyPI; uv in a throwaway venv).
# torch is left out here (PyPI's aarch64 torch is the CUDA build): its CPU wheel's hashes live in torch.lock.
image-lock: | $(UV)  ## after changing inference/sentiment/image/requirements.txt: re-lock it with hashes (needs PyPI)
	grep -v '^torch==' $(IMAGE_REQUIREMENTS) | $(UV) pip compile - --no-config --quiet \
	  --index-url https://pypi.org/simple --only-binary :all: --generate-hashes \
	  --python-platform aarch64-manylinux_2_28 --python-version 3.13 \
	  --custom-compile-command "make image-lock" -o $(IMAGE_DIR)/requirements.lock
	$(PY) -m inference.sentiment.image.supply_chain check

# make bump-base DIGEST=sha256:<64 hex> [TAG=3.13-slim-trixie]: point the Dockerfile's FROM at another build.
bump-base: $(VENV)/.runtime  ## move the serving image's base to DIGEST (the linux/arm64 manifest's digest; see docs)
	$(PY) -m inference.sentiment.image.supply_chain bump-base --digest $(DIGEST) $(if $(TAG),--tag $(TAG))

IMAGE_TAG ?= sentiment-server:local
# Needs a Docker daemon with buildx; on x86 it emulates arm64 with QEMU (docs/sentiment-hosting.md, "Building and deploying").
image:  ## build the sentiment serving image for linux/arm64 as IMAGE_TAG (sentiment-server:local)
	docker buildx build --platform linux/arm64 --provenance=false --sbom=false -f inference/sentiment/image/Dockerfile \
	  -t $(IMAGE_TAG) --load .
