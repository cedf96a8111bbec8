"""Several simulated engine pools in one process, each on its own port with its own K.

async with SimCluster.from_config(None, seed=0, dialect="vllm", time_scale=0.1) as sim:
    sim.urls        # {"spec-k4": "http://127.0.0.1:PORT", "spec-k2": ..., "nospec": ...}
    sim.truth()     # same JSON as GET /sim/truth on any pool
"""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

from aiohttp import web

from specguard.errors import ConfigError, ConfigIssue
from specguard.exporters.addresses import bind_reason, join_listen
from specguard.sim import config as simconfig
from specguard.sim.config import SimConfig
from specguard.sim.runtime import PoolRuntime
from specguard.sim.truth import model_table, relative_cost


class SimCluster:
    def __init__(self, config: SimConfig, port_flag: str | None = None):
        self.config = config
        self.port_flag = port_flag  # the flag that numbered the ports (for a taken-port message)
        self.runtimes: dict[str, PoolRuntime] = {}
        self.servers: dict[str, Any] = {}
        self.urls: dict[str, str] = {}
        self._runners: list[web.AppRunner] = []
        self._model: dict[str, Any] | None = None  # model_table of the (frozen) config, made once

    @classmethod
    def from_config(
        cls,
        config: SimConfig | str | Path | None = None,
        seed: int | None = None,
        dialect: str | None = None,
        time_scale: float | None = None,
        *,
        host: str | None = None,
        port_base: int | None = None,
        pools: list[str] | tuple[str, ...] | None = None,
    ) -> SimCluster:
        """A cluster from a SimConfig, a YAML path or the shipped default (None), with overrides.

        ``port_base`` numbers the pools' ports from it (0 or None: each pool's configured port,
        0 there meaning ephemeral); ``pools`` keeps only the named pools, in that order.
        """
        if not isinstance(config, SimConfig):
            config = simconfig.load(config)
        if dialect is not None and dialect not in simconfig.DIALECTS:
            raise ConfigError(
                ConfigIssue(
                    "--dialect", None, None, "", f"{dialect!r} must be one of {', '.join(simconfig.DIALECTS)}"
                )
            )
        if time_scale is not None and not time_scale > 0:
            raise ConfigError(ConfigIssue("--time-scale", None, None, "", f"({time_scale}) must be > 0"))
        config = config.with_overrides(seed=seed, dialect=dialect, time_scale=time_scale, host=host)
        if pools:
            known = {p.name: p for p in config.pools}
            missing = [name for name in pools if name not in known]
            if missing:
                message = f"unknown pool(s) {', '.join(missing)} (configured: {', '.join(known)})"
                raise ConfigError(ConfigIssue("--pools", None, None, "", message))
            config = config.with_overrides(pools=tuple(known[name] for name in pools))
        if port_base:
            config = config.with_overrides(
                pools=tuple(replace(p, port=port_base + i) for i, p in enumerate(config.pools))
            )
        return cls(config, "--port-base" if port_base else None)

    async def __aenter__(self) -> SimCluster:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        # Imported here so virtual-time users never load the HTTP layer.
        if self.config.dialect == "vllm":
            from specguard.sim.vllm_http import VllmServer as server_cls
        elif self.config.dialect == "llamacpp":
            from specguard.sim.llamacpp_http import LlamacppServer as server_cls
        else:
            from specguard.sim.sglang_http import SglangServer as server_cls

        try:
            for pool in self.config.pools:
                runtime = PoolRuntime(self.config, pool, time_scale=self.config.time_scale)
                self.runtimes[pool.name] = runtime
                server = server_cls(runtime, self.truth)
                self.servers[pool.name] = server
                await runtime.start()
                # handler_cancellation: a client that goes away aborts its request, streamed or not
                runner = web.AppRunner(
                    server.app(), access_log=None, handle_signals=False, handler_cancellation=True
                )
                await runner.setup()
                self._runners.append(runner)
                site = web.TCPSite(runner, self.config.host, pool.port, reuse_address=True)
                try:
                    await site.start()
                except OSError as exc:
                    raise self._listen_error(pool.name, pool.port, exc) from exc
                port = _bound_port(runner, len(self.urls))
                self.urls[pool.name] = f"http://{self.config.host}:{port}"
        except BaseException:
            await self.stop()
            raise

    def _listen_error(self, name: str, port: int, exc: OSError) -> ConfigError:
        where = self.port_flag or f"pools.{name}.port"
        message = (
            f"cannot listen on {join_listen(self.config.host, port)} for pool {name}: {bind_reason(exc)}; "
            "choose free ports with --port-base PORT (the pools take PORT, PORT+1, ...)"
        )
        return ConfigError(ConfigIssue(where, None, None, "", message))

    async def stop(self) -> None:
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()
        for runtime in self.runtimes.values():
            await runtime.stop()

    def late(self) -> dict[str, dict[str, Any]]:
        """Each pool that ran behind its time scale lately (``PoolRuntime.schedule``): name -> schedule."""
        found = {name: runtime.schedule() for name, runtime in self.runtimes.items()}
        return {name: s for name, s in found.items() if s["late"]}

    def relative_cost(self, task: str, temperature: float, pool: str, concurrency: int) -> float:
        """The model's true RC of one class on ``pool`` at ``concurrency`` (1.0 on a K = 0 pool)."""
        k = self.config.pool(pool).k_at(concurrency)
        return relative_cost(self.config, task, temperature, k, concurrency)

    def truth(self) -> dict[str, Any]:
        """Ground truth for every pool plus the model's true RC table (JSON-ready)."""
        if self._model is None:  # 0.1-0.3 s each time held the pools' event loop (tests poll this)
            self._model = model_table(self.config)
        return {
            "seed": self.config.seed,
            "dialect": self.config.dialect,
            "time_scale": self.config.time_scale,
            "model_name": self.config.model_name,
            "pools": {
                name: {**runtime.truth.to_json(), "schedule": runtime.schedule()}
                for name, runtime in self.runtimes.items()
            },
            "model": copy.deepcopy(self._model),
        }


def _bound_port(runner: web.AppRunner, index: int) -> int:
    """The port the pool's runner actually bound (the configured one, or the ephemeral one)."""
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    raise RuntimeError(f"pool #{index}: the simulator's listening socket has no port")
