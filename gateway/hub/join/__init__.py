"""Clusters that join with one command (issue 12): tokens, records, signing, revocation.

``hubproxy cluster add|list|remove`` (:mod:`.command`) and the gateway (:mod:`.service`) share
one record per cluster, a Secret in the gateway's namespace (:mod:`.records`, :mod:`.store`).
The design is written down in ``tunnel/PROTOCOL.md`` ("Join") and ``deploy/README.md``.
"""
