"""Scripted traffic scenarios: phases of closed-loop clients per task type and temperature mix.

A scenario is data. The live demo drives it over HTTP through the tap; the replays drive the
same phases in virtual time through the simulator's engine core, so every policy sees the
same traffic for the same seed. Durations are scenario seconds (simulated time).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from specguard import configfile
from specguard.errors import ConfigError


@dataclass(frozen=True)
class ClassLoad:
    """Closed-loop clients of one task type in a phase, each request drawing its temperature."""

    task_type: str
    clients: int  # concurrent closed-loop clients (each sends its next request when one ends)
    temperatures: tuple[tuple[float, float], ...] = ((0.0, 1.0),)  # (temperature, weight)

    def temperature_at(self, u: float) -> float:
        """The temperature for a uniform draw ``u`` in [0, 1) (inverse CDF of the weights)."""
        total = sum(weight for _, weight in self.temperatures)
        acc = 0.0
        for temperature, weight in self.temperatures:
            acc += weight / total
            if u < acc:
                return temperature
        return self.temperatures[-1][0]


@dataclass(frozen=True)
class Phase:
    """A stretch of stationary traffic; ``stationary`` phases repeat the previous phase's traffic."""

    name: str
    duration_s: float
    loads: tuple[ClassLoad, ...]

    @property
    def clients(self) -> int:
        return sum(load.clients for load in self.loads)

    def same_traffic(self, other: Phase) -> bool:
        return sorted(self.loads, key=lambda x: x.task_type) == sorted(other.loads, key=lambda x: x.task_type)


