#!/usr/bin/env bash
# Generates what docker-compose.yml takes as secrets, into compose/secrets/ (git-ignored, mode 0700):
# a CA and the certificates it signs (the Kafka brokers, PostgreSQL, a broker-admin client), a
# password for every Kafka SCRAM user, database role, registry user and the Grafana admin, the
# console's tokens and session key, and one Lapse config file per service (its own Kafka user,
# database role and registry login, each only where the service uses it). Files that
# exist are kept, so a second run changes nothing; delete compose/secrets/ to start over (and the
# postgres volume, whose roles were made from the old passwords).
#
# The files are mode 0644 inside a 0700 folder: compose (without swarm) bind-mounts a secret with
# its host mode, and the images run as users other than yours.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$here/secrets
mkdir -p "$out"
chmod 0700 "$out"
cd "$out"

made() { echo "compose secrets: made $1"; }
random_hex() {  # random_hex FILE BYTES: FILE holds BYTES random bytes in hex unless it exists
  [ -f "$1" ] || { od -An -tx1 -N"$2" /dev/urandom | tr -d ' \n' > "$1"; made "$1"; }
}
password() { random_hex "$1.password" 24; }  # password NAME: a random password in NAME.password
cert() {  # cert NAME CN SAN [clientAuth]: NAME.key (PKCS#8, unencrypted) and NAME.crt signed by the CA
  [ -f "$1.crt" ] && return
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$1.key" -subj "/CN=$2" \
    -out "$1.csr" 2>/dev/null
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$3" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 825 -sha256 \
    -extfile "$1.ext" -out "$1.crt" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
  cat "$1.key" "$1.crt" > "$1.pem"  # a PEM keystore (key + certificate) for the JVM clients
  made "$1.crt"
}

if [ ! -f ca.pem ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.pem \
    -days 825 -subj "/CN=lapse-compose-ca" 2>/dev/null
  made ca.pem
fi
cert kafka-broker kafka-broker "DNS:kafka-1,DNS:kafka-2,DNS:kafka-3,DNS:localhost"
cert postgres postgres "DNS:postgres,DNS:localhost"
cert console console "DNS:console,DNS:localhost,IP:127.0.0.1"  # the console serves HTTPS (it binds beyond loopback)

# Kafka SCRAM users: the administrator (topics apply), the registry, the Kafka UI, and one per Lapse
# role (the principals of topics.yaml). prune and report use no Kafka and have no user.
services="sweep process relay delay reconcile analytics monitor prune report console"
for user in admin registry ui sweep process relay delay reconcile analytics status console; do password "kafka-$user"; done
# Database roles: the owner of Lapse's schema (migrate) and one per service that uses the database.
for role in postgres migrate sweep process relay reconcile monitor prune report console; do
  password "db-$role"
done
password registry-lapse
password grafana-admin
password ui-login  # the Kafka UI's sign-in (user admin)
# The console serves beyond loopback (published on the host's 127.0.0.1 only), so it needs TLS
# (console.crt above, from the compose CA) and tokens:
# one operator (may replay dead letters; its name is the recorded actor), one viewer, and the key
# that signs its sessions and form tokens (kept across restarts, so sessions survive them).
random_hex console-operator.token 32
random_hex console-viewer.token 32
random_hex console-secret.key 32

# The registry's logins (Jetty's property-file realm: `user: password,role`) and, in the same JAAS
# file, its own login to Kafka (the KafkaClient section its Kafka store reads).
printf 'lapse: %s,lapse\n' "$(cat registry-lapse.password)" > registry-users.properties
cat > registry-jaas.conf <<EOF
SchemaRegistry {
  org.eclipse.jetty.jaas.spi.PropertyFileLoginModule required
  file="/run/secrets/registry-users.properties" debug="false";
};
KafkaClient {
  org.apache.kafka.common.security.scram.ScramLoginModule required
  username="lapse-registry" password="$(cat kafka-registry.password)";
};
EOF

# The Kafka UI's config: the cluster read-only, its Kafka user (SASL_SSL, SCRAM-SHA-512, the CA), the
# registry's login, and its own sign-in form.
cat > kafka-ui.yaml <<EOF
kafka:
  clusters:
    - name: lapse
      bootstrapServers: kafka-1:9092,kafka-2:9092,kafka-3:9092
      readOnly: true
      properties:
        security.protocol: SASL_SSL
        sasl.mechanism: SCRAM-SHA-512
        sasl.jaas.config: 'org.apache.kafka.common.security.scram.ScramLoginModule required username="lapse-ui" password="$(cat kafka-ui.password)";'
        ssl.truststore.type: PEM
        ssl.truststore.location: /run/secrets/ca.pem
      schemaRegistry: http://schema-registry:8081
      schemaRegistryAuth:
        username: lapse
        password: "$(cat registry-lapse.password)"
auth:
  type: LOGIN_FORM
spring:
  security:
    user:
      name: admin
      password: "$(cat ui-login.password)"
EOF

# The broker-admin client (mutual TLS on the internal listener; a super user) for the init service
# and the health checks.
cat > kafka-admin.properties <<EOF
security.protocol=SSL
ssl.truststore.type=PEM
ssl.truststore.location=/run/secrets/ca.pem
ssl.keystore.type=PEM
ssl.keystore.location=/run/secrets/kafka-broker.pem
EOF

# One Lapse config file per service: who it is on Kafka and on the database, and how it reaches them.
kafka_user() {
  case "$1" in monitor) echo status ;; migrate) echo admin ;; prune|report) ;; *) echo "$1" ;; esac
}
for service in migrate $services; do
  user=$(kafka_user "$service")
  {
    echo "# Lapse settings of the $service service (generated by compose/make-secrets.sh)."
    if [ -n "$user" ]; then  # a service that uses Kafka, and the registry for its records
      echo "[kafka]"
      echo 'security_protocol = "SASL_SSL"'
      echo 'sasl_mechanism = "SCRAM-SHA-512"'
      echo "sasl_username = \"lapse-$user\""
      echo "sasl_password = \"$(cat "kafka-$user.password")\""
      echo 'ssl_ca_location = "/run/secrets/ca.pem"'
      echo "[schemas]"
      echo "registry_auth = \"lapse:$(cat registry-lapse.password)\""
    fi
    if [ "$service" = console ]; then
      echo "[console]"
      echo "operator_tokens = { operator = \"$(cat console-operator.token)\" }"
      echo "viewer_tokens = { viewer = \"$(cat console-viewer.token)\" }"
      echo "secret_key = \"$(cat console-secret.key)\""
      echo 'tls_cert = "/run/secrets/console.crt"'
      echo 'tls_key = "/run/secrets/console.key"'
      echo 'allowed_hosts = ["localhost", "console"]'
    fi
    if [ -f "db-$service.password" ]; then
      echo "[database]"
      echo "url = \"postgresql+psycopg://lapse_$service:$(cat "db-$service.password")@postgres:5432/lapse\""
      echo 'sslmode = "verify-full"'
      echo 'ssl_root_cert = "/run/secrets/ca.pem"'
    fi
  } > "lapse-$service.toml"
done
chmod 0644 ./*
chmod 0600 ca.key ca.srl  # the CA signs; no container needs it
echo "compose secrets: ready in $out"
