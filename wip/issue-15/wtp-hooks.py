"""Apply the small hooks of the model/playbook/workflow work to a tree without them (for the scratch test)."""
import sys
base = sys.argv[1] + "/python/mcpipe/"
def edit(rel, pairs):
    p = base + rel; s = open(p).read()
    for a, b in pairs:
        assert a in s, (rel, a[:60]); s = s.replace(a, b, 1)
    open(p, "w").write(s)
edit("config.py", [
    ('''    base_dir: str = "."''', '''    models: dict[str, Any] = {}
    workflow: dict[str, Any] | None = None
    playbooks: list[str] = []
    base_dir: str = "."'''),
    ('''    "outbound": _Section("outbound", dict[str, Any] | None),''', '''    "outbound": _Section("outbound", dict[str, Any] | None),
    "models": _Section("models", dict[str, Any]),
    "workflow": _Section("workflow", dict[str, Any] | None),
    "playbooks": _Section("playbooks", list[str]),'''),
    ('''        problems.extend(config_problems(cfg))''', '''        problems.extend(config_problems(cfg))
    if cfg.models or cfg.workflow is not None or cfg.playbooks:
        from mcpipe.playbooks import model_problems

        problems.extend(model_problems(cfg))'''),
])
edit("cli.py", [("    # The server (and the MCP SDK under it) is imported only when `serve` runs: it takes a while.",
    "    from mcpipe._playbook_cli import add_parser as add_playbook_parser\n\n    add_playbook_parser(sub)\n\n    # The server (and the MCP SDK under it) is imported only when `serve` runs: it takes a while.")])
edit("server/_http.py", [('''            elif path == "/healthz":''', '''            elif path == "/workflow" and self.app.config.workflow is not None:
                from mcpipe.workflow._http import workflow_endpoint

                principal = None
                if self.require_auth:
                    principal = self._principal(scope)
                    if principal is None:
                        await _respond(send, 401, _UNAUTHORIZED, [(b"www-authenticate", b'Bearer realm="mcpipe"')])
                        return
                await workflow_endpoint(
                    self.app.gateway, scope, receive, send, principal=principal, max_body=self.app.config.http.max_body_bytes
                )
            elif path == "/healthz":''')])
edit("interaction/_serve.py", [('''        req_name, res_name = _TYPES[method]
''', '''        req_name, res_name = _TYPES[method]
        if method == "sampling/createMessage" and params is not None and params.get("tools"):
            res_name = "CreateMessageResultWithTools"
''')])
edit("server/_app.py", [('''        sources.append(declared_source(config, sources))
    return sources''', '''        sources.append(declared_source(config, sources))
    if config.workflow is not None or config.playbooks:
        from mcpipe.playbooks import model_sources

        sources.extend(model_sources(config))
    return sources''')])
print("hooks")
