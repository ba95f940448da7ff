#!/usr/bin/env bash
# Gathers Apache Kafka 4.3.1's runtime jars from Maven Central into
# ${VCDN_KAFKA_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/vcdn/kafka-4.3.1}/libs (beside
# the other tools the tests fetch), for the telemetry
# datasink (crates/vcdn-telemetry, `kafka::KafkaDist::locate`).
#
# Idempotent: a marker file (`.complete`) is written last, after every jar is
# in place; when it exists the script does nothing. An interrupted run leaves
# no marker and the next run starts over.
#
# Versions are pinned: a version range once resolved kafka to 4.4.0, whose
# kafka-tools-api is missing from Maven Central (docs in
# /work/shared/notes/kafka-here.md). log4j-slf4j-impl is the logging bridge
# without which the broker writes no server.log.
set -euo pipefail

KAFKA_VERSION=4.3.1
LOG4J_VERSION=2.25.4
HOME_DIR="${VCDN_KAFKA_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/vcdn/kafka-$KAFKA_VERSION}"
MARKER="$HOME_DIR/.complete"

if [[ -f "$MARKER" ]]; then
  exit 0
fi

SUDO=$([[ $(id -u) -eq 0 ]] && echo "" || echo sudo)
if ! command -v java >/dev/null 2>&1; then
  echo "== installing a JDK (openjdk-17-jre-headless) for Kafka"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q openjdk-17-jre-headless \
    || { $SUDO apt-get update -q && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q openjdk-17-jre-headless; }
fi
if ! command -v mvn >/dev/null 2>&1; then
  echo "== installing maven"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q maven \
    || { $SUDO apt-get update -q && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q maven; }
fi

echo "== fetching Kafka $KAFKA_VERSION jars into $HOME_DIR/libs"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cat >"$WORK/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>vcdn</groupId>
  <artifactId>kafka-dist</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_2.13</artifactId>
      <version>$KAFKA_VERSION</version>
    </dependency>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka-tools</artifactId>
      <version>$KAFKA_VERSION</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j-impl</artifactId>
      <version>$LOG4J_VERSION</version>
    </dependency>
  </dependencies>
</project>
POM

rm -rf "$HOME_DIR/libs"
mkdir -p "$HOME_DIR/libs"
mvn -q -B -f "$WORK/pom.xml" dependency:copy-dependencies \
  -DincludeScope=runtime -DoutputDirectory="$HOME_DIR/libs"

ls "$HOME_DIR/libs"/kafka_2.13-"$KAFKA_VERSION".jar "$HOME_DIR/libs"/kafka-tools-"$KAFKA_VERSION".jar >/dev/null
echo "kafka $KAFKA_VERSION, $(ls "$HOME_DIR/libs" | wc -l) jars" >"$MARKER"
echo "== Kafka $KAFKA_VERSION ready in $HOME_DIR"
