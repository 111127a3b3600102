"""How long an agent waits before dialling again after its dial reached a hub instance it
already holds (several hub instances share one address; see :class:`tunnel.dialer.HubFanout`).

The model: the balancer in front of the instances (a Kubernetes Service, HAProxy round robin,
the kernel's ``SO_REUSEPORT``) sends each dial to one of the ``announced`` instances about
uniformly, other clients' connections interleaving with ours. With ``missing`` of them not yet
held, a dial reaches one with probability p = missing / announced, so finding the last of
four takes four dials on average, and three misses in a row happen 42% of the time (0.75³).

The rule, one search per set of missing instances:

* Misses are counted across all of an agent's dialers (each dial has the same chance whichever
  dialer makes it) and start again from zero whenever the search changes: a dial reached a new
  instance, the hub listed a new one, one left the list, or a held session ended.
* Free redials: the number of dials in which a uniform balancer reaches a live missing instance
  with probability ``1 - MISS_CHANCE`` (99.9%): ln(0.001) / ln(1 - p), e.g. 10 for the last of
  two, 25 for the last of four, 439 for the last of 64 (HUB_PEER's limit). Each waits a random
  ``REDIAL_DELAY``, so the last of four is reached within about 5 s in 999 searches of 1000
  (99.9%, not 99%: a new instance is Ready only once every cluster holds a session to it, so
  with a thousand clusters the tail of one search is the delay of the rollout).
* Then the delay doubles after every further ``ceil(1 / p)`` misses (one expected search each),
  up to ``REDIAL_DELAY_CAP``.

That holds for instances the hub *lists* (HUB_PEER): each holds a Lease renewed every few
seconds, so a listed instance that does not exist is one that crashed, and it leaves the list
when its Lease expires (15 s): a bounded search, about 20 dials per agent for the crashed one
of two. (A pod's ``--workers`` without Leases are listed too: the supervisor fixes their ids,
and a worker that exits stops the pod.) A hub that announces only a *count* (the deprecated
``--replicas``) may announce instances that never come, so a count gets one expected search,
``ceil(1 / p)`` free redials (3 for the missing one of three, as before this rule), then the
delay doubles at every miss: such a hub costs an agent a redial every 30 s, not a storm.

Pure: no I/O; randomness injected.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

REDIAL_DELAY = (0.05, 0.3)  # seconds, uniform: spreads an agent's dials among other clients'
REDIAL_DELAY_CAP = 30.0
MISS_CHANCE = 0.001  # free redials end once a live listed instance would be found 99.9% of the time
MAX_DOUBLINGS = 10


@dataclass(frozen=True)
class Search:
    """What an agent's dialers are looking for: ``missing`` of the ``announced`` instances.

    ``listed``: the hub names its live instances (HUB_PEER, from Leases), ``missing_ids`` are
    them; otherwise it announces only how many there are.
    """

    announced: int
    missing: int
    listed: bool
    missing_ids: frozenset[int] = frozenset()

    @property
    def hit_chance(self) -> float:
        """The chance that one dial through a uniform balancer reaches a missing instance."""
        return min(1.0, max(1, self.missing) / max(1, self.announced))

    @property
    def expected_dials(self) -> int:
        return math.ceil(1 / self.hit_chance)

    @property
    def free_redials(self) -> int:
        if not self.listed:
            return self.expected_dials
        if self.hit_chance >= 1.0:
            return 1
        return math.ceil(math.log(MISS_CHANCE) / math.log(1 - self.hit_chance))

    @property
    def doubling_period(self) -> int:
        """Misses past the free ones per doubling of the delay."""
        return self.expected_dials if self.listed else 1


@dataclass
class RedialBackoff:
    """Misses of the current search, and the delay before the next dial (module docstring)."""

    uniform: Callable[[float, float], float] = field(default=random.uniform, repr=False)
    search: Search | None = None
    misses: int = 0

    def missed(self, search: Search) -> float:
        """A dial reached an instance already held while looking for ``search``: the delay
        before dialling again."""
        if search != self.search:
            self.search, self.misses = search, 0
        self.misses += 1
        over = self.misses - search.free_redials
        doublings = 0 if over <= 0 else math.ceil(over / search.doubling_period)
        low, high = REDIAL_DELAY
        return min(REDIAL_DELAY_CAP, self.uniform(low, high) * 2.0 ** min(doublings, MAX_DOUBLINGS))
