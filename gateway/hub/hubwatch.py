"""Following hub objects the way client-go's reflector does: list once, then watch.

:func:`follow` lists the objects page by page (each page a request at the process's hub write
rate, :mod:`gateway.hub.hubwrites`: a relist of 10,000 objects is 20 requests, not one burst),
hands them to ``replace``, then watches from the list's version and hands each event to
``apply``. A watch that ends (its timeout) is resumed from the last version it saw; only a
version the hub no longer has (410 Gone) or an error makes it list again, the latter after a
backoff. So the hub serves one list at start and then only what changes, however many
objects there are: no periodic relist.

Permissions decide the mode: without ``list`` (403 on the first page) the caller is told
(``forbidden``) and following stops; without ``watch`` the objects are listed again every
``relist_every`` seconds instead.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from gateway.hub.hubwrites import HubWrites

log = logging.getLogger("hubproxy.gateway")

PAGE_SIZE = 500  # objects per page of a list (client-go's pager uses 500 too)
WATCH_SECONDS = 300  # a watch is resumed from its last version after this long
MAX_BACKOFF = 30.0


class ListForbidden(Exception):
    """The hub refused to list (403)."""


async def list_pages(writes: HubWrites, resource: str, call: Callable[..., Any],
                     args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Any], str]:
    """Every object ``call(*args, **kwargs)`` lists, a page of PAGE_SIZE per request, and the
    list's resourceVersion. ListForbidden on a 403."""
    items: list[Any] = []
    token = ""
    while True:
        page_args = {**kwargs, "limit": PAGE_SIZE, **({"_continue": token} if token else {})}
        try:
            answer = await writes.send(resource, lambda a=page_args: call(*args, **a),
                                       write=False)
        except Exception as exc:
            if getattr(exc, "status", None) == 403:
                raise ListForbidden(str(exc)) from None
            raise
        items.extend(answer.get("items") or [])
        metadata = answer.get("metadata") or {}
        token = metadata.get("continue") or ""
        if not token:
            return items, str(metadata.get("resourceVersion") or "")


async def follow(writes: HubWrites, resource: str, what: str, call: Callable[..., Any],
                 args: tuple[Any, ...], *, replace: Callable[[list[Any]], None],
                 apply: Callable[[dict[str, Any]], None], kwargs: dict[str, Any] | None = None,
                 forbidden: Callable[[], None] | None = None,
                 relist_every: float = 30.0) -> None:
    """List then watch ``what`` for ever (see the module docstring); cancel to stop."""
    from kubernetes_asyncio import watch

    kwargs = dict(kwargs or {})
    backoff = 1.0
    version = ""  # "": list first
    watching = True
    while True:
        try:
            if not version:
                items, version = await list_pages(writes, resource, call, args, kwargs)
                replace(items)
            if not watching:
                await asyncio.sleep(relist_every)
                version = ""
                continue
            events = watch.Watch()
            async with events.stream(call, *args, **kwargs, resource_version=version,
                                     timeout_seconds=WATCH_SECONDS,
                                     allow_watch_bookmarks=True) as stream:
                async for event in stream:
                    apply(event)
                    backoff = 1.0
            # The watch timed out as asked: go on from the last version it saw.
            version = str(events.resource_version or version)
        except asyncio.CancelledError:
            raise
        except ListForbidden:
            if forbidden is None:
                raise
            forbidden()
            return
        except Exception as exc:
            status = getattr(exc, "status", None)
            version = ""  # gone (410) or failed: list again
            if status == 410:
                continue
            if status == 403 and watching:
                watching = False
                log.info("no permission to watch %s: listing them every %.0fs instead",
                         what, relist_every)
                continue
            log.warning("watching %s failed (%s); listing again in %.0fs", what,
                        status or type(exc).__name__, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)
