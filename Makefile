# ML Framework Internals Workbook. `make help` lists the targets.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

# The environment is created on first use (scripts/ensure_env.sh prints its path).
ENV = env_dir=$$(scripts/ensure_env.sh) && PY="$$env_dir/bin/python"
# Extra pytest arguments, e.g. make test PYTEST_ARGS="-k lesson00 -x"
PYTEST_ARGS ?=
# Extra arguments for `make grade`, e.g. GRADE_ARGS="--timeout 600 --lab 00_environment_lab"
GRADE_ARGS ?=
SUBMISSIONS ?=
# Notebooks for `make course` (default: every lesson in notebooks/), e.g. make course NOTEBOOKS=notebooks/00_environment.ipynb
NOTEBOOKS ?=
# Extra arguments for `make lab`, e.g. LAB_ARGS="--no-browser --port 8890"
LAB_ARGS ?=
# Platforms `make test-platforms` emulates (utils/core/platforms.py), e.g. make test-platforms PLATFORMS=windows
PLATFORMS ?= linux-aarch64 macos-arm64 windows

.PHONY: help env course test test-fast test-course test-lean test-platforms gpu-check lab labs report lint doctor warmup grade site agenda clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' Makefile | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

env:  ## create (or reuse) the Python environment and print where it is
	@$(ENV) && echo "environment: $$env_dir" && $$PY -m utils.core.env --short

course:  ## run every lesson headless in full mode; executed notebooks, build/report.md/.html and build/site/
	@$(ENV) && $$PY -m utils.course.run --full $(NOTEBOOKS)

test: test-course test-lean  ## every test: the course environment's suite, then your-own-environment's (lean) one

test-fast:  ## the quick tier (tests/unit, under 2 minutes): the inner loop while you work
	@$(ENV) && WORKBOOK_SMOKE=1 $$PY -m pytest tests/unit $(PYTEST_ARGS)

test-course:  ## the whole test suite in smoke mode in the course environment (installs it if missing)
	@$(ENV) && WORKBOOK_SMOKE=1 $$PY -m pytest $(PYTEST_ARGS)

# The bring-your-own-environment path, proved on CPU: a lean environment unlike the course's (torch 2.11 on Python
# 3.12, NumPy 2, plain onnxruntime, no TensorFlow, no Triton; the project NOT pip-installed) runs the doctor, the
# unit tests and every lesson in smoke mode; what it lacks is skipped with a one-line reason.
test-lean:  ## your-own-environment path in a lean env (torch 2.11, Python 3.12, no TF/Triton): doctor, tests, lessons
	@lean=$$(scripts/ensure_env.sh lean) && export WORKBOOK_OWN_ENV=1 WORKBOOK_SMOKE=1 \
	  WORKBOOK_BUILD_DIR="$(CURDIR)/build/lean" && rm -rf build/lean/results && \
	  "$$lean/bin/python" -m utils.course.doctor && "$$lean/bin/python" -m pytest tests/unit tests/build tests/server \
	  $(PYTEST_ARGS)
	@$(MAKE) --no-print-directory test-platforms

# The lean environment's lessons, with each foreign platform emulated (WORKBOOK_EMULATE, utils/core/platforms.py: what
# that platform lacks is masked, torch's quantized engine chosen as there): the doctor's plan, then the lessons in
# smoke mode (no traceback; only listed sections skipped) and what each ran or skipped compared with that plan.
# linux-aarch64 (the first) runs every lesson: it is test-lean's lesson run. The others run only the lessons their
# platform changes (tests/build/platform_lessons.py), which keeps `make test` within its time budget. What emulation
# cannot show (Windows process semantics, Apple clang, the real CPU) is named in platforms.py and the README.
test-platforms:  ## the lean env's lessons with each foreign platform emulated: doctor's plan == what ran, no traceback
	@lean=$$(scripts/ensure_env.sh lean) && export WORKBOOK_OWN_ENV=1 WORKBOOK_SMOKE=1 && \
	for platform in $(PLATFORMS); do \
	  build="$(CURDIR)/build/platforms/$$platform"; rm -rf "$$build/results"; mkdir -p "$$build"; \
	  only=$$(WORKBOOK_EMULATE= "$$lean/bin/python" -m tests.build.platform_lessons $$platform) || exit 1; \
	  echo ">> emulating $$platform (WORKBOOK_EMULATE=$$platform): $$only"; \
	  [ "$$only" = no_lesson_differs ] && continue; \
	  WORKBOOK_EMULATE=$$platform WORKBOOK_BUILD_DIR="$$build" "$$lean/bin/python" -m utils.course.doctor --quick \
	    > "$$build.doctor.txt" && \
	  WORKBOOK_EMULATE=$$platform WORKBOOK_BUILD_DIR="$$build" "$$lean/bin/python" -m pytest \
	    tests/build/test_platform_plan.py tests/notebooks/test_lesson_results.py -k "$${only#every lesson}" $(PYTEST_ARGS) || exit 1; \
	done

gpu-check:  ## on a GPU machine: every GPU section (tests + lessons in smoke mode) -> build/results/gpu_check.json
	@$(ENV) && $$PY -m utils.course.gpu_check

lab:  ## open JupyterLab on the course (127.0.0.1; also as root, as containers and cloud GPU machines run)
	@$(ENV) && $$PY -m utils.course.labserver $(LAB_ARGS)

labs:  ## regenerate labs/ from solutions/
	@$(ENV) && $$PY -m utils.course.labs generate

report:  ## re-render build/report.md and build/report.html from build/results/
	@$(ENV) && $$PY -m utils.course.render

lint:  ## ruff over utils, tests and notebooks
	@$(ENV) && $$PY -m ruff check utils tests notebooks solutions

doctor:  ## check this machine in under a minute: what will and will not run
	@$(ENV) && $$PY -m utils.course.doctor

warmup:  ## pre-build what is slow the first time (extensions, exports, caches) before a workshop
	@$(ENV) && $$PY -m utils.course.warmup

grade:  ## grade submitted labs into a CSV and a leaderboard page: make grade SUBMISSIONS=folder [GRADE_ARGS="--timeout 300"]
	@test -n "$(SUBMISSIONS)" || { echo "usage: make grade SUBMISSIONS=path/to/folder" >&2; exit 2; }
	@$(ENV) && $$PY -m utils.course.grade "$(SUBMISSIONS)" $(GRADE_ARGS)

site:  ## the executed course as an offline book (Sphinx: sidebar by lesson and part, search) in build/site/
	@$(ENV) && $$PY -m utils.course.site

agenda:  ## workshop agenda from the measured run times (updates docs/INSTRUCTOR.md)
	@$(ENV) && $$PY -m utils.course.agenda --update docs/INSTRUCTOR.md

clean:  ## remove build outputs (the cached environment stays)
	rm -rf build .pytest_cache .ruff_cache
