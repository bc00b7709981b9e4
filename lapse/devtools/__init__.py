"""Dev tools: Apache Kafka from its jars, the embedded broker, the demo and the benchmark."""
