"""Readers for the per-job files other components write into
`<barrier_dir>/<job_id>/` (see docs/contracts.md, "Per-job files").
Each returns validated data or None when the file is absent."""
from __future__ import annotations

import json
import os
import time
from datetime import datetime

from slurm_snap.client.ack import check_name
from slurm_snap.errors import BadValueError

MAX_JOB_FILE_BYTES = 1 << 20


def read_json(path: str, max_bytes: int = MAX_JOB_FILE_BYTES):
    """Parsed JSON object of `path`, None if the file does not exist."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(max_bytes + 1)
    except FileNotFoundError:
        return None
    if len(raw) > max_bytes:
        raise BadValueError(what="file", value=path, why=f"larger than {max_bytes} bytes")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadValueError(what="file", value=path, why=f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadValueError(what="file", value=path, why="expected a JSON object")
    return data


def _field_error(path: str, field: str, value, why: str) -> BadValueError:
    return BadValueError(what=f"{os.path.basename(path)} field {field!r}", value=value, why=f"{why} (in {path})")


def _timestamp(path: str, field: str, value) -> float:
    """Unix seconds from a number or an ISO 8601 time with an offset."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            stamp = datetime.fromisoformat(value)
        except ValueError:
            stamp = None
        if stamp is not None and stamp.tzinfo is not None:
            return stamp.timestamp()
    raise _field_error(path, field, value, "expected Unix seconds or an ISO 8601 time with an offset")


def read_request(path: str, job_id: str) -> dict | None:
    """request.json: {"job_id", "epoch", "requested_at", "deadline"}."""
    data = read_json(path)
    if data is None:
        return None
    for field in ("job_id", "epoch"):
        if field not in data:
            raise _field_error(path, field, None, "missing")
    if str(data["job_id"]) != str(job_id):
        raise _field_error(path, "job_id", data["job_id"], f"belongs to another job (expected {job_id!r})")
    try:
        epoch = check_name("epoch", data["epoch"])
    except BadValueError as exc:
        raise _field_error(path, "epoch", data["epoch"], exc.kwargs["why"]) from None
    deadline = _timestamp(path, "deadline", data["deadline"]) if data.get("deadline") is not None else None
    return {"job_id": str(job_id), "epoch": epoch, "deadline": deadline,
            "requested_at": data.get("requested_at")}


def request_is_current(request: dict, release_dir: str, now: float | None = None) -> bool:
    """A request is served once its release exists, and dead after its deadline."""
    if os.path.exists(os.path.join(release_dir, request["epoch"])):
        return False
    deadline = request["deadline"]
    return deadline is None or deadline >= (time.time() if now is None else now)


def read_resume(path: str) -> dict | None:
    """resume.json: {"set_id", "step", "checkpoint": {"live", "snapshot"}}."""
    data = read_json(path)
    if data is None:
        return None
    for field in ("set_id", "step", "checkpoint"):
        if field not in data:
            raise _field_error(path, field, None, "missing")
    set_id = data["set_id"]
    if isinstance(set_id, bool) or not isinstance(set_id, (str, int)) or set_id == "":
        raise _field_error(path, "set_id", set_id, "expected a string or integer")
    step = data["step"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise _field_error(path, "step", step, "expected an integer >= 0")
    checkpoint = data["checkpoint"]
    if not isinstance(checkpoint, dict):
        raise _field_error(path, "checkpoint", checkpoint, "expected an object")
    out = {}
    for key in ("live", "snapshot"):
        value = checkpoint.get(key)
        if value is not None and (not isinstance(value, str) or not os.path.isabs(value)):
            raise _field_error(path, f"checkpoint.{key}", value, "expected an absolute path or null")
        out[key] = value
    if out["live"] is None and out["snapshot"] is None:
        raise _field_error(path, "checkpoint", checkpoint, "names neither a live nor a snapshot path")
    return {"set_id": set_id, "step": step, "checkpoint": out}


def find_volume(path: str, class_name: str, node: str) -> str | None:
    """Path of volume class `class_name` for `node` from job.json: the entry
    for this node (node-local volumes) wins over one with node null (shared)."""
    data = read_json(path)
    if data is None:
        return None
    volumes = data.get("volumes")
    if not isinstance(volumes, list):
        raise _field_error(path, "volumes", volumes, "expected a list")
    shared = None
    for index, volume in enumerate(volumes):
        if not isinstance(volume, dict) or not isinstance(volume.get("path"), str):
            raise _field_error(path, f"volumes[{index}]", volume, "expected an object with a string 'path'")
        if volume.get("class") != class_name:
            continue
        if volume.get("node") == node:
            return volume["path"]
        if volume.get("node") is None and shared is None:
            shared = volume["path"]
    return shared
