"""``python -m autopar`` works like the ``autopar`` command."""

from autopar.cli import main

main()
