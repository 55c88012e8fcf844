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
