"""Kubernetes-format audit (opt-in): ``audit.k8s.io/v1`` ``Event`` objects for a SIEM.

* :mod:`.policy` -- which requests are audited: level ``None`` or ``Metadata`` by user, group,
  cluster and verb, the first matching rule wins (kube-apiserver's ``Policy``, a subset);
* :mod:`.event` -- one request's ``Event`` as kube-apiserver writes it (field names, formats,
  stages), never a token and never a body (``Metadata`` is the highest level);
* :mod:`.backends` -- where the events go: a file (one JSON object per line, as
  ``--audit-log-format=json``) or a webhook (an ``EventList`` per batch, as kube-apiserver's
  webhook backend posts), batched, retried with backoff, through a bounded buffer that drops
  (and counts) rather than make a request wait.

The hub side (:mod:`gateway.hub.audittrail`) decides what a request's event says; these
modules know nothing of the gateway.
"""
