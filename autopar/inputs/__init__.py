"""Floor 2: input files and options -> frozen specs and the ``Problem``.

``specs`` (the frozen specs), ``stack`` (the training stack and its switches), ``loading`` (the
only reader of input files: presets, model / cluster / stack files), ``hf_families`` (Hugging
Face families with their own keys), ``safe_yaml`` and ``limits`` (untrusted input), ``echo``
(the assumptions every output repeats) and ``problem`` (the CLI / API vocabulary -> ``Problem``).
"""
