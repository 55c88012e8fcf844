"""Inventory tables: SQLAlchemy 2.0 typed models.

Portable across SQLite, PostgreSQL and MariaDB: no server-specific defaults;
timestamps go through UTCDateTime because SQLite keeps no zone. MariaDB's
plain DATETIME keeps whole seconds and its FLOAT is single precision, so
there (only there) timestamps are DATETIME(6) and seconds DOUBLE (migration
0007): an acknowledgement written in the request's own second must still
compare as after it, and a drill's time to first step must read back as written.
Queries do not live here: see the query modules beside it (repository.py lists them).

Length: one file for the one schema: the tables refer to each other (foreign keys,
relationships), and a migration is checked against all of them at once.
"""
from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Optional

from sqlalchemy import (JSON, BigInteger, Boolean, DateTime, Float, ForeignKey, Index, Integer, String, Text,
                        TypeDecorator, UniqueConstraint, false)
from sqlalchemy.dialects import mysql
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from ..states import COPY_OK, NODE_PLANNED, PART_CUT, TASK_PENDING, WANT_APP


MYSQL_DIALECTS = ("mysql", "mariadb")
# Seconds as a double everywhere (PostgreSQL's float and SQLite's REAL already are).
Seconds = Float().with_variant(mysql.DOUBLE(asdecimal=False), *MYSQL_DIALECTS)


class UTCDateTime(TypeDecorator):
    """Store naive UTC, hand back aware UTC; refuse naive input (a local time
    written by a node with another TZ would silently shift the timeline)."""

    impl = DateTime
    cache_ok = True

    def load_dialect_impl(self, dialect):
        if dialect.name in MYSQL_DIALECTS:
            return dialect.type_descriptor(mysql.DATETIME(fsp=6))
        return dialect.type_descriptor(DateTime())

    def process_bind_param(self, value, dialect):
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass an aware UTC datetime")
        return value.astimezone(dt.timezone.utc).replace(tzinfo=None)

    def process_result_value(self, value, dialect):
        if value is None:
            return None
        return value.replace(tzinfo=dt.timezone.utc)

    def result_processor(self, dialect, coltype):
        """process_result_value over the driver's value, in one step: on
        SQLite (text) datetime.fromisoformat reads what DateTime wrote
        ("YYYY-MM-DD HH:MM:SS[.ffffff]") at a fifth of the cost of the
        generic chain (impl's regular expression, then this decorator); a
        report of 10,000 sets reads up to 90,000 of them."""
        utc = dt.timezone.utc
        if dialect.name == "sqlite":
            parse = dt.datetime.fromisoformat

            def process(value):
                if value is None:
                    return None
                if isinstance(value, str):
                    try:
                        # The zone in the text: replace(tzinfo=) costs five times the parse.
                        return parse(value + "+00:00")
                    except ValueError:
                        value = parse(value)
                return value.replace(tzinfo=utc)
            return process
        chained = super().result_processor(dialect, coltype)
        if chained is not None:
            return chained

        def process_driver_datetime(value):
            return None if value is None else value.replace(tzinfo=utc)
        return process_driver_datetime


