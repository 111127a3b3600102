"""Garbage collection for the long-running gateway and agent processes.

Both import large libraries (kubernetes-asyncio alone brings tens of thousands of objects) that
live as long as the process. A full collection walks all of them: about 20 ms on the benchmark
machine, a latency spike every time it runs. Once start-up is over, :func:`settle` moves every
object alive into the permanent generation (``gc.freeze``), so later collections walk only what
the traffic created. (Rarer young collections were tried too: fewer of them cost no less CPU in
total and made the latency tail worse, each walking more objects.)
"""

from __future__ import annotations

import gc


def settle() -> None:
    gc.collect()
    gc.freeze()
