"""kubesim: a small kube-apiserver stand-in for hubproxy's demo, tests and benchmarks.

Not a production component. It implements just enough of kube-apiserver's behaviour
(authentication, impersonation, RBAC, resources, watch, logs, exec, port-forward) for the
real kubectl and client libraries to work against it.
"""
