"""What every side shares: the record grammar and its values (:mod:`.logline`, :mod:`.events`), the rendering of
a traced call into a record (:mod:`.records`), the attribute schema (:mod:`.semconv`, :mod:`.attrs`), the trace
model (:mod:`.spans`), violations written back into spans (:mod:`.violations`), the lineage sampling decision
(:mod:`.sampling`), the settings (:mod:`.config`) and the exit codes and root error of the commands (:mod:`.exits`).

Imports nothing of the package outside itself, and only the standard library.
"""
