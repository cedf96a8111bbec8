"""What the guard daemon tests share: three pools, two classes, and an evidence source with a script."""

from __future__ import annotations

from specguard.errors import SourceError
from specguard.exporters.config import PoolConfig
from specguard.rules.evidence import Evidence, PoolEvidence

POOLS = [
    PoolConfig("spec-k4", "http://127.0.0.1:1", num_speculative_tokens=4),
    PoolConfig("spec-k2", "http://127.0.0.1:2", num_speculative_tokens=2),
    PoolConfig("nospec", "http://127.0.0.1:3", num_speculative_tokens=0),
]
CREATIVE = ("creative", "high", "low")
CODE = ("code", "greedy", "low")


class ScriptedSource:
    """Returns ``rc`` per class for spec-k4 from a mutable table (a certain measurement: its interval
    is the point); raises while ``down``."""

    def __init__(self, rcs):
        self.rcs = dict(rcs)
        self.down = False

    async def collect(self, now, keys):
        if self.down:
            raise SourceError("Prometheus at http://127.0.0.1:9 unreachable: ConnectionError")
        return {
            key: Evidence(
                pools={
                    "spec-k4": PoolEvidence(
                        "spec-k4", {"rc": rc, "rc_lower": rc, "rc_upper": rc}, samples=100
                    )
                }
            )
            for key, rc in self.rcs.items()
        }
