"""ClusterProfile (multicluster.x-k8s.io/v1alpha1) integration: the access-provider entry the
gateway publishes, and a consumer helper that turns a ClusterProfile into a client configuration."""
