#!/bin/bash
# usage: orch.sh OUT ROUNDS name=path ...
out=$1; rounds=$2; shift 2
for ((r=0; r<rounds; r++)); do
  if (( r % 2 == 0 )); then vs=("$@"); else vs=(); for ((i=$#; i>0; i--)); do vs+=("${!i}"); done; fi
  for v in "${vs[@]}"; do
    name=${v%%=*}; path=${v#*=}
    (cd /tmp && PYTHONPATH=$path timeout 300 /work/main/.venv/bin/python ${SCRIPT:-/tmp/s/one_cal.py} $out $name > /tmp/s/one_cal_last.log 2>&1) || echo "fail $name $r"
    echo "$(date +%T) $name round $r done"
  done
done
