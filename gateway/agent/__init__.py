"""The agent: runs in a managed cluster, dials out to the hub, and serves tunnel streams."""