intpk = Annotated[int, mapped_column(Integer, primary_key=True, autoincrement=True)]
utc = Annotated[dt.datetime, mapped_column(UTCDateTime())]
utc_opt = Annotated[Optional[dt.datetime], mapped_column(UTCDateTime(), nullable=True)]
str64 = Annotated[str, mapped_column(String(64))]
str255 = Annotated[str, mapped_column(String(255))]
path_t = Annotated[str, mapped_column(String(4096))]


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class JobRun(Base):
    """One run of a Slurm job: requeue keeps the job id and bumps restart_count."""

    __tablename__ = "job_run"
    __table_args__ = (UniqueConstraint("job_id", "restart_count", name="uq_job_run"),
                      Index("ix_job_run_user", "user_name"), Index("ix_job_run_every", "snapshot_every"))

    id: Mapped[intpk]
    job_id: Mapped[int] = mapped_column(BigInteger, index=True)
    restart_count: Mapped[int] = mapped_column(Integer, default=0)
    user_name: Mapped[str64]
    uid: Mapped[int] = mapped_column(Integer)
    partition: Mapped[str64] = mapped_column(default="")
    nodes: Mapped[list[Any]] = mapped_column(JSON, default=list)
    options: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[utc]
    # Seconds between periodic snapshots (migration 0009): --snapshot-every or
    # the partition's default, never under its minimum; None: none taken.
    snapshot_every: Mapped[int | None] = mapped_column(Integer, nullable=True, default=None)
    # Slurm's SLUID of this run (25.11+, migration 0012): unique on the
    # cluster even after job ids wrap; a requeued run has its own; None before
    # 25.11.
    sluid: Mapped[str | None] = mapped_column(String(14), nullable=True, default=None, index=True)

    volumes: Mapped[list["Volume"]] = relationship(back_populates="job_run", cascade="all, delete-orphan",
                                                   order_by="Volume.id")
    sets: Mapped[list["SnapshotSet"]] = relationship(back_populates="job_run", order_by="SnapshotSet.id")

    @property
    def label(self) -> str:
        return f"{self.job_id}.{self.restart_count}" if self.restart_count else str(self.job_id)


class Volume(Base):
    """A volume the job declared, one row per node for node-local scope."""

    __tablename__ = "volume"
    __table_args__ = (UniqueConstraint("job_run_id", "path", "node", name="uq_volume"),)

    id: Mapped[intpk]
    job_run_id: Mapped[int] = mapped_column(ForeignKey("job_run.id", ondelete="CASCADE"), index=True)
    path: Mapped[path_t]
    scope: Mapped[str] = mapped_column(String(16))
    # Empty string, not NULL, for shared volumes: NULLs never collide in a unique key.
    node: Mapped[str64] = mapped_column(default="")
    volume_class: Mapped[str64]
    backend: Mapped[str64]
    site: Mapped[str64] = mapped_column(default="")
    region: Mapped[str64] = mapped_column(default="")
    prepared_at: Mapped[utc_opt]
    created_at: Mapped[utc]
    # Set when the node Prolog refused the declared path (migration 0004): the
    # job runs without it, report/show say why, and no cut touches the path.
    refused_at: Mapped[utc_opt]
    refusal: Mapped[Optional[str]] = mapped_column(String(2000), nullable=True)

    job_run: Mapped[JobRun] = relationship(back_populates="volumes")


class SnapshotSet(Base):
    """Every declared volume of a job cut as one set, with a timestamp per phase."""

    __tablename__ = "snapshot_set"
    __table_args__ = (UniqueConstraint("job_run_id", "epoch", name="uq_set_epoch"),
                      Index("ix_set_state_requested", "state", "requested_at"),
                      Index("ix_set_requested", "requested_at"),
                      # report: RPO is max(cut_done_at) of VERIFIED sets per job (covering
                      # index), and a user's window is user_name + requested_at (migration 0002).
                      Index("ix_set_job_state_cut", "job_id", "state", "cut_done_at"),
                      Index("ix_set_user_requested", "user_name", "requested_at"))

    id: Mapped[intpk]
    job_run_id: Mapped[int] = mapped_column(ForeignKey("job_run.id"), index=True)
    # Denormalized so report filters by job and user need no join.
    job_id: Mapped[int] = mapped_column(BigInteger, index=True)
    user_name: Mapped[str64] = mapped_column(index=True)
    epoch: Mapped[str64]
    trigger: Mapped[str] = mapped_column(String(16))
    wanted: Mapped[str] = mapped_column(String(16), default=WANT_APP)
    # The set's label as a point to restore from ("none" for a set that is
    # not one: states.NOT_A_POINT); parts_consistency the label of the parts
    # that were cut (migration 0011). states.labels_for is the one rule.
    consistency: Mapped[str] = mapped_column(String(24), default="none")
    parts_consistency: Mapped[str] = mapped_column(String(24), default="none", server_default="none")
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text, default="")
    # Who drives the set now: host:pid of the coordinator, for repair.
    owner: Mapped[str255] = mapped_column(default="")
    deadline: Mapped[utc_opt]
    requested_at: Mapped[utc]
    signalled_at: Mapped[utc_opt]
    barrier_at: Mapped[utc_opt]
    cut_started_at: Mapped[utc_opt]
    cut_done_at: Mapped[utc_opt]
    finished_at: Mapped[utc_opt]
    verified_at: Mapped[utc_opt]
    # A preemption's nodes given back: rank 0's early requeue ("early") or
    # Slurm's kill at the end of GraceTime ("grace"), or the time limit
    # ("limit", a time-limit set Slurm ended there); None for other triggers.
    released_at: Mapped[utc_opt]
    release: Mapped[str] = mapped_column(String(16), default="", server_default="")
    skew_seconds: Mapped[Optional[float]] = mapped_column(Seconds, nullable=True)
    checkpoint_step: Mapped[Optional[int]] = mapped_column(BigInteger, nullable=True)
    manifest_ok: Mapped[Optional[bool]] = mapped_column(nullable=True)
    expected_parts: Mapped[int] = mapped_column(Integer, default=0)
    failed_nodes: Mapped[list[Any]] = mapped_column(JSON, default=list)

    job_run: Mapped[JobRun] = relationship(back_populates="sets")
    snapshots: Mapped[list["Snapshot"]] = relationship(back_populates="set", order_by="Snapshot.id")
    acks: Mapped[list["BarrierAck"]] = relationship(back_populates="set", order_by="BarrierAck.id")
    restore_tests: Mapped[list["RestoreTest"]] = relationship(back_populates="set", order_by="RestoreTest.id")


