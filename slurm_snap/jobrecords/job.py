"""job.json (JobRecord) and the one volume record (VolumeRecord): a declared
volume from the Prolog's description to the inventory's row, the cutter
and the verdict."""
from __future__ import annotations


from ..record import record
from .fields import Fields


@record
class VolumeRecord:
    """One declared volume of a job run: a path of a volume class, shared or on
    one node. The Prolog describes them (job.json), the inventory stores them
    (one Volume row each, `id`), the cutter cuts them and the verdict expects
    them (`id` None: declared but never recorded, e.g. a node's Prolog did
    not record its node-local volume). `refused` is why the node Prolog
    refused this path ("" if it did not): a refused path is never handed to
    a backend (it may be a link swapped in to aim root's cut)."""

    path: str
    scope: str
    volume_class: str
    backend: str = ""
    node: str = ""          # "" for a shared volume
    site: str = ""
    region: str = ""
    id: int | None = None
    refused: str = ""

    @property
    def label(self) -> str:
        """How a set's reasons name it: class@node, or the class of a shared volume."""
        return f"{self.volume_class or self.path}@{self.node}" if self.node else (self.volume_class or self.path)

    @classmethod
    def of(cls, row) -> "VolumeRecord":
        """From an inventory Volume row, read while its session is open."""
        return cls(path=row.path, scope=row.scope, volume_class=row.volume_class, backend=row.backend,
                   node=row.node or "", site=row.site or "", region=row.region or "", id=row.id,
                   refused=getattr(row, "refusal", None) or "")


@record
class JobRecord:
    """job.json: what the ranks need of their job run (written by the Prolog;
    the preemption epoch uses its restart_count, docs/client.md)."""

    job_id: int
    restart_count: int = 0
    user: str = ""
    nodes: tuple[str, ...] = ()
    signal: str = ""
    volumes: tuple[VolumeRecord, ...] = ()

    FILE = "job.json"

    def to_json(self) -> dict:
        out = {"job_id": self.job_id, "restart_count": self.restart_count, "user": self.user,
               "nodes": list(self.nodes),
               "signal": self.signal,
               "volumes": [{"class": v.volume_class, "scope": v.scope, "node": v.node or None, "path": v.path}
                           for v in self.volumes]}
        return out

    @classmethod
    def parse(cls, data, source: str = "") -> "JobRecord":
        f = Fields(cls.FILE, data, source)
        raw_id = f.get("job_id", 0)
        if isinstance(raw_id, str) and raw_id.isascii() and raw_id.isdigit():
            raw_id = int(raw_id)
        job_id = f.integer("job_id", raw_id)
        nodes = f.get("nodes", [])
        if not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes):
            raise f.bad("nodes", nodes, "expected a list of node names")
        volumes = f.get("volumes")
        if not isinstance(volumes, list):
            raise f.bad("volumes", volumes, "expected a list")
        out = []
        for index, v in enumerate(volumes):
            if not isinstance(v, dict) or not isinstance(v.get("path"), str) \
                    or not all(isinstance(v.get(k, ""), str) for k in ("class", "scope")) \
                    or not isinstance(v.get("node"), (str, type(None))):
                raise f.bad(f"volumes[{index}]", v, "expected an object with a string 'path'")
            out.append(VolumeRecord(path=v["path"], scope=v.get("scope", ""), volume_class=v.get("class", ""),
                                    node=v.get("node") or ""))
        return cls(job_id=job_id, restart_count=f.integer("restart_count", f.get("restart_count", 0)),
                   user=f.string("user", f.get("user", "")), nodes=tuple(nodes),
                   signal=f.string("signal", f.get("signal", "")), volumes=tuple(out))

    def volume_path(self, class_name: str, node: str) -> str | None:
        """Path of volume class `class_name` for `node`: the entry for this node
        (node-local volumes) wins over one without a node (shared)."""
        shared = None
        for v in self.volumes:
            if v.volume_class != class_name:
                continue
            if v.node == node:
                return v.path
            if not v.node and shared is None:
                shared = v.path
        return shared
