"""Slurm 25.11's SLUID: read from the hooks' environment, recorded on the job
run (migration 0012; test_inventory_init compares the migrated schema with the
models on every database), selected and shown by `report`."""
from __future__ import annotations

import json

import pytest

from slurm_snap import errors
from slurm_snap.cli import report_cmd
from slurm_snap.inventory.repository import Inventory
from slurm_snap.slurm import jobenv
from test_report_seed import BOB, ROOT, invoke, seeded  # noqa: F401  (fixtures)

SLUID = "s0C8RJ1ZPQ3TVW"  # "s" + 13 base32 characters, as 25.11's sluid2str prints


def _env(**extra):
    return {"SLURM_JOB_ID": "7", "SLURM_JOB_UID": "0", "SLURM_JOB_USER": "root", **extra}


def test_the_hooks_read_the_sluid_and_ignore_what_is_not_one():
    assert jobenv.from_environ(_env(SLURM_JOB_SLUID=SLUID)).sluid == SLUID
    assert jobenv.from_environ(_env()).sluid == ""  # before 25.11
    for bad in ("s0C8RJ1ZPQ3TV", "x0C8RJ1ZPQ3TVW", "s0C8RJ1ZPQ3TVU", "s0c8rj1zpq3tvw"):  # short, prefix, U, case
        assert jobenv.from_environ(_env(SLURM_JOB_SLUID=bad)).sluid == ""


REQUEUED = "s0C8RJ1ZPQ3TW0"  # the requeued run's own (25.11.7 gives each run one)


def _give_sluid(url: str, job_id: int, runs: int) -> None:
    with Inventory(url).session() as repo:
        for rc in range(runs):
            repo.record_job_run(job_id=job_id, restart_count=rc, user_name="bob", uid=2002,
                                sluid=(SLUID, REQUEUED)[rc])


def test_report_selects_the_run_a_sluid_names_and_shows_each_runs(seeded):
    _give_sluid(seeded["url"], 1002, 2)
    code, out, exc = invoke(report_cmd.command, ["-j", SLUID, "-P", "-n", "-o", "JobID,SLUID"], seeded["config"], ROOT)
    assert code == 0, exc
    assert out == f"1002|{SLUID}\n"
    code, out, exc = invoke(report_cmd.command, ["-j", f"1001,{REQUEUED}", "-P", "-n", "-o", "JobID,SLUID"],
                            seeded["config"], ROOT)
    assert code == 0 and set(out.splitlines()) == {"1001|", f"1002.1|{REQUEUED}"}
    code, out, exc = invoke(report_cmd.command, ["-j", "1002", "--json"], seeded["config"], ROOT)
    assert code == 0 and {s["sluid"] for s in json.loads(out)["sets"]} == {SLUID, REQUEUED}


def test_an_unknown_sluid_is_not_found_by_name_and_access_still_applies(seeded):
    code, _, exc = invoke(report_cmd.command, ["-j", "s00000000000ZZ"], seeded["config"], ROOT)
    assert code == errors.NOT_FOUND and "s00000000000ZZ" in str(exc)
    _give_sluid(seeded["url"], 1002, 1)
    code, _, _ = invoke(report_cmd.command, ["-j", SLUID], seeded["config"], BOB)
    assert code == 0
