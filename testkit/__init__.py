"""What the tests and the benchmarks share, and the product never imports:
the dev cluster's driver (cluster.py), loop-device filesystems (loopfs.py),
test doubles that plug into the real code paths (doubles.py) and reading and
seeding an inventory for them (inventory_helpers.py). Not installed: the
tests (tests/conftest.py) and the benchmarks (benchmarks/common.py) put the
repository on sys.path and import it as `testkit`."""
