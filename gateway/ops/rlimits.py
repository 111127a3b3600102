"""Open-file limits for the gateway and agent processes.

Every client connection, tunnel session and upstream connection is a file descriptor; a common
default soft limit of 1024 would refuse connections long before ``--max-connections`` or
``--max-upstream-connections``. Like the Go runtime (since 1.19), both processes raise their soft
limit to the hard limit at start; the hard limit stays the operator's.
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger(__name__)


def raise_open_file_limit(wanted: int = 0) -> int:
    """Soft ``RLIMIT_NOFILE`` up to the hard limit; returns the new soft limit. Warns when it is
    still below ``wanted`` (what the configured connection limits can use)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, wanted)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit from %d: %s", soft, exc)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        log.warning("open-file limit %d is below the %d connections configured: connections "
                    "beyond it will be refused (raise the hard limit, ulimit -Hn)", soft, wanted)
    return soft
