"""A node's agent: one pass of every node-side pass (agent.PASSES), run by
a systemd timer, by every slurm-snap hook on the node, or by the dev
cluster's stand-in loop."""
