"""`effect: {kafka-produce: {topic: …}}`: produce one record per operation to a topic the topics
file declares with `role: effect` (the caller: processors/effects/kafka_produce).

The topic is named as topics.yaml declares it; the compiled declaration holds its effective name
(the environment's prefix applied). A topic the topics file does not declare with role `effect`
is refused, so `lapse topics apply` has created it and granted the process principal its ACLs.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from lapse.kernel.kinds.effects.base import CompileContext, ExternalEffectType
from lapse.kernel.kinds.errors import KindError, show
from lapse.kernel.topology import EFFECT_ROLE


class KafkaProduceEffect(ExternalEffectType):
    """Produce one record per operation to `topic` (declared in topics.yaml with role `effect`),
    keyed by the op key, with the op key and the attempt as headers and a JSON value naming the
    operation; the call waits at most `timeout_s` for the delivery report (and at most half the
    processor's lease)."""

    tag: ClassVar[str] = "kafka-produce"

    topic: str = Field(min_length=1, max_length=249)
    timeout_s: float = Field(10.0, gt=0, le=120)
    then_set: dict[str, Any] = Field(
        default_factory=dict, description="Columns set on the business row once the record is acknowledged.")

    def checked(self, ctx: CompileContext) -> KafkaProduceEffect:
        field = f"{self.field}.topic"
        if ctx.topology is None:
            raise KindError(field, "no topics file to look the topic up in")
        spec = next((s for s in ctx.topology.specs if self.topic in (s.declared_name, s.name)), None)
        if spec is None:
            raise KindError(field, f"{show(self.topic)} is not declared in the topics file (declare it with "
                                   f"role: {EFFECT_ROLE})")
        if spec.role != EFFECT_ROLE:
            role = f"role {spec.role}" if spec.role else "no role"
            raise KindError(field, f"{show(self.topic)} has {role} in the topics file, not role: {EFFECT_ROLE}")
        return self.model_copy(update={"topic": spec.name})
