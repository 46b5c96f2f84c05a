"""mcpipe: run whole pipelines of MCP tool calls in one request."""
