"""Pick one (variant, configuration) per layer: from tuning, from records, or the fallback."""
from dataclasses import dataclass, field

from .variants import for_layer, BY_NAME
from .variants.base import Config


@dataclass(frozen=True)
class Choice:
    variant: str
    cfg: Config
    time_ms: float = None
    source: str = "fallback"        # "tuned" | "record" | "fallback"
    stats: tuple = ()               # (("tried", n), ("pruned", n), ...) for the report

    @property
    def impl(self):
        return BY_NAME[self.variant]


def fallback_choice(layer, target):
    variants = for_layer(layer)
    if not variants:
        from .errors import AotconvError
        raise AotconvError(f"layer '{layer.name}': no kernel variant implements op '{layer.op}' "
                           f"with these attributes")
    v = variants[0]
    return Choice(v.name, v.fallback(layer, target))


def choose(net, target, **options):
    """{layer name: Choice} for every layer that runs a kernel (aliases excluded)."""
    from .ops import is_alias
    return {l.name: fallback_choice(l, target) for l in net.layers if not is_alias(l)}
