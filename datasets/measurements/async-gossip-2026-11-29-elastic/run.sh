cd /work/main
mkdir -p /tmp/el; rm -f /tmp/el/index.txt
for v in False True False True; do
  out=/tmp/el/elastic-$v-$SECONDS; mkdir -p $out
  timeout 900 .venv/bin/distlab bench async-gossip -p rounds 5 -p predict False -p put_rounds 2 -p elastic $v -p programs '["sync_gossip", "async_push_sum"]' --out $out > $out/log.txt 2>&1
  echo "$v $out rc=$?" >> /tmp/el/index.txt
done
