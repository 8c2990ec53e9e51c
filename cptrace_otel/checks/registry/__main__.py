"""``python -m cptrace_otel.checks.registry``: print the README's rule table (markdown)."""

from . import render_table

print(render_table(), end="")