class Snapshot(Base):
    """One backend snapshot of one volume (on one node) inside a set."""

    __tablename__ = "snapshot"
    __table_args__ = (UniqueConstraint("set_id", "volume_id", name="uq_snapshot_part"),)

    id: Mapped[intpk]
    set_id: Mapped[int] = mapped_column(ForeignKey("snapshot_set.id"), index=True)
    volume_id: Mapped[int] = mapped_column(ForeignKey("volume.id"))
    backend: Mapped[str64]
    name: Mapped[str255]
    ref: Mapped[path_t]
    path: Mapped[path_t] = mapped_column(default="")
    node: Mapped[str64] = mapped_column(default="")
    # CUT, DELETING, DELETED, MISSING
    state: Mapped[str] = mapped_column(String(16), default=PART_CUT)
    cut_started_at: Mapped[utc]
    cut_at: Mapped[utc]
    site: Mapped[str64] = mapped_column(default="")
    region: Mapped[str64] = mapped_column(default="")
    # Whole-filesystem backends (Lustre) share one snapshot between sets cut together.
    shared_key: Mapped[str255] = mapped_column(default="")
    manifest_ok: Mapped[Optional[bool]] = mapped_column(nullable=True)
    error: Mapped[str] = mapped_column(Text, default="")

    set: Mapped[SnapshotSet] = relationship(back_populates="snapshots")
    volume: Mapped[Volume] = relationship()


class PartCopy(Base):
    """Another node's copy of a node-local part (migration 0010): brought to
    the node a requeued run's rank now runs on ("restore"), or a second copy
    kept against the loss of the first node ("partner"). FAILED rows say why a
    copy could not be made, so show and resume.json name the missing part."""

    __tablename__ = "part_copy"
    __table_args__ = (Index("ix_part_copy_set", "set_id"),
                      Index("ix_part_copy_snapshot_node", "snapshot_id", "node"))

    id: Mapped[intpk]
    snapshot_id: Mapped[int] = mapped_column(ForeignKey("snapshot.id"))
    # Denormalized: show and repair read a set's copies without the join.
    set_id: Mapped[int] = mapped_column(Integer)
    node: Mapped[str64]
    ref: Mapped[path_t]
    path: Mapped[path_t] = mapped_column(default="")
    purpose: Mapped[str] = mapped_column(String(16))     # restore | partner | drill
    # The run whose Prolog asked (restore); None for partner copies.
    for_restart: Mapped[Optional[int]] = mapped_column(Integer, nullable=True)
    ranks: Mapped[list[Any]] = mapped_column(JSON, default=list)
    source_node: Mapped[str64] = mapped_column(default="")
    method: Mapped[str] = mapped_column(String(24), default="")   # send, send-incremental, copy, present
    bytes: Mapped[Optional[int]] = mapped_column(BigInteger, nullable=True)
    seconds: Mapped[Optional[float]] = mapped_column(Seconds, nullable=True)
    state: Mapped[str] = mapped_column(String(16), default=COPY_OK)  # states.COPY_STATES
    error: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[utc]

    snapshot: Mapped["Snapshot"] = relationship()


