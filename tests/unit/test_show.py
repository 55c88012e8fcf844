"""`slurm-snap show`: one set in full, exact text, and who may see it."""
from __future__ import annotations

import json

import pytest

from slurm_snap import errors
from slurm_snap.cli import show_cmd
from slurm_snap.report.show import ranks
from test_report_seed import ALICE, BOB, OPER, ROOT, invoke, seeded  # noqa: F401  (fixtures)

SET_A = """\
Set 1 of job 1001 (user alice, partition gpu, nodes n1,n2)
  trigger manual, epoch m-1, wanted app
  state VERIFIED, consistency app-consistent, resumable yes
  checkpoint step 500, skew 0.250 s, manifest ok, volumes 2/2
  survives the loss of any one node: no (a node-local part has its only copy on its node)

Phases:
  requested    2026-11-30T09:00:00.000  +0.000 s
  signalled    2026-11-30T09:00:01.000  +1.000 s
  barrier      2026-11-30T09:00:03.000  +3.000 s
  cut started  2026-11-30T09:00:03.500  +3.500 s
  cut done     2026-11-30T09:00:04.000  +4.000 s
  finished     2026-11-30T09:00:05.000  +5.000 s
  verified     2026-11-30T10:00:00.000  +3600.000 s

Barrier acknowledgements:
  NODE         RANKS            STEP  WRITTEN                  RECEIVED
  n1           0-1               500  2026-11-30T09:00:02.200  2026-11-30T09:00:02.300
  n2           2-3               500  2026-11-30T09:00:02.900  2026-11-30T09:00:03.000

Volumes:
  NODE       VOLUME                       BACKEND      CUT AT                       TOOK  STATE    MANIFEST    NAME
  n1         /scratch/n1/jobs/1001        btrfs        2026-11-30T09:00:03.750   0.250 s  CUT      ok          m-1-1  [lab/eu]
  (shared)   /pfs/jobs/1001               xfs-reflink  2026-11-30T09:00:04.000   0.500 s  CUT      ok          m-1-2  [lab/eu]

Node-local parts on other nodes:
  (none)

Restore tests:
  #1 PASSED started 2026-11-30T09:30:00.000 finished 2026-11-30T09:32:00.000 first step 501 after 42.500 s  slurm job 5001

Events:
  2026-11-30T08:59:00.000 warning n2         prolog: scratch quota near limit
  2026-11-30T09:00:01.000 info    -          phase: signalled 4 ranks
  2026-11-30T09:00:03.500 info    n1         cut: btrfs subvolume snapshot -r

Timeline:
            0s                                                    5.000s
  (set)    |wwwwwwwwwwwwqqqqqqqqqqqqqqqqqqqqqqqq      ccccccffffffffffff|
  (shared) |                                          cccccc            |
  n1       |            qqqqqqqqqqqqqqqq              ccc               |
  n2       |            qqqqqqqqqqqqqqqqqqqqqqqq                        |
  one character = 0.083 s; w wait, q quiesce (signal -> barrier), c cut, f finalize
"""


def show(seeded, *args, caller=ROOT):
    code, out, exc = invoke(show_cmd.command, list(args), seeded["config"], caller)
    assert code == 0, (code, out, exc)
    return out


@pytest.mark.parametrize("args", [["set:1"], ["--set", "1"], ["SET:1"]])
def test_show_set_a_exactly(seeded, args):
    assert show(seeded, *args) == SET_A


def test_job_means_its_newest_set_and_restart_picks_the_run(seeded):
    assert show(seeded, "1001").splitlines()[0] == "Set 2 of job 1001 (user alice, partition gpu, nodes n1,n2)"
    assert show(seeded, "1001.0").splitlines()[0] == "Set 2 of job 1001 (user alice, partition gpu, nodes n1,n2)"
    out = show(seeded, "1002.1")
    assert out.splitlines()[0] == "Set 4 of job 1002.1 (user bob, partition gpu, nodes n3)"
    assert "  reason: zfs: snapshot failed: pool busy" in out.splitlines()
    assert "volumes 1/2" in out
    # Job 1002's run-independent event shows; job 1001's do not.
    assert "prolog: prolog ran" in out and "scratch quota" not in out


def test_failed_set_without_parts_still_draws_a_timeline(seeded):
    out = show(seeded, "1003").splitlines()
    i = out.index("Timeline:")
    # Signalled after 1 s, failed waiting for the barrier at 61 s: the bar says where it stalled.
    assert out[i + 2] == "  (set) |" + "w" * 1 + "q" * 59 + "|"
    assert "  failed nodes: n4" in out


def test_owner_and_operator_may_look_others_may_not(seeded):
    assert show(seeded, "1001", caller=ALICE).startswith("Set 2 of job 1001")
    assert show(seeded, "1001", caller=OPER).startswith("Set 2 of job 1001")
    for args in (["1001"], ["set:1"]):
        code, _, exc = invoke(show_cmd.command, args, seeded["config"], BOB)
        assert code == errors.PERMISSION
        assert "job 1001 belongs to alice" in str(exc)


@pytest.mark.parametrize("args, code, named", [
    (["9999"], errors.NOT_FOUND, "'9999'"),
    (["set:77"], errors.NOT_FOUND, "'77'"),
    (["set:x"], errors.USAGE, "'set:x'"),
    (["12a"], errors.USAGE, "'12a'"),
    ([], errors.USAGE, "exactly one"),
    (["1001", "--set", "1"], errors.USAGE, "exactly one"),
])
def test_bad_targets(seeded, args, code, named):
    got, _, exc = invoke(show_cmd.command, args, seeded["config"], ROOT)
    assert got == code
    assert named in str(exc)


