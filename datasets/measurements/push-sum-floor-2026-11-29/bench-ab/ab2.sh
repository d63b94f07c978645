while [ $(wc -l < /tmp/ab/index.txt) -lt 4 ]; do sleep 5; done
cd /work/main
for v in old new old new; do
  out=/tmp/ab/$v-b$SECONDS; mkdir -p $out
  if [ $v = old ]; then export DL_OLD_RULE=1; else export DL_OLD_RULE=0; fi
  timeout 900 .venv/bin/distlab bench async-gossip -p rounds 5 -p predict False -p put_rounds 2 -p programs '["sync_gossip", "async_push_sum"]' --out $out > $out/log.txt 2>&1
  echo "$v $out rc=$?" >> /tmp/ab/index.txt
done
