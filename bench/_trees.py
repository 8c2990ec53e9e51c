"""Two checkouts side by side, for the before/after tools (``same_behaviour.py``, ``compare_trees.py``).

* :func:`baseline` yields the baseline tree: an existing directory (``--baseline-tree``), or a detached
  ``git worktree`` of a revision in a temporary directory, removed afterwards. By default the revision is the merge
  base of the one named and ``HEAD``, so ``--baseline <the base commit of a branch>`` compares the branch with where
  it started, whatever was merged since.
* :func:`build` builds a tree's optional C extensions in place (``python3 setup.py build_ext --inplace``) and
  :func:`check_speedups` proves that each extension ``setup.py`` declares imports from that tree: a comparison that
  silently ran a pure-Python fallback in one tree would prove nothing about the other's C code.
* :func:`tree_env` is the environment a child of one tree runs with: ``PYTHONPATH`` = that tree only,
  ``CPTRACE_REQUIRE_SPEEDUPS=1``, no ``CPTRACE_*`` / ``OTEL_*`` / upstream gate variable from the caller's shell,
  ``TZ=UTC`` (log prefixes are rendered in local time). Children run with a neutral working directory: ``python -m``
  puts the working directory first on ``sys.path``, which would shadow ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator

HERE = os.path.dirname(os.path.abspath(__file__))
CURRENT = os.path.dirname(HERE)   # the checkout these tools belong to


def git(tree: str, *args: str) -> str:
    return subprocess.run(["git", "-C", tree, *args], check=True, capture_output=True, text=True).stdout.strip()


def resolve_rev(tree: str, rev: str, exact: bool) -> str:
    """The commit to compare against: ``rev`` itself with ``exact``, else ``merge-base rev HEAD``."""
    commit = git(tree, "rev-parse", "--verify", rev + "^{commit}")
    if exact:
        return commit
    return git(tree, "merge-base", commit, "HEAD")


@contextlib.contextmanager
def baseline(rev: str | None, tree: str | None, exact: bool = False, keep: bool = False,
             current: str = CURRENT) -> Iterator[tuple[str, str]]:
    """Yield ``(path, label)`` of the baseline tree: ``tree`` as given, or a temporary worktree of ``rev``."""
    if tree:
        yield os.path.abspath(tree), os.path.abspath(tree)
        return
    if not rev:
        raise SystemExit("give --baseline REV or --baseline-tree DIR")
    commit = resolve_rev(current, rev, exact)
    tmp = tempfile.mkdtemp(prefix="cptrace-baseline-")
    path = os.path.join(tmp, "tree")
    git(current, "worktree", "add", "--detach", "--quiet", path, commit)
    try:
        yield path, f"{commit[:12]} ({rev}{'' if exact else ', merge base with HEAD'})"
    finally:
        if keep:
            print(f"kept the baseline worktree at {path} (remove: git worktree remove --force {path})",
                  file=sys.stderr)
        else:
            subprocess.run(["git", "-C", current, "worktree", "remove", "--force", path], capture_output=True)
            with contextlib.suppress(OSError):
                os.rmdir(tmp)


def build(tree: str) -> None:
    """Build the tree's C extensions in place; exit with the compiler's output when that fails."""
    r = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace", "-q"], cwd=tree,
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"building the C extensions in {tree} failed:\n{r.stdout}{r.stderr}")


def extension_names(tree: str) -> list[str]:
    """Dotted names of the compiled extensions the in-place build left in the tree's package (``*.so``/``*.pyd``):
    found on disk rather than parsed out of ``setup.py``, whose shape may change between the trees."""
    import glob
    import importlib.machinery

    names = []
    for path in sorted(glob.glob(os.path.join(tree, "cptrace_otel", "**", "*"), recursive=True)):
        base = os.path.basename(path)
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            if base.endswith(suffix):
                rel = os.path.relpath(path[: -len(suffix)], tree)
                names.append(rel.replace(os.sep, "."))
                break
    return names


def check_speedups(tree: str) -> list[str]:
    """Import every declared extension in a child of ``tree``; exit unless each one loads from that tree."""
    names = extension_names(tree)
    code = ("import importlib, os, sys\n"
            "tree = os.path.realpath(sys.argv[1])\n"
            "for n in sys.argv[2:]:\n"
            "    m = importlib.import_module(n)\n"
            "    f = os.path.realpath(m.__file__)\n"
            "    assert f.startswith(tree + os.sep), (n, f)\n"
            "import cptrace_otel\n"
            "assert os.path.realpath(cptrace_otel.__file__).startswith(tree + os.sep), cptrace_otel.__file__\n")
    r = subprocess.run([sys.executable, "-c", code, tree, *names], env=tree_env(tree), cwd=tempfile.gettempdir(),
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"the C speedups of {tree} do not load from it ({', '.join(names)}):\n{r.stderr}")
    return names


def tree_env(tree: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CPTRACE_", "OTEL_", "SGLANG_CP_HICACHE")) and k != "PYTHONPATH"}
    env.update(PYTHONPATH=tree, CPTRACE_REQUIRE_SPEEDUPS="1", TZ="UTC", PYTHONHASHSEED="0")
    env.update(extra)
    return env


def add_tree_args(ap: argparse.ArgumentParser) -> None:
    """The options that name the two trees (shared by the before/after tools)."""
    ap.add_argument("--baseline", metavar="REV", help="baseline revision (its merge base with HEAD is used)")
    ap.add_argument("--exact", action="store_true", help="use REV itself, not its merge base with HEAD")
    ap.add_argument("--baseline-tree", metavar="DIR", help="an existing baseline checkout instead of a worktree")
    ap.add_argument("--current", metavar="DIR", default=CURRENT,
                    help="the tree to compare with the baseline (default: this checkout)")
    ap.add_argument("--no-build", action="store_true",
                    help="do not build the C extensions of the current tree and of a --baseline-tree (a worktree "
                         "made here is always built)")
    ap.add_argument("--keep", action="store_true", help="keep the baseline worktree")


@contextlib.contextmanager
def trees(a: argparse.Namespace, names: tuple[str, str] = ("baseline", "current")) -> Iterator[tuple[str, str, str]]:
    """``(baseline path, its label, current path)`` from :func:`add_tree_args`' options, both trees built (as the
    options say) and their C speedups loading; the lines saying so are printed."""
    current = os.path.abspath(a.current)
    with baseline(a.baseline, a.baseline_tree, a.exact, a.keep, current) as (old, label):
        width = max(map(len, names)) + 1
        print(f"{names[0] + ':':<{width}} {label}\n{names[1] + ':':<{width}} {current}", flush=True)
        for side, tree in ((names[0], old), (names[1], current)):
            if not a.no_build or (tree == old and not a.baseline_tree):
                build(tree)
            print(f"C speedups loaded from the {side} tree: {', '.join(check_speedups(tree))}", flush=True)
        yield old, label, current
