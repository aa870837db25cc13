"""Benchmarks producing calibration data (torch optional: ``pip install autopar[bench]``)."""
