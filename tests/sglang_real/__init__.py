"""Real SGLang HiCache on CPU: the tests, and the drivers they start as ``python -m tests.sglang_real.<module>``
(from the repository root, SGLang's folder on ``PYTHONPATH``: :func:`tests.sglang_real.runtime.sglang_env`)."""
