"""`slurm-snap doctor`: Slurm's running configuration and slurm-snap's own side,
checked together.

The checks are pure: each takes facts and returns findings, so every verdict
is tested with made-up facts and no I/O. The probes gather those facts (ask
Slurm, read files Slurm will run, open the inventory, reach hosts over SSH,
connect to the service), and the command (cli/doctor_cmd.py) gathers and
prints:

    finding.py       one line of doctor's output: ok or not, what, the fix
    facts.py         what the probes gather (frozen records)
    probes.py        every I/O doctor does
    slurm_checks.py  Slurm's configuration against slurm-snap's (hooks, signal,
                     plugstack, cli_filter, GraceTime, timeouts)
    site_checks.py   slurm-snap's own side (inventory, volume classes, barrier
                     directory) and the cluster's (service, SSH host keys, nodes)
    security_checks.py  the live setup against SECURITY.md (the service's
                     port, owners and modes of trusted files, SSH as root, a
                     non-root SSH account's sudo rule)
"""
