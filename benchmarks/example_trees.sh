#!/usr/bin/env bash
# The Flowers example through the CLI for two package trees, warm caches, alternating:
#
#     bash benchmarks/example_trees.sh OLD NEW DATA OUT [extra CLI arguments]
#
# OLD and NEW are folders holding a jaxflowers package (e.g. `git archive REV jaxflowers | tar
# -x -C OLD`); DATA a class-folder set (`python benchmarks/synthetic_folders.py flowers
# DATA`). A first run of NEW fills the resize and compilation caches (its line is the cold
# start), then OLD, NEW, NEW, OLD run warm, then NEW once with `--plots none`. Each line:
# the run, its exit status, wall seconds and the CLI's "Seconds:" line; also in OUT/runs.txt.
set -u
old=$(realpath "$1") new=$(realpath "$2") data=$3 out=$4
shift 4
extra=("$@")
mkdir -p "$out"
export JAXFLOWERS_CACHE_DIR=$out/cache JAXFLOWERS_COMPILE_CACHE=$out/xla
run() {  # tree label [CLI arguments]
    local tree=$1 label=$2
    shift 2
    local t0 t1 rc
    t0=$(date +%s.%N)
    # PYTHONSAFEPATH: "python -m" would import the current folder's package before PYTHONPATH
    PYTHONSAFEPATH=1 PYTHONPATH=$tree${PYTHONPATH:+:$PYTHONPATH} python3 -m jaxflowers train --data "$data" \
        --model resnet50 --quiet --out "$out/runs/$label" "$@" "${extra[@]}" > "$out/$label.log" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    echo "$label rc=$rc wall=$(python3 -c "print(round($t1 - $t0, 1))")" \
         "$(grep -h '^Seconds' "$out/$label.log")" | tee -a "$out/runs.txt"
}
run "$new" new-cold
run "$old" old-warm1
run "$new" new-warm1
run "$new" new-warm2
run "$old" old-warm2
run "$new" new-warm-noplots --plots none
