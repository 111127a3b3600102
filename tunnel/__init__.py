"""The reverse tunnel: a multiplexed, flow-controlled session between hub and agent."""
