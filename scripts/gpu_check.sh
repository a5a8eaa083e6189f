#!/usr/bin/env bash
# The GPU check (issue 34): one script for a bare GPU machine (torch and transformers there, the
# dashboard's packages not), in under 8 minutes:
#
#   1. installs the Python packages that machine lacks from a folder of wheels it is handed
#      (no network: pip --no-index --no-deps into a folder of its own, put on PYTHONPATH);
#   2. runs `pytest -m gpu tests/gpu`, `benchmarks/decompositions.py --device cuda`,
#      `benchmarks/job_vs_loop.py --device cuda` and `benchmarks/gpu.py` at their GPU shapes, each
#      under a timeout, logging each under LOGS;
#   3. prints one table: each part, its status, its seconds and its figures.
#
# Without CUDA (torch.cuda.is_available() False) the CUDA parts are skipped, each saying so, and
# the script exits 0; a part that fails or runs out of time makes it exit 1.
#
#   scripts/gpu_check.sh [WHEELS_DIR]
#
# Settings (environment): GPU_CHECK_WHEELS (the wheels, if not given as the argument);
# GPU_CHECK_OUT (the logs' folder; else $OUT, else benchmarks/results/gpu_check);
# GPU_CHECK_NEEDS (the modules to import, default: streamlit plotly entmax platformdirs);
# GPU_CHECK_PYTEST_S, GPU_CHECK_DECOMP_S, GPU_CHECK_JOB_S, GPU_CHECK_GPU_S (timeouts, default 280,
# 40, 150 and 90 s: with the install, under 10 minutes; on an H200 on 2026-11-28 tests/gpu took
# about 300 s, the job's loops 100 s, gpu.py 81 s; a part cut short reports what it printed so far);
# PYTHON (default python3). Wheels for the lent machines (Python 3.12) are fetched with
# `pip download --no-deps --only-binary=:all: --python-version 3.12 ...` (docs/gpu.md).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2
PY="${PYTHON:-python3}"
WHEELS="${1:-${GPU_CHECK_WHEELS:-}}"
LOGS="${GPU_CHECK_OUT:-${OUT:-$ROOT/benchmarks/results/gpu_check}}"
NEEDS="${GPU_CHECK_NEEDS:-streamlit plotly entmax platformdirs}"
T_PYTEST="${GPU_CHECK_PYTEST_S:-280}"
T_DECOMP="${GPU_CHECK_DECOMP_S:-40}"
T_JOB="${GPU_CHECK_JOB_S:-150}"
T_GPU="${GPU_CHECK_GPU_S:-90}"
mkdir -p "$LOGS" || exit 2
SCRATCH="$(mktemp -d)"
trap 'rm -rf "$SCRATCH"' EXIT
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 ATTN_LAB_RUNS="$SCRATCH/runs"
START=$(date +%s)
ROWS=()
FAILED=0

row() { # part, status, seconds, detail
    ROWS+=("$(printf '%-28s %-9s %7s  %s' "$1" "$2" "$3" "$4")")
    [ "$2" = "failed" ] || [ "$2" = "timeout" ] && FAILED=1
    echo "[gpu_check] $1: $2 ($3 s) $4"
}

missing_modules() {
    local m out=""
    for m in $NEEDS; do
        "$PY" -c "import $m" >/dev/null 2>&1 || out="$out $m"
    done
    echo "${out# }"
}

# --- 1. what this machine lacks, from the wheels -------------------------------------------------------
t0=$(date +%s)
missing="$(missing_modules)"
if [ -z "$missing" ]; then
    row "install" "ok" 0 "nothing missing ($NEEDS)"
