"""``specguard.signals.stop_on``: a signal sets the stop event, and the handlers are gone before the
loop closes (CPython's ``loop.close()`` closes the self-pipe before removing them, and a second
signal in that window printed a traceback: a README hand-run test failed on it once)."""

from __future__ import annotations

import asyncio
import os
import signal

from specguard import signals


def test_a_signal_sets_stop_and_the_defaults_are_back_before_the_loop_closes():
    seen = {}

    async def main():
        stop = asyncio.Event()
        with signals.stop_on(stop):
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.wait_for(stop.wait(), 5)
        seen["term"] = signal.getsignal(signal.SIGTERM)
        seen["int"] = signal.getsignal(signal.SIGINT)
        seen["wakeup"] = signal.set_wakeup_fd(-1)  # the previous wakeup fd: none left behind

    asyncio.run(main())
    assert seen == {"term": signal.SIG_DFL, "int": signal.default_int_handler, "wakeup": -1}
