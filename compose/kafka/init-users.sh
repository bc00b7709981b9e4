#!/usr/bin/env bash
# One-shot, before anything else uses Kafka: the SCRAM-SHA-512 credential of every user
# compose/make-secrets.sh made a password for, the schema registry's ACLs (its `_schemas` topic
# and group) and the Kafka UI's (read-only). It connects as the broker-admin (mutual TLS on the internal listener, a super user).
# Lapse's own ACLs come from topics.yaml, through `lapse topics apply` in the migrate service.
set -euo pipefail
bin=/opt/kafka/bin
admin=(--bootstrap-server kafka-1:9094 --command-config /run/secrets/kafka-admin.properties)
for file in /run/secrets/kafka-*.password; do
  user=$(basename "$file" .password)
  user=lapse-${user#kafka-}
  "$bin/kafka-configs.sh" "${admin[@]}" --alter --entity-type users --entity-name "$user" \
    --add-config "SCRAM-SHA-512=[password=$(cat "$file")]" >/dev/null
  echo "kafka: SCRAM-SHA-512 credential of $user"
done
registry=(--allow-principal User:lapse-registry)
"$bin/kafka-acls.sh" "${admin[@]}" --add "${registry[@]}" --operation All --topic _schemas >/dev/null
"$bin/kafka-acls.sh" "${admin[@]}" --add "${registry[@]}" --operation All --group schema-registry >/dev/null
"$bin/kafka-acls.sh" "${admin[@]}" --add "${registry[@]}" --operation DescribeConfigs --topic _schemas >/dev/null
"$bin/kafka-acls.sh" "${admin[@]}" --add "${registry[@]}" --operation Describe --cluster >/dev/null
echo "kafka: ACLs of the schema registry on _schemas"
# The Kafka UI looks and never touches: Describe, DescribeConfigs and Read on every topic, Describe
# on every group (lag), Read on the groups its message browser names, Describe on the cluster.
ui=(--allow-principal User:lapse-ui)
"$bin/kafka-acls.sh" "${admin[@]}" --add "${ui[@]}" --operation Describe --operation DescribeConfigs \
  --operation Read --topic '*' >/dev/null
"$bin/kafka-acls.sh" "${admin[@]}" --add "${ui[@]}" --operation Describe --group '*' >/dev/null
"$bin/kafka-acls.sh" "${admin[@]}" --add "${ui[@]}" --operation Read --group kafka-ui \
  --resource-pattern-type prefixed >/dev/null
"$bin/kafka-acls.sh" "${admin[@]}" --add "${ui[@]}" --operation Describe --operation DescribeConfigs --cluster >/dev/null
echo "kafka: read-only ACLs of the Kafka UI"
