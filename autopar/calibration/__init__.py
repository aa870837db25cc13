"""Floor 5: nccl-tests logs -> a measured communication profile (``CollectiveModel``), and the
benchmarks that produce calibration data.

``nccl`` (the log parser), ``profile`` (fitting, saving and loading a profile), ``compare``
(a log against a profile), ``comm_bench`` / ``gemm_bench`` (``autopar bench``, with torch).
"""
