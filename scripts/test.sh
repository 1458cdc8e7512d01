#!/usr/bin/env bash
# Set up and run the whole test suite plus the linter, on both stacks (scripts/setup.sh):
#   lab      .venv-lab runs ruff and pytest (Python 3.12, triton 3.6.0)
#   serving  .venv (builds) and .venv-serve (a second plain `uv pip install vllm==0.33.0`, installs) are what
#            tests/test_serving_stack.py drives (pytest -m serving): a build of one vocab with every path, its
#            install and cross verify in the other venv, the refusal of a lab bundle there, and `build --target-env`;
#            tests/test_examples_run.py runs every example verbatim with the release wheel in fresh venvs made by
#            uv from the same cache (build/uv-cache). The serving venvs are made in the background once the lab venv
#            is set up (not beside it: two uv processes at once each download the wheels both stacks share, 1.5 GB
#            twice), while the lab tests run; their log is build/serving-setup.log. .venv-0.34 (vLLM 0.34.0,
#            VLLM_VERSION=0.34.0) beside .venv: tests/test_serving_releases.py builds and verifies every family on
#            both releases.
# Disk: uv hard-links every venv from one cache in build/, so the lab stack (with the FlashInfer toolchain) costs
# about 7 GB and the serving stack about 6.5 GB more; the run stops at once, with one line, when build/'s file
# system has less free.
# STACKS=lab skips the serving venvs and their tests. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
STACKS=${STACKS:-lab serving}
# CI builds FlashInfer's sampling module once (about 100 s); without it the FlashInfer tests would skip.
export KERNELCACHE_SETUP_FLASHINFER=${KERNELCACHE_SETUP_FLASHINFER:-1}
if [ "$KERNELCACHE_SETUP_FLASHINFER" = 1 ]; then export KERNELCACHE_REQUIRE_FLASHINFER=1; fi
# Every test process imports torch and vLLM (or Triton) from venvs that uv installed without .pyc files; where
# PYTHONDONTWRITEBYTECODE is set (many CI images set it), each one would compile their Python again: about 10 s of
# CPU per process that imports vLLM, and the suite starts some hundred. Python writes it once, to build/pycache
# (the venvs stay as setup.sh made them).
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX="$PWD/build/pycache"
# The vLLM builds of both streams share one build cache, new for each run (tests/conftest.py build_cache): what one
# test's build compiled, a later build takes instead of compiling it again.
export KERNELCACHE_TEST_BUILD_CACHE="${TMPDIR:-/tmp}/kernelcache-tests-build-cache"
rm -rf "$KERNELCACHE_TEST_BUILD_CACHE"
started=$(date +%s)
stamp() { echo "test.sh: $1 at +$(( $(date +%s) - started ))s"; }
serving=0
[[ " $STACKS " == *" serving "* ]] && serving=1

# pytest exit 5 (nothing collected: extra args selected no test of this run) is not a failure; the 15 slowest
# tests are listed at the end of each run (what to trim when CI grows). Each run has its own temp dir, so two
# runs at once never clean up each other's.
pytest_run() {
  local name=$1 rc=0
  shift
  .venv-lab/bin/python -m pytest -q -p no:cacheprovider --durations=15 \
    --basetemp="${TMPDIR:-/tmp}/kernelcache-tests-$name" "$@" || rc=$?
  [ "$rc" = 5 ] || return "$rc"
}

# Exit 28 (ENOSPC) up front, with one line, on what would stop halfway through a download with "No space left on
# device".
disk_check() {
  local need=0 free
  if ! [ -x .venv-lab/bin/python ]; then need=$((need + 7000)); fi
  if [ "$serving" = 1 ] && ! [ -x .venv/bin/python ]; then need=$((need + 6500)); fi
  free=$(df -Pm build | awk 'NR == 2 {print $4}')
  if [ "$free" -lt "$need" ]; then
    echo "test.sh: $free MB free under $PWD/build; the stacks ($STACKS) need about $need MB (STACKS=lab: 7000)" >&2
    exit 28
  fi
}
mkdir -p build
disk_check
STACK=lab bash scripts/setup.sh
stamp "lab stack set up"
if [ "$serving" = 1 ]; then
  rm -f build/serving-setup.rc
  # The build venv fetches FlashInfer's CUDA toolchain itself when it builds; the install venv needs none.
  ( rc=0
    { STACK=serving KERNELCACHE_SETUP_DEV=0 KERNELCACHE_SETUP_FLASHINFER=0 bash scripts/setup.sh \
      && STACK=serving VENV=.venv-serve KERNELCACHE_SETUP_DEV=0 KERNELCACHE_SETUP_FLASHINFER=0 bash scripts/setup.sh \
      && STACK=serving VLLM_VERSION=0.34.0 KERNELCACHE_SETUP_DEV=0 KERNELCACHE_SETUP_FLASHINFER=0 bash scripts/setup.sh
    } > build/serving-setup.log 2>&1 || rc=$?
    echo "$rc" > build/serving-setup.rc ) &
fi
.venv-lab/bin/ruff check kernelcache tests scripts

# The serving stack's venvs, once set up (in the background since the lab venv was).
serving_ready() {
  while [ ! -f build/serving-setup.rc ]; do sleep 5; done
  if [ "$(cat build/serving-setup.rc)" != 0 ]; then
    tail -20 build/serving-setup.log
    echo "test.sh: setting up the serving stack failed (build/serving-setup.log)"
    return 1
  fi
}

