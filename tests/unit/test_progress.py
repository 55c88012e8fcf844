"""Progress of long commands (issue 34, slurm_snap/progress.py): a live line
on a terminal (phase, items done of total, bytes, elapsed), nothing when not
a terminal or with --json, each phase's duration logged at -v. The last
tests run the real `slurm-snap prune --apply` under a pseudo-terminal."""
from __future__ import annotations

import io
import logging
import os
import pty
import select
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from slurm_snap import progress
from test_report_seed import seed, write_config

ROOT = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_the_line_shows_phase_items_bytes_and_elapsed():
    out, clock = io.StringIO(), Clock()
    with progress.Line("restore-test set:12", live=True, stream=out, clock=clock, ticker=False) as line:
        progress.phase("clone", total=4)
        clock.now += 7
        progress.advance()
        progress.advance(1, nbytes=1_400_000_000)
        assert line.text() == "restore-test set:12 | clone 2/4 | 1.3 GiB | 00:07"
        progress.advance(2)
        assert out.getvalue().split("\r")[-1].startswith("restore-test set:12 | clone 4/4 | 1.3 GiB | 00:07")
    # Left: an empty line, cleared with blanks, nothing else.
    assert out.getvalue().endswith("\r")


def test_elapsed_past_an_hour_and_units():
    assert progress.clock_text(3725) == "1:02:05" and progress.clock_text(65) == "01:05"
    assert progress.human_bytes(512) == "512 B" and progress.human_bytes(3 << 20) == "3.0 MiB"


def test_silent_when_not_a_terminal_and_phases_still_logged(caplog):
    out, clock = io.StringIO(), Clock()
    caplog.set_level(logging.INFO, logger="slurm_snap.progress")
    with progress.Line("prune", stream=out, clock=clock):      # StringIO is no TTY
        progress.phase("delete sets", total=2)
        clock.now += 1.5
        progress.advance(2)
        progress.phase("second")
        clock.now += 0.25
    assert out.getvalue() == ""
    assert [r.getMessage() for r in caplog.records] == ["prune: delete sets took 1.5 s, 2/2 done",
                                                        "prune: second took 0.2 s"]


def test_nothing_reports_anywhere_without_a_line():
    progress.phase("x", total=1)
    progress.advance(1, nbytes=5)
    progress.count()
    assert progress._active is None


def test_held_line_keeps_its_phase_counts_its_own_items_and_adds_bytes():
    """A schedule pass counts its sets and drills; the drills' own clones
    neither take the line over nor count, their bytes do."""
    with progress.Line("schedule", live=False, ticker=False) as line:
        progress.phase("sets and drills", total=2)
        with progress.hold():
            progress.phase("clone", total=9)         # a drill inside the pass
            progress.advance(3, nbytes=100)
            progress.count()
            worker = threading.Thread(target=progress.count)   # the runner's worker threads report too
            worker.start()
            worker.join(timeout=5)
        assert (line.name, line.total, line.done, line.bytes) == ("sets and drills", 2, 2, 100)


# ---- the real command under a pseudo-terminal --------------------------------------------------
@pytest.fixture
def seeded_config(tmp_path):
    url = f"sqlite:///{tmp_path}/inv.db"
    seed(url)
    return write_config(tmp_path, url, operators=("root",))


def run_on_pty(argv: list[str], timeout: float = 60) -> tuple[int, str]:
    """argv with stdin, stdout and stderr on a pseudo-terminal; all it wrote."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, close_fds=True,
                            env={**os.environ, "TERM": "xterm", "COLUMNS": "200"})
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], timeout)
        if not ready:
            proc.kill()
            raise AssertionError("no output for %s s" % timeout)
        try:
            data = os.read(master, 65536)
        except OSError:       # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return proc.wait(timeout=timeout), b"".join(chunks).decode(errors="replace")


PRUNE = ["prune", "--keep-within", "1h", "--no-keep-verified", "--force", "--apply"]


def cli(config: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "slurm_snap", "--config", config, *args]


def test_prune_apply_shows_a_live_line_on_a_terminal(seeded_config):
    code, text = run_on_pty(cli(seeded_config, *PRUNE))
    frames = [f.strip() for f in text.replace("\r\n", "\n").split("\r") if f.strip()]
    drawn = [f for f in frames if f.startswith("prune | ")]
    assert drawn, text
    assert drawn[0].startswith("prune | delete sets 0/3 | 00:0")
    assert any(f.startswith("prune | delete sets 3/3 | ") for f in drawn), drawn
    assert "deleted " in text                      # then the command's own report, on a clean line
    assert code in (0, 7)                          # these seeded sets' snapshots exist nowhere


def test_json_on_a_terminal_and_a_pipe_print_no_line(seeded_config, tmp_path):
    code, text = run_on_pty(cli(seeded_config, *PRUNE, "--json"))
    assert "prune | " not in text and "\r\x1b" not in text
    # A fresh inventory for the pipe: the first run deleted what it could.
    url = f"sqlite:///{tmp_path}/pipe.db"
    seed(url)
    (tmp_path / "p").mkdir()
    config = write_config(tmp_path / "p", url, operators=("root",))
    r = subprocess.run(cli(config, *PRUNE), capture_output=True, text=True, timeout=60)
    assert "prune | " not in r.stderr and "\r" not in r.stderr
    assert "deleted " in r.stdout


def test_verbose_logs_each_phase_with_its_duration_even_without_a_terminal(seeded_config):
    r = subprocess.run(cli(seeded_config, "-v", *PRUNE), capture_output=True, text=True, timeout=60)
    assert "prune: delete sets took " in r.stderr and " s, 3/3 done" in r.stderr, r.stderr
    assert "\r" not in r.stderr
