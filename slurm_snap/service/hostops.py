"""The root-only operations `serve` runs for hosts without the inventory
(nodes' hooks, node tasks, drill jobs' Prologs and Epilogs), both ends.

Each operation is a method of a package's Local* class (protocol.recorder's
LocalRecorder, restore.nodeops' LocalDrillNodes, nodetasks.ops'
LocalNodeTasks), named in that package's OPS_METHODS (op -> method). The
method's type hints are the wire's schema (service.records): `call` is how a
host that names the service in its config calls it, `served` what `serve`
runs for it against the controller's inventory.
"""
from __future__ import annotations


def call(cfg, local_cls, methods: dict[str, str], op: str, args: dict, *, reply_timeout: float | None = None):
    """`op` through the service, its result decoded as the method declares."""
    from .client import call as service_call
    from .records import decode_result, encode

    method = getattr(local_cls, methods[op])
    extra = {} if reply_timeout is None else {"reply_timeout": reply_timeout}
    return decode_result(method, service_call(cfg, op, **extra, **{k: encode(v) for k, v in args.items()}),
                         f"the service's {op} result")


def served(local_cls, methods: dict[str, str]) -> dict:
    """op -> what `serve` runs for it: the method on the controller's
    inventory, its arguments checked against the method's hints."""
    def serving(op: str):
        def run(cfg, **args):
            from ..inventory.repository import Inventory
            from .records import decode_call, encode

            inv = Inventory.from_config(cfg)
            try:
                method = getattr(local_cls(cfg, inv), methods[op])
                return encode(method(**decode_call(method, args, op)))
            finally:
                inv.dispose()
        return run
    return {op: serving(op) for op in methods}