class BarrierAck(Base):
    """A rank's acknowledgement: it checkpointed, fsynced, and says what it wrote."""

    __tablename__ = "barrier_ack"
    __table_args__ = (UniqueConstraint("set_id", "node", "rank", name="uq_ack"),)

    id: Mapped[intpk]
    set_id: Mapped[int] = mapped_column(ForeignKey("snapshot_set.id"), index=True)
    node: Mapped[str64]
    rank: Mapped[int] = mapped_column(Integer)
    local_rank: Mapped[int] = mapped_column(Integer, default=0)
    local_size: Mapped[int] = mapped_column(Integer, default=1)
    step: Mapped[int] = mapped_column(BigInteger)
    written_at: Mapped[utc]
    received_at: Mapped[utc]
    manifest: Mapped[list[Any]] = mapped_column(JSON, default=list)
    # The launcher's number of ranks; None from clients that do not say.
    world_size: Mapped[Optional[int]] = mapped_column(Integer, nullable=True)
    independent: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # "" (no process group), "collective", or "failed: why".
    agreement: Mapped[str255] = mapped_column(default="", server_default="")
    # When the rank's checkpoint signal reached it (its clock); None: an older
    # client, or a rank that joined its peers' checkpoint without one.
    signalled_at: Mapped[utc_opt]

    set: Mapped[SnapshotSet] = relationship(back_populates="acks")