@dataclass(frozen=True)
class Scenario:
    name: str
    phases: tuple[Phase, ...]
    description: str = ""

    @property
    def duration_s(self) -> float:
        return sum(phase.duration_s for phase in self.phases)

    @property
    def task_types(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for phase in self.phases:
            for load in phase.loads:
                seen.setdefault(load.task_type, None)
        return tuple(seen)

    def boundaries(self) -> list[tuple[float, float, Phase]]:
        """(start, end, phase) in scenario seconds."""
        out, start = [], 0.0
        for phase in self.phases:
            out.append((start, start + phase.duration_s, phase))
            start += phase.duration_s
        return out

    def phase_at(self, t: float) -> int:
        """Index of the phase running at scenario time ``t`` (the last one past the end)."""
        for index, (_, end, _) in enumerate(self.boundaries()):
            if t < end:
                return index
        return len(self.phases) - 1

    def scaled(self, duration_s: float) -> Scenario:
        """The same scenario stretched or shrunk to ``duration_s`` in total."""
        factor = duration_s / self.duration_s
        return replace(self, phases=tuple(replace(p, duration_s=p.duration_s * factor) for p in self.phases))

    def with_clients_scaled(self, factor: float) -> Scenario:
        """Every phase's client counts times ``factor`` (at least one client where there was one)."""
        phases = []
        for phase in self.phases:
            loads = tuple(
                replace(load, clients=max(1, round(load.clients * factor)) if load.clients else 0)
                for load in phase.loads
            )
            phases.append(replace(phase, loads=loads))
        return replace(self, phases=tuple(phases))

    def stationary_phases(self) -> list[int]:
        """Indices of phases whose traffic equals the previous phase's (nothing changed)."""
        return [i for i in range(1, len(self.phases)) if self.phases[i].same_traffic(self.phases[i - 1])]


def _loads(code: int, extraction: int, chat: int, creative: int, *, code_mix=None) -> tuple[ClassLoad, ...]:
    return (
        ClassLoad("code", code, code_mix or ((0.0, 1.0),)),
        ClassLoad("extraction", extraction, ((0.0, 1.0),)),
        ClassLoad("chat", chat, ((0.7, 1.0),)),
        ClassLoad("creative", creative, ((1.0, 1.0),)),
    )


# code's temperature mix after the shift: most code requests now sample at 0.7 (a client changed
# its defaults), so the same task type lands in another temperature bucket with lower acceptance.
SHIFTED_CODE_MIX = ((0.0, 0.2), (0.7, 0.8))


def default_scenario() -> Scenario:
    """Mixed classes; load rising into saturation and back; code's temperature mix shifts late."""
    return Scenario(
        name="default",
        description=(
            "four task types; total concurrency 16 -> 32 -> 96 -> 160 -> 32 -> 16; "
            "then code's temperature mix shifts from 0.0 to mostly 0.7"
        ),
        phases=(
            Phase("low", 90.0, _loads(4, 4, 4, 4)),
            Phase("rising", 60.0, _loads(8, 8, 8, 8)),
            Phase("busy", 60.0, _loads(24, 24, 24, 24)),
            Phase("saturated", 90.0, _loads(40, 40, 40, 40)),
            Phase("falling", 60.0, _loads(8, 8, 8, 8)),
            Phase("low-again", 90.0, _loads(4, 4, 4, 4)),
            Phase("code-shift", 120.0, _loads(4, 4, 4, 4, code_mix=SHIFTED_CODE_MIX)),
        ),
    )


def stationary_scenario(clients: int = 8, duration_s: float = 1800.0) -> Scenario:
    """Constant traffic for ``duration_s``: a correct controller settles and then never acts."""
    loads = _loads(clients, clients, clients, clients)
    return Scenario(
        name=f"stationary-c{4 * clients}",
        description=f"constant mix at total concurrency {4 * clients} for {duration_s:.0f} s",
        phases=(Phase("settle", 300.0, loads), Phase("steady", duration_s - 300.0, loads)),
    )


def shift_scenario() -> Scenario:
    """Low load, then code's temperature mix shifts: measures detection delay after the shift."""
    before = _loads(4, 4, 4, 4)
    after = _loads(4, 4, 4, 4, code_mix=SHIFTED_CODE_MIX)
    return Scenario(
        name="shift",
        description="total concurrency 16; code's temperature mix shifts at 300 s",
        phases=(Phase("before", 300.0, before), Phase("after", 300.0, after)),
    )


def load_wave_scenario() -> Scenario:
    """Load rising into saturation and falling back, twice, no mix change."""
    phases = []
    for round_ in (1, 2):
        for name, c in (("low", 4), ("busy", 16), ("peak", 40), ("busy-down", 16)):
            phases.append(Phase(f"{name}-{round_}", 75.0, _loads(c, c, c, c)))
    return Scenario("load-wave", tuple(phases), "total concurrency 16 -> 64 -> 160 -> 64, twice")


BUILTIN = {
    "default": default_scenario,
    "shift": shift_scenario,
    "load-wave": load_wave_scenario,
    "stationary": stationary_scenario,
}


def load_scenario(name_or_path: str) -> Scenario:
    """A built-in scenario by name, or one read from a YAML file (see ``parse``)."""
    if name_or_path in BUILTIN:
        return BUILTIN[name_or_path]()
    if not Path(name_or_path).exists():
        raise ConfigError(
            f"scenario {name_or_path!r} is neither a built-in ({', '.join(BUILTIN)}) nor a readable file"
        )
    return configfile.parse_with(configfile.load_file(name_or_path), parse)


def parse(root: configfile.Section) -> Scenario:
    """Scenario YAML: ``name``, ``description``, ``phases: [{name, duration_seconds, loads: [...]}]``.

    Each load: ``{task_type, clients, temperatures: [{value, weight}]}`` (or ``temperature: 0.7``).
    """
    name = root.get("name", str, "custom")
    description = root.get("description", str, "")
    phases = []
    for phase_section in root.items("phases", required=True):
        loads = []
        for load in phase_section.items("loads", required=True):
            task_type = load.get("task_type", str)
            clients = load.get("clients", int, minimum=0)
            temps: list[tuple[float, float]] = []
            if "temperatures" in load:
                for entry in load.items("temperatures"):
                    value = entry.get("value", float, minimum=0.0, maximum=2.0)
                    weight = entry.get("weight", float, 1.0, minimum=0.0)
                    entry.reject_unknown()
                    if value is not None and weight is not None:
                        temps.append((value, weight))
                load.check(sum(w for _, w in temps) > 0, "temperatures", "needs a positive weight")
            else:
                temps.append((load.get("temperature", float, 0.0, minimum=0.0, maximum=2.0), 1.0))
            load.reject_unknown()
            if task_type is not None and clients is not None and temps:
                loads.append(ClassLoad(task_type, clients, tuple(temps)))
        duration = phase_section.get("duration_seconds", float, minimum=1.0)
        pname = phase_section.get("name", str, f"phase-{len(phases) + 1}")
        phase_section.reject_unknown()
        if duration is not None:
            phases.append(Phase(pname, duration, tuple(loads)))
    root.check(bool(phases), "phases", "needs at least one phase")
    root.reject_unknown()
    root.doc.raise_if_issues()
    return Scenario(name, tuple(phases), description)
