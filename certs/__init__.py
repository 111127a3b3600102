"""Certificate authorities and certificates for hubproxy, and TLS contexts that reload them."""
