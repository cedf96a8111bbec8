"""The in-engine K schedule a sweep recommends for one pool, and what it costs each class.

A team that runs one pool (no routing) can still turn speculation down with load inside the
engine: vLLM's ``num_speculative_tokens_per_batch_size``, TensorRT-LLM's ``draft_len_schedule``
(``specguard.schedules``). From a calibration profile (``rules.profile``: TPOT per pool K and
concurrency, for the whole measured mix and per class) ``recommend`` picks, at every measured
concurrency, the K whose mix costs least per output token (RC of the mix = its TPOT on K over its
TPOT without speculation; K = 0 where no K is below 1.0), joins neighbouring levels with the same K
into batch-size ranges and puts each boundary where the two K's RC curves cross (linear in
log-concurrency between the two levels). Closed-loop concurrency on one engine is its batch size.

Each range carries the RC the sweep measured there for the mix and for every class: a class whose
RC is above 1.0 in a range the schedule speculates loses there, and no batch-size schedule can
spare it (it cuts K for everyone at a batch size); only routing that class elsewhere can.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from specguard import schedules
from specguard.rules import profile as profile_mod

TRTLLM_DECODING = {  # vLLM method -> TensorRT-LLM decoding_type
    "ngram": "NGram",
    "eagle": "Eagle",
    "eagle3": "Eagle",
    "draft_model": "DraftTarget",
    "mtp": "MTP",
}


@dataclass(frozen=True)
class Range:
    """Batch sizes ``start``..``end`` (``end`` None: and above) at ``k``, with the measured RC."""

    start: int
    end: int | None
    k: int
    rc: tuple[float, float]  # (lowest, highest) RC of the mix at the levels inside
    levels: tuple[int, ...]
    classes: dict[str, float] = field(default_factory=dict)  # class -> highest RC inside (K > 0)

    def span(self) -> str:
        return f"{self.start}+" if self.end is None else f"{self.start}-{self.end}"

    def losing(self) -> dict[str, float]:
        """Classes whose RC is above 1.0 somewhere in the range (only where it speculates)."""
        return {c: rc for c, rc in self.classes.items() if self.k and rc > 1.0}


@dataclass(frozen=True)
class Advice:
    ranges: tuple[Range, ...]
    vllm: schedules.Schedule | None
    trtllm: schedules.Schedule | None
    levels: tuple[int, ...]

    def vllm_config(self, method: str = "ngram") -> str | None:
        return None if self.vllm is None else schedules.vllm_speculative_config(self.vllm, method)

    def trtllm_config(self, method: str = "ngram") -> dict | None:
        if self.trtllm is None:
            return None
        return {"decoding_type": TRTLLM_DECODING.get(method, method), **self.trtllm.to_json()}

    def to_dict(self, method: str = "ngram") -> dict:
        return {
            "vllm_speculative_config": self.vllm_config(method),
            "trtllm_speculative_config": self.trtllm_config(method),
            "ranges": [
                {
                    "batch_sizes": r.span(),
                    "k": r.k,
                    "expected_rc": [round(r.rc[0], 4), round(r.rc[1], 4)],
                    "measured_at": list(r.levels),
                    "classes": {c: round(v, 4) for c, v in sorted(r.classes.items())},
                }
                for r in self.ranges
            ],
        }

    def lines(self, method: str = "ngram") -> list[str]:
        """What ``specguard sweep`` prints."""
        spans = []
        for r in self.ranges:
            rc = f"{r.rc[0]:.2f}" + (f"-{r.rc[1]:.2f}" if r.rc[1] != r.rc[0] else "")
            spans.append(f"batch {r.span()}: K={r.k} (RC {rc})")
        out = [", ".join(spans)]
        vllm = self.vllm_config(method)
        out.append(
            f"vLLM: --speculative-config '{vllm}'" if vllm else "vLLM: speculation pays at no batch size"
        )
        trt = self.trtllm_config(method)
        if trt is not None:
            schedule = ", ".join(f"{k}: {v}" for k, v in trt["draft_len_schedule"].items())
            last = max(trt["draft_len_schedule"])
            off = f" (off above {last}" + (", the highest level measured)" if self.ranges[-1].k else ")")
            out.append(
                f"TensorRT-LLM: speculative_config: {{decoding_type: {trt['decoding_type']}, "
                f"max_draft_len: {trt['max_draft_len']}, draft_len_schedule: {{{schedule}}}}}{off}"
            )
        elif self.vllm is not None:
            out.append(
                "TensorRT-LLM: no draft_len_schedule expresses it (its first range needs the largest K)"
            )
        for r in self.ranges:
            lose = r.losing()
            if lose:
                names = ", ".join(f"{c} ({v:.2f})" for c, v in sorted(lose.items()))
                out.append(f"loses at batch {r.span()} on K={r.k}, where the schedule speculates: {names}")
        return out


def recommend(profile: profile_mod.Profile, keep: int | None = None) -> Advice | None:
    """The schedule for the profile's measured mix; None without a no-spec and a speculative pool.

    ``keep``: the schedule for one pool launched at K = ``keep`` in a routed fleet, where the
    router, not the schedule, sends each class to the K that suits it: the pool keeps its K while
    the mix's RC on it is below 1.0 and past that runs the K up to ``keep`` that costs the mix
    least (0 where none is below 1.0), so it turns K down only where its own K stops paying.
    """
    base = profile.pool(k=0)
    spec = [p for p in profile.pools if p.num_speculative_tokens > 0]
    if base is None or not spec:
        return None
    levels = sorted(
        {lv.concurrency for lv in base.levels}.intersection(
            *({lv.concurrency for lv in p.levels} for p in spec)
        )
    )
    if not levels:
        return None
    curves = {0: dict.fromkeys(levels, 1.0)}
    classes: dict[int, dict[int, dict[str, float]]] = {}
    base_at = {lv.concurrency: lv for lv in base.levels}
    for pool in spec:
        k = pool.num_speculative_tokens
        at = {lv.concurrency: lv for lv in pool.levels}
        curves[k] = {c: at[c].tpot_seconds / base_at[c].tpot_seconds for c in levels}
        classes[k] = {c: _class_rc(at[c], base_at[c]) for c in levels}
    if keep is None:
        best = {c: min(curves, key=lambda k, c=c: (curves[k][c], k)) for c in levels}
    else:
        best = {c: _kept(curves, c, keep) for c in levels}
    runs: list[list] = []  # [start, end, k, [levels]]
    for i, c in enumerate(levels):
        if runs and runs[-1][2] == best[c]:
            runs[-1][3].append(c)
            continue
        if runs:
            runs[-1][1] = _crossing(levels[i - 1], c, curves[runs[-1][2]], curves[best[c]])
        runs.append([runs[-1][1] + 1 if runs else 1, None, best[c], [c]])
    top = levels[-1]
    ranges = []
    for start, end, k, inside in runs:
        rcs = [curves[k][c] for c in inside]
        worst: dict[str, float] = {}
        for c in inside:
            for name, value in classes.get(k, {}).get(c, {}).items():
                worst[name] = max(worst.get(name, 0.0), value)
        ranges.append(Range(start, end, k, (min(rcs), max(rcs)), tuple(inside), worst))
    spans = [(r.start, r.end if r.end is not None else max(top, r.start), r.k) for r in ranges]
    return Advice(
        tuple(ranges),
        schedules.from_runs(schedules.VLLM, spans, top),
        schedules.from_runs(schedules.TRTLLM, spans, top),
        tuple(levels),
    )


def _kept(curves: dict[int, dict[int, float]], level: int, keep: int) -> int:
    """``keep`` while the mix's RC on it at ``level`` is below 1.0, else the K up to ``keep`` that
    costs the mix least (``recommend``)."""
    if keep in curves and curves[keep][level] < 1.0:
        return keep
    return min((k for k in curves if k <= keep), key=lambda k: (curves[k][level], k))


def _class_rc(level: profile_mod.ProfileLevel, base: profile_mod.ProfileLevel) -> dict[str, float]:
    """Each class's RC at one level: its TPOT on K over its own TPOT without speculation."""
    own = {(c.task_type, c.temperature_bucket): c.tpot_seconds for c in base.classes if c.tpot_seconds}
    out = {}
    for cls in level.classes:
        b = own.get((cls.task_type, cls.temperature_bucket))
        if cls.tpot_seconds and b:
            out[f"{cls.task_type}/{cls.temperature_bucket}"] = cls.tpot_seconds / b
    return out


def _crossing(low: int, high: int, left: dict[int, float], right: dict[int, float]) -> int:
    """The last batch size of the run ending at ``low``: where the two K's RC curves cross between
    ``low`` and ``high`` (linear in log-concurrency), at least ``low``, below ``high``."""
    d_low, d_high = left[low] - right[low], left[high] - right[high]
    if d_high == d_low:
        t = 0.5
    else:
        t = min(1.0, max(0.0, d_low / (d_low - d_high)))
    at = math.exp(math.log(low) + t * (math.log(high) - math.log(low)))
    return int(min(high - 1, max(low, math.floor(at))))