elif [ -z "$WHEELS" ] || ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    row "install" "failed" 0 "missing: $missing; no wheels given (scripts/gpu_check.sh WHEELS_DIR)"
else
    SITE="$SCRATCH/site"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$WHEELS"/*.whl \
        >"$LOGS/install.log" 2>&1
    export PYTHONPATH="$PYTHONPATH:$SITE"
    still="$(missing_modules)"
    n=$(ls "$WHEELS"/*.whl | wc -l)
    if [ -z "$still" ]; then
        row "install" "ok" $(($(date +%s) - t0)) "installed $n wheels for: $missing"
    else
        row "install" "failed" $(($(date +%s) - t0)) "still missing: $still (see install.log)"
    fi
fi

# --- 2. the CUDA parts ------------------------------------------------------------------------------------
CUDA="$("$PY" -c 'import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")' 2>/dev/null)"
if [ -z "$CUDA" ]; then
    echo "[gpu_check] CUDA: not available (torch.cuda.is_available() is False): the CUDA parts are skipped"
    for part in "pytest -m gpu tests/gpu" "decompositions.py --device cuda" "job_vs_loop.py --device cuda" "gpu.py"; do
        row "$part" "skipped" 0 "no CUDA"
    done
else
    echo "[gpu_check] CUDA: $CUDA ($("$PY" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)'))"
    nvidia-smi >"$LOGS/nvidia-smi.log" 2>&1

    summary() { # script, name: the saved result's line, else the last figures the run printed
        if [ -f "$LOGS/$2_cuda.json" ] || [ -f "$LOGS/$2.json" ]; then
            "$PY" "benchmarks/$1" --summary "$(ls "$LOGS/$2_cuda.json" "$LOGS/$2.json" 2>/dev/null | head -1)" 2>&1 | tail -1
        else
            local last
            last="$(grep -E 'steps/' "$LOGS/$2.log" | tail -1)"
            echo "no result saved; last: $(sed 's/^ *//' <<<"${last:-$(tail -1 "$LOGS/$2.log")}")"
        fi
    }

    run_part() { # part, timeout s, log, command...
        local part="$1" limit="$2" log="$3" t rc
        shift 3
        t=$(date +%s)
        timeout "$limit" "$@" >"$LOGS/$log" 2>&1
        rc=$?
        SECONDS_PART=$(($(date +%s) - t))
        if [ $rc -eq 124 ]; then
            STATUS="timeout"
        elif [ $rc -eq 0 ]; then
            STATUS="ok"
        else
            STATUS="failed"
        fi
    }

    # pytest's summary line; cut short, the tests it had ended so far (one line each, -v) and the
    # one it was in; --durations names the slow ones
    run_part "pytest" "$T_PYTEST" pytest.log "$PY" -m pytest -m gpu tests/gpu -v -p no:cacheprovider -rfE \
        --durations=0 --junitxml "$LOGS/pytest.xml"
    detail="$(grep -E '^=+ .*[0-9]+ (passed|failed|error|skipped)' "$LOGS/pytest.log" | tail -1 | tr -d '=' | sed 's/^ *//;s/ *$//')"
    if [ -z "$detail" ]; then
        count() { grep -cE "^tests/gpu/.* $1( |\$)" "$LOGS/pytest.log"; }
        last="$(grep -E '^tests/gpu/' "$LOGS/pytest.log" | tail -1 | sed 's/ .*//')"
        detail="so far: $(count PASSED) passed, $(count FAILED) failed, $(count ERROR) errors, $(count SKIPPED) skipped; cut in: ${last:-?}"
    fi
    row "pytest -m gpu tests/gpu" "$STATUS" "$SECONDS_PART" "$detail"

    # the singular values of head-sized cores on the GPU against attn_core.linalg (on the host)
    run_part "decompositions" "$T_DECOMP" decompositions.log "$PY" benchmarks/decompositions.py --device cuda \
        --repeats 3 --out "$LOGS/decompositions_cuda.json"
    row "decompositions.py --device cuda" "$STATUS" "$SECONDS_PART" \
        "$(grep -E 'cores|refresh|summaries' "$LOGS/decompositions.log" | sed 's/^ *//' | paste -sd '|' -)"

    # the 88M Llama folder of issue 34 (bf16, fused AdamW, 150 steps), eager, one repeat: the
    # plain loop, the job (its phases) and the command (its wall split by part)
    run_part "job_vs_loop" "$T_JOB" job_vs_loop.log "$PY" benchmarks/job_vs_loop.py --device cuda --repeats 1 \
        --models imported --modes eager --penalties none --loops plain,job,command --out "$LOGS/job_vs_loop_cuda.json"
    row "job_vs_loop.py --device cuda" "$STATUS" "$SECONDS_PART" "$(summary job_vs_loop.py job_vs_loop)"

    # induction-2l on the CPU and on CUDA, eager and compiled (CUDA graphs), fp32: the zoo's rows
    run_part "gpu" "$T_GPU" gpu.log "$PY" benchmarks/gpu.py --setups induction-2l --repeats 1 --precisions fp32 \
        --out "$LOGS/gpu.json"
    row "gpu.py" "$STATUS" "$SECONDS_PART" "$(summary gpu.py gpu)"
fi

# --- 3. one table -------------------------------------------------------------------------------------------
echo
echo "GPU check, $(date -u '+%Y-%m-%d %H:%M UTC'), ${CUDA:-no CUDA}; logs in $LOGS"
printf '%-28s %-9s %7s  %s\n' "part" "status" "seconds" "figures"
printf '%s\n' "${ROWS[@]}"
echo "total: $(($(date +%s) - START)) s"
exit $FAILED