# Two streams, one per core of a 2-core CI machine: most tests run one process at a time, so together they take
# about as long as the longer stream. A runs the quick tests; the slow tests (the model families' cross builds)
# and the serving stack's are jobs, each taken once by whichever stream is free: B from the start, slow jobs
# first, A once its quick tests are done, serving jobs first. So both streams end close together. Each stream's
# output is printed whole once it ends. A job is one pytest: each long file alone (so the last job taken is short
# and the streams end together), the other files of a kind all in one, which imports torch and vLLM to collect
# them once and builds the session's test kernels (conftest.py built, bundle90) once, not once per file.
stream() {
  local name=$1 rc=0
  shift
  "$@" > "build/test-$name.log" 2>&1 || rc=$?
  stamp "stream $name done (exit $rc)" >> "build/test-$name.log"
  return "$rc"
}
# The longest files known, each a job of its own, longest first: the last job taken decides how far apart the
# streams end. The slow files' builds and test_serving_stack's fill the session's build cache in their venvs.
SLOW_FIRST="test_build_vllm test_exercise_records test_build_gdn test_build_mamba test_device_keys test_build_moe
            test_build_mrv2_spec_decode test_build_flashinfer_attention"
SERVING_FIRST="test_serving_stack test_serving_releases test_examples_run"
SLOW="slow and not serving"
rm -rf build/test-jobs build/test-claims
# The files with tests of marker expression $1, as pytest collects them.
files_of() {
  local rc=0 listed
  listed=$(.venv-lab/bin/python -m pytest -q -p no:cacheprovider --collect-only -m "$1" "${@:2}") || rc=$?
  [ "$rc" = 0 ] || [ "$rc" = 5 ] || { echo "$listed" | tail -30 >&2; return "$rc"; }
  echo "$listed" | sed -n 's/::.*//p' | awk '!seen[$0]++'
}
# The jobs of kind $1 among the files $2 (one a line): "KIND FILE" for each file of $3 (names, longest first),
# then the rest dealt into two jobs "KIND FILE,FILE,..." (two, not one: the last job taken stays short).
jobs_of() {
  local kind=$1 files=$2 first name file turn=0 rest=("" "")
  first=" $(echo $3) "
  for name in $first; do echo "$files" | grep -Fx "tests/$name.py" | sed "s/^/$kind /" || true; done
  for file in $files; do
    [[ "$first" == *" $(basename "$file" .py) "* ]] && continue
    rest[turn]="${rest[turn]},$file"
    turn=$(( 1 - turn ))
  done
  for file in "${rest[@]}"; do [ -z "$file" ] || echo "$kind ${file#,}"; done
}
# build/test-jobs: a line "slow FILES" or "serving FILES" per job (FILES: one or more, comma-separated).
collect_jobs() {
  local slow served=""
  slow=$(files_of "$SLOW" "$@") || return
  if [ "$serving" = 1 ]; then served=$(files_of serving "$@") || return; fi
  { jobs_of slow "$slow" "$SLOW_FIRST"
    [ -z "$served" ] || jobs_of serving "$served" "$SERVING_FIRST"
  } > build/test-jobs.tmp
  mv build/test-jobs.tmp build/test-jobs
}
run_job() {
  local kind=$1 files name
  IFS=, read -ra files <<< "$2"
  shift 2
  name=$(basename "${files[0]}" .py)
  [ "${#files[@]}" = 1 ] || name="$name-and-$(( ${#files[@]} - 1 ))-more"
  mkdir "build/test-claims/$kind-$name" 2>/dev/null || return 0  # another stream took it
  stamp "$kind ${files[*]} taken"
  if [ "$kind" = slow ]; then pytest_run "slow-$name" -m "$SLOW" "${files[@]}" "$@"; return; fi
  serving_ready || return
  KERNELCACHE_SERVING_VENV=$PWD/.venv KERNELCACHE_SERVING_VENV2=$PWD/.venv-serve \
    KERNELCACHE_SERVING_VENV_034=$PWD/.venv-0.34 KERNELCACHE_REQUIRE_SERVING=1 \
    pytest_run "serving-$name" -m serving "${files[@]}" "$@"
}
# Every job of kind $1 no stream has taken yet, then those of the other kind.
take_jobs() {
  local first=$1 rc=0 line jobs
  shift
  while [ ! -f build/test-jobs ]; do
    [ -f build/test-claims/failed ] && return 1
    sleep 5
  done
  mapfile -t jobs < build/test-jobs
  for line in "${jobs[@]}"; do [ "${line%% *}" = "$first" ] && { run_job $line "$@" || rc=1; }; done
  for line in "${jobs[@]}"; do [ "${line%% *}" = "$first" ] || { run_job $line "$@" || rc=1; }; done
  return "$rc"
}
collect_then_jobs() {
  mkdir -p build/test-claims
  collect_jobs "$@" || { touch build/test-claims/failed; return 1; }
  take_jobs slow "$@"
}
quick_then_jobs() {
  pytest_run quick -m "not serving and not slow" "$@" || return
  stamp "quick tests done"
  take_jobs serving "$@"
}
stream A quick_then_jobs "$@" & a=$!
stream B collect_then_jobs "$@" & b=$!
failed=0
for pair in "A $a" "B $b"; do
  set -- $pair
  wait "$2" || failed=1
  echo "=== stream $1 (build/test-$1.log)"
  cat "build/test-$1.log"
done
stamp "all tests done"
exit "$failed"