class RestoreTest(Base):
    __tablename__ = "restore_test"

    id: Mapped[intpk]
    set_id: Mapped[int] = mapped_column(ForeignKey("snapshot_set.id"), index=True)
    command: Mapped[str] = mapped_column(Text)
    target: Mapped[path_t] = mapped_column(default="")
    # RUNNING, PASSED, FAILED
    result: Mapped[str] = mapped_column(String(16), default="RUNNING")
    started_at: Mapped[utc]
    finished_at: Mapped[utc_opt]
    first_step: Mapped[Optional[int]] = mapped_column(BigInteger, nullable=True)
    time_to_first_step: Mapped[Optional[float]] = mapped_column(Seconds, nullable=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    slurm_job_id: Mapped[Optional[int]] = mapped_column(BigInteger, nullable=True)
    # A drill run as a Slurm job (migration 0013): when it was submitted, how
    # long it waited before the program started (queue and the nodes' Prologs,
    # apart from time_to_first_step, which the node measures from the
    # program's start) and the node the program started on.
    submitted_at: Mapped[utc_opt]
    queued_seconds: Mapped[Optional[float]] = mapped_column(Seconds, nullable=True)
    ran_on: Mapped[str64] = mapped_column(default="", server_default="")

    set: Mapped[SnapshotSet] = relationship(back_populates="restore_tests")
    nodes: Mapped[list["RestoreNode"]] = relationship(back_populates="test", order_by="RestoreNode.position")


class RestoreNode(Base):
    """One node of a drill run as a Slurm job (migration 0013): its Prolog
    clones the node-local parts that node holds, its Epilog removes them,
    and each reports here (through the service on a node), so the drill on
    the controller learns what happened on the node without reaching it."""

    __tablename__ = "restore_node"
    __table_args__ = (UniqueConstraint("test_id", "node", name="uq_restore_node"),)

    id: Mapped[intpk]
    test_id: Mapped[int] = mapped_column(ForeignKey("restore_test.id"), index=True)
    node: Mapped[str64]
    # Its place in the drill's node list: position k takes the ranks of the job's node k.
    position: Mapped[int] = mapped_column(Integer, default=0)
    # The node-local parts (snapshot ids) cloned there: its own, or copies it holds.
    snapshot_ids: Mapped[list[Any]] = mapped_column(JSON, default=list)
    state: Mapped[str] = mapped_column(String(16), default=NODE_PLANNED)   # states.NODE_STATES
    # A clone that failed because of the set (its snapshot gone), not of the node's setup.
    blames_set: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    error: Mapped[str] = mapped_column(Text, default="")
    # The Prolog's time to make this node's clones.
    seconds: Mapped[Optional[float]] = mapped_column(Seconds, nullable=True)
    # What its Epilog reported: "", CLEANED or LEFT (states.NODE_CLEANUPS).
    cleanup: Mapped[str] = mapped_column(String(16), default="", server_default="")
    cleanup_error: Mapped[str] = mapped_column(Text, default="")
    updated_at: Mapped[utc]

    test: Mapped[RestoreTest] = relationship(back_populates="nodes")


class NodeTask(Base):
    """Work on a node's own disk that no job rides on (migration 0013),
    pulled by that node's agent (nodetasks/): delete a node-local part or a
    copy (prune); send or receive a part between two nodes (partner copies),
    the two halves linked by pair_id."""

    __tablename__ = "node_task"
    __table_args__ = (Index("ix_node_task_node_state", "node", "state"), Index("ix_node_task_set", "set_id"))

    id: Mapped[intpk]
    node: Mapped[str64]                                   # whose agent does it
    kind: Mapped[str] = mapped_column(String(16))         # delete | send | receive
    purpose: Mapped[str] = mapped_column(String(16))      # prune | partner
    set_id: Mapped[int] = mapped_column(Integer)
    snapshot_id: Mapped[int] = mapped_column(ForeignKey("snapshot.id"))
    copy_id: Mapped[Optional[int]] = mapped_column(Integer, nullable=True)     # delete: a copy, not the part
    parent_id: Mapped[Optional[int]] = mapped_column(Integer, nullable=True)   # send: incremental against it
    peer: Mapped[str64] = mapped_column(default="")       # send: the target node; receive: the source
    pair_id: Mapped[Optional[int]] = mapped_column(Integer, nullable=True)
    address: Mapped[str255] = mapped_column(default="")   # receive: host:port it listens on
    token: Mapped[str64] = mapped_column(default="")
    state: Mapped[str] = mapped_column(String(16), default=TASK_PENDING)   # states.TASK_STATES
    error: Mapped[str] = mapped_column(Text, default="")
    method: Mapped[str] = mapped_column(String(24), default="")
    bytes: Mapped[Optional[int]] = mapped_column(BigInteger, nullable=True)
    seconds: Mapped[Optional[float]] = mapped_column(Seconds, nullable=True)
    created_at: Mapped[utc]
    updated_at: Mapped[utc]

    snapshot: Mapped["Snapshot"] = relationship()


class Event(Base):
    """Append-only log: hook failures, phase changes, repairs."""

    __tablename__ = "event"
    # ix_event_kind: metrics count hook failures on every run (migration 0008).
    __table_args__ = (Index("ix_event_job", "job_id"), Index("ix_event_kind", "kind"))

    id: Mapped[intpk]
    at: Mapped[utc]
    job_id: Mapped[Optional[int]] = mapped_column(BigInteger, nullable=True)
    set_id: Mapped[Optional[int]] = mapped_column(Integer, nullable=True)
    node: Mapped[str64] = mapped_column(default="")
    kind: Mapped[str64]
    level: Mapped[str] = mapped_column(String(8), default="info")
    message: Mapped[str] = mapped_column(Text, default="")


class FailureCount(Base):
    """How many times sets went into a failure state for a class of reason:
    only ever incremented (inventory/failures.py), so metrics can export it
    as a Prometheus counter."""

    __tablename__ = "failure_count"

    state: Mapped[str] = mapped_column(String(16), primary_key=True)
    reason: Mapped[str] = mapped_column(String(64), primary_key=True)
    count: Mapped[int] = mapped_column(BigInteger, default=0)
