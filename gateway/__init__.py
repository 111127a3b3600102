"""hubproxy gateway: the hub-side front door, and the agent's HTTP side, over the tunnel."""
