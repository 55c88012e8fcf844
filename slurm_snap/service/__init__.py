"""The slurm-snap service: the inventory for hosts that must not hold it.

Compute nodes and login hosts are not the controller: they cannot open its
SQLite file, and ordinary users there must never hold database credentials.
`slurm-snap serve` runs on the controller as root; the other hosts' config
names it (`[inventory] url = "slurm-snap://ADDR:PORT"`). Requests are
authenticated with MUNGE, the credential service every Slurm cluster already
runs: the request itself is the credential's payload, so the uid munged
vouches for is bound to exactly that request, and munged refuses a replayed
credential. Replies are sealed the same way (a credential of root over their
digest) so a client knows the controller answered.

  address.py  slurm-snap://ADDR:PORT and ADDR:PORT parsing (stdlib only)
  wire.py     framing and MUNGE encode/decode through munge(1)/unmunge(1)
  client.py   forwarding a user's command; hook operations for nodes
  server.py   the forking server and what it lets each caller do
"""

# The commands a user on another host runs on the controller through the
# service (here, not in server.py: the CLI of every login host reads it
# before it forwards, and server.py's imports are the service's own).
USER_COMMANDS = ("report", "show", "snapshot", "restore-test")

# What of the user's environment those commands read, and nothing else: the
# zone times print in, and report's default columns (report_cmd.FORMAT_ENV).
# Sent with the request; the child serving it sets each (or unsets it, so the
# service's own environment never answers for the user).
USER_ENVIRONMENT = ("TZ", "SLURM_SNAP_REPORT_FORMAT")
