"""kubesim: a small kube-apiserver stand-in for hubproxy's demo, tests and benchmarks.

Not a production component: state lives in memory, tokens are HMAC-signed, there is no
admission, no garbage collection, no real containers. It implements just enough of
kube-apiserver's behaviour (authentication, impersonation, RBAC, reviews, resources and
CRDs, watch, logs, exec, port-forward) for the real kubectl and client libraries to work
against it, with the same status codes and `Status` bodies for errors.

Entry points: `python -m kubesim` / `hubproxy kubesim` (kubesim.cli), and
`kubesim.testing.run_kubesim` for tests. See kubesim/README.md.
"""