def test_show_json(seeded):
    doc = json.loads(show(seeded, "set:1", "--json"))
    assert doc["version"] == 1
    assert doc["set"]["job"] == "1001" and doc["set"]["state"] == "VERIFIED"
    assert (doc["set"]["consistency"], doc["set"]["parts_consistency"], doc["set"]["resumable"]) == (
        "app-consistent", "app-consistent", True)
    assert doc["set"]["times"]["cut_done"] == "2026-11-30T09:00:04Z"
    assert [(a["node"], a["rank"], a["received_at"]) for a in doc["acks"]] == [
        ("n1", 0, "2026-11-30T09:00:02.100000Z"), ("n1", 1, "2026-11-30T09:00:02.300000Z"),
        ("n2", 2, "2026-11-30T09:00:02.600000Z"), ("n2", 3, "2026-11-30T09:00:03Z")]
    assert [s["backend"] for s in doc["snapshots"]] == ["btrfs", "xfs-reflink"]
    assert doc["restore_tests"][0]["time_to_first_step"] == 42.5
    assert [e["kind"] for e in doc["events"]] == ["prolog", "phase", "cut"]


def test_rank_ranges():
    assert ranks([3, 0, 1, 2, 6, 8, 9]) == "0-3,6,8-9"
    assert ranks([5]) == "5"
    assert ranks([]) == ""


def test_preemption_shows_its_checkpoint_and_release_times(seeded):
    """Issue 16: the two numbers GraceTime is tuned with, in text and JSON."""
    d = seeded["ids"]["D"]
    lines = show(seeded, f"set:{d}").splitlines()
    released = [ln for ln in lines if ln.startswith("  released ")]
    assert len(released) == 1 and released[0].endswith(
        "+12.000 s  (early: rank 0 requeued the job once every rank had acknowledged)"), lines
    assert "  preemption: last acknowledgement 3.0 s after the first signal, nodes given back after 12.0 s " \
           "(early)" in lines, lines
    doc = json.loads(show(seeded, f"set:{d}", "--json"))
    assert (doc["set"]["release"], doc["set"]["times"]["released"]) == ("early", "2026-11-29T20:00:12Z")
    # A manual set has no release line at all.
    assert not [ln for ln in show(seeded, "set:1").splitlines() if ln.startswith("  released")]



def _table_after(lines: list[str], title: str) -> list[str]:
    rows = lines[lines.index(title) + 1:]
    return rows[:rows.index("")] if "" in rows else rows


LONG = "a-long-directory-name-for-volumes" * 2


def test_long_volume_paths_and_node_names_keep_the_volumes_table_aligned(tmp_path):
    """A path longer than the VOLUME column widens it (issue 35 item 10: the
    demo's BACKEND column shifted right under a long path)."""
    from protocol_fixtures import ROOT as ROOT_CALLER, make_env
    from slurm_snap import states as S
    from slurm_snap.protocol.coordinator import Coordinator
    from slurm_snap.report.show import render

    (tmp_path / LONG).mkdir()
    env = make_env(tmp_path / LONG, nodes=("node-with-a-long-name-1", "n2"))
    out = Coordinator(env.cfg, env.inv, caller=ROOT_CALLER).snapshot(env.job_id, consistency="crash")
    assert out.state == S.COMPLETE
    with env.inv.session(readonly=True) as repo:
        st = repo.report_set_detail(out.set_id)
        lines = render(st, [])
        snaps = sorted(st.snapshots, key=lambda s: s.id)
    table = _table_after(lines, "Volumes:")
    head = table[0]
    assert len(table) == 1 + len(snaps) and all(len(s.volume.path) > 28 for s in snaps)
    for row, snap in zip(table[1:], snaps):
        # Each value starts exactly under its title.
        assert row[head.index("VOLUME"):].startswith(snap.volume.path + " "), (head, row)
        assert row[head.index("BACKEND"):].startswith(snap.backend + " "), (head, row)
        assert row[head.index("STATE"):].startswith(snap.state + " "), (head, row)
        assert row[head.index("NAME"):].startswith(snap.name), (head, row)
    acks = _table_after(lines, "Barrier acknowledgements:")
    for row in acks[1:]:
        assert row[acks[0].index("WRITTEN"):][:4].isdigit(), (acks[0], row)


def test_show_of_a_job_without_a_set_aligns_its_long_paths(tmp_path, capsys):
    from protocol_fixtures import make_env
    from slurm_snap.cli import main

    (tmp_path / LONG).mkdir()
    env = make_env(tmp_path / LONG, nodes=("node-with-a-long-name-1",))
    assert main(["--config", env.cfg.path, "show", str(env.job_id)]) == 0
    lines = capsys.readouterr().out.splitlines()
    table = _table_after(lines, "Volumes:")
    head = table[0]
    for row in table[1:]:
        node, path, vclass, backend, state = row.split()
        assert len(path) > 28 and row[head.index("VOLUME"):].startswith(path + " "), (head, row)
        assert row[head.index("CLASS"):].startswith(vclass + " ") and row[head.index("BACKEND"):].startswith(
            backend + " "), (head, row)
        assert row[head.index("STATE"):] == state, (head, row)
