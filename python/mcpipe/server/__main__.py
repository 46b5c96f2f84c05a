"""``python -m mcpipe.server [--config FILE] [--http HOST:PORT | --stdio]``: the same as ``mcpipe serve``."""

import argparse
import sys

from mcpipe.server.cli import add_arguments, main

parser = argparse.ArgumentParser(prog="python -m mcpipe.server", description="Serve mcpipe over MCP.")
add_arguments(parser)
sys.exit(main(parser.parse_args()))
