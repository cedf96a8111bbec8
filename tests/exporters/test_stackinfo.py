"""What a pool serves (``exporters.stackinfo``), read from the simulator's vLLM, SGLang, llama.cpp fronts."""

from __future__ import annotations

import aiohttp

from specguard.exporters import stackinfo
from specguard.sim import cluster
from specguard.sim.llamacpp_http import BUILD_INFO
from specguard.sim.vllm_http import VLLM_VERSION


async def test_engine_version_and_model_from_the_engines_own_endpoints():
    async with cluster.SimCluster.from_config(None, seed=0, dialect="vllm", pools=["nospec"]) as sim:
        async with aiohttp.ClientSession() as session:
            found = await stackinfo.fetch(session, sim.urls["nospec"], "vllm")
            assert found == {"engine": "vllm", "engine_version": VLLM_VERSION, "model": sim.config.model_name}
            # an engine whose version endpoint is unknown still names its model; nothing is guessed
            assert await stackinfo.fetch(session, sim.urls["nospec"], "auto") == {
                "model": sim.config.model_name
            }
            assert await stackinfo.fetch(session, "http://127.0.0.1:9", "vllm", timeout=0.5) == {
                "engine": "vllm"
            }


async def test_llamacpp_build_from_props():
    async with cluster.SimCluster.from_config(None, seed=0, dialect="llamacpp", pools=["nospec"]) as sim:
        async with aiohttp.ClientSession() as session:
            found = await stackinfo.fetch(session, sim.urls["nospec"], "llamacpp")
    assert found == {"engine": "llamacpp", "engine_version": BUILD_INFO, "model": sim.config.model_name}
