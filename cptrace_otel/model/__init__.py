"""What every side shares: the record grammar and its values (:mod:`.logline`, :mod:`.events`), the attribute
schema (:mod:`.semconv`, :mod:`.attrs`), the trace model (:mod:`.spans`), violations written back into spans
(:mod:`.violations`), the settings (:mod:`.config`) and the exit codes and errors of the commands (:mod:`.exits`).

Imports nothing outside itself and the standard library.
"""
