cd /work/main
for v in new old new old; do
  mkdir -p /tmp/ab/$v-$SECONDS
  out=/tmp/ab/$v-$SECONDS
  if [ $v = old ]; then export DL_OLD_RULE=1; else export DL_OLD_RULE=0; fi
  timeout 900 .venv/bin/distlab bench async-gossip -p rounds 5 -p predict False -p put_rounds 2 -p programs '["sync_gossip", "async_push_sum"]' --out $out > $out/log.txt 2>&1
  echo "$v $out rc=$?" >> /tmp/ab/index.txt
done
