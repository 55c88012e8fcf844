"""doctor sizes GraceTime from the checkpoints preemptions actually took
(issue 16): first signal -> last acknowledgement, per partition, from the
inventory; suggested GraceTime = slowest x 1.5 + 10 s."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from slurm_snap import config
from slurm_snap.doctor import slurm_checks
from slurm_snap.cli import doctor_cmd
from slurm_snap.inventory.repository import Inventory
from test_report_seed import at, seeded  # noqa: F401  (fixtures)

PARTS = [{"PartitionName": "gpu", "PreemptMode": "REQUEUE", "GraceTime": "60"},
         {"PartitionName": "cpu", "PreemptMode": "REQUEUE", "GraceTime": "00:00:30"},
         {"PartitionName": "debug", "PreemptMode": "OFF", "GraceTime": "0"}]


def test_suggestion_is_the_slowest_with_headroom():
    assert slurm_checks.suggest_grace(3.0) == 15
    assert slurm_checks.suggest_grace(40.2) == 71   # 60.3 rounded up, + 10


def test_a_short_gracetime_fails_and_names_the_suggestion():
    cfg = config.from_dict({})
    observed = {"gpu": [(12.0, "app-consistent"), (41.0, "crash-consistent")], "cpu": [(4.0, "app-consistent")]}
    found = slurm_checks.check_grace_observed(cfg, PARTS, observed, 30)
    assert len(found) == 2                      # the partition that does not preempt is not checked
    gpu, cpu = found
    assert not gpu.ok and "GraceTime 60 s" in gpu.what and "slowest checkpoint of 2 preemption(s) in 30 days: " \
        "41.0 s, 1 not app-consistent" in gpu.what
    assert gpu.fix.startswith("raise GraceTime of gpu to 72 s") and "early_release" in gpu.fix
    assert cpu.ok and "suggested at least 16 s" in cpu.what


@pytest.mark.parametrize("slowest, ok", [(19.0, True), (20.0, True), (21.0, False)])
def test_a_problem_only_under_half_again_the_slowest(slowest, ok):
    """GraceTime 30 s: a 20 s checkpoint still has its 1.5x; a 21 s one has not.
    The suggestion (slowest x 1.5 + 10 s) is given either way."""
    (f,) = slurm_checks.check_grace_observed(config.from_dict({}), PARTS[1:2], {"cpu": [(slowest, "app-consistent")]}, 30)
    assert f.ok is ok and f"suggested at least {slurm_checks.suggest_grace(slowest)} s" in f.what


def test_a_partition_never_preempted_is_not_judged():
    (f,) = slurm_checks.check_grace_observed(config.from_dict({}), PARTS[:1], {}, 30)
    assert f.ok and "no preemption with acknowledgements" in f.what


def test_the_inventory_gives_each_preemptions_checkpoint_time(seeded):
    inv = Inventory(seeded["url"])
    with inv.session(readonly=True) as repo:
        got = repo.preempt_checkpoint_times(at("2026-11-01T00:00:00"))
        later = repo.preempt_checkpoint_times(at("2026-11-30T00:00:00"))
    inv.dispose()
    # Sets D (1002.0, app) and C (1002.1, crash), both gpu, barrier 3 s after the request;
    # manual sets are not preemptions.
    assert got == {"gpu": [(3.0, "crash-consistent"), (3.0, "app-consistent")]}
    assert later == {"gpu": [(3.0, "crash-consistent")]}


def now_is(monkeypatch, text):
    import slurm_snap.clock as clock

    monkeypatch.setattr(clock, "utcnow", lambda: at(text))


def test_doctor_counts_the_preemptions_of_its_window(seeded, monkeypatch):
    cfg = config.from_dict({"inventory": {"url": seeded["url"]}})
    ctx = SimpleNamespace(inventory=Inventory(seeded["url"]))
    now_is(monkeypatch, "2026-11-30T12:00:00")
    (f,) = doctor_cmd._grace_observed(ctx, cfg, PARTS[:1])
    assert f.ok and "slowest checkpoint of 2 preemption(s) in 30 days: 3.0 s, 1 not app-consistent" in f.what
    now_is(monkeypatch, "2027-01-15T12:00:00")     # both older than 30 days now
    (f,) = doctor_cmd._grace_observed(ctx, cfg, PARTS[:1])
    assert f.ok and "no preemption with acknowledgements in the last 30 days" in f.what
    ctx.inventory.dispose()


def test_doctor_says_nothing_of_gracetime_without_an_inventory(tmp_path):
    # check_local reports the unreadable inventory, with its fix, on its own line.
    cfg = config.from_dict({})
    missing = SimpleNamespace(inventory=Inventory(f"sqlite:///{tmp_path}/none.db"))
    assert doctor_cmd._grace_observed(missing, cfg, PARTS[:1]) == []
    assert not (tmp_path / "none.db").exists()
