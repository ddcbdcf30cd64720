"""`python -m tools.protocol ...`: the protocol's command line (tools/protocol/__init__.py says what it does)."""

import tyro

from tools.protocol import Args, main

main(tyro.cli(Args, prog=f"python -m {__spec__.parent}"))
