"""``python -m cptrace_otel.checks.registry``: print the rule table of docs/rules.md (markdown)."""

from . import render_table

print(render_table(), end="")
