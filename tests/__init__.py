"""The test suite; ``tests.helpers`` is what its folders share (see tests/helpers/__init__.py)."""
