"""`python -m primus.cli` (what torchrun workers run)."""

from primus.cli.main import main

main()
