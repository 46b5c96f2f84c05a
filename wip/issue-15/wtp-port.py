"""Port the model/playbook/workflow code onto the issue-10 restructure (plan IR, kinds registry, typed ctx)."""
import os, re, subprocess, sys

root = sys.argv[1]
py = os.path.join(root, "python/mcpipe/")

def edit(rel, pairs, base=py):
    p = os.path.join(base, rel)
    s = open(p).read()
    for a, b in pairs:
        if a in s:
            s = s.replace(a, b)
        elif b not in s:
            print(f"!! {rel}: not found: {a[:70]!r}")
    open(p, "w").write(s)

edit("workflow/_orchestrator.py", [
    ("from mcpipe.declared._http import _decode_body, _send\nfrom mcpipe.declared._policy import ForbiddenError, HttpPolicy\nfrom mcpipe.declared._step import StepFailure\n",
     "from mcpipe.kinds import ForbiddenError, HttpPolicy\nfrom mcpipe.kinds.http import _decode_body, _send\nfrom mcpipe.results import StepFailure\n"),
    ('    if ctx.extras.get("progress"):', '    if ctx.has_progress:'),
])
edit("playbooks/__init__.py", [
    ("from mcpipe.compile import Limits\nfrom mcpipe.declared._policy import StepPolicy\n", "from mcpipe.kinds import StepPolicy\nfrom mcpipe.plan import Limits\n"),
    ('''        registry = self.playbook.registry if self.playbook.registry is not None else _NoTools()''',
     '''        registry = self.playbook.registry if self.playbook.registry is not None else base.tools
        if registry is None:
            registry = _NoTools()
        run_ctx = replace(run_ctx, tools=registry)'''),
    ('if ctx.extras.get("progress"):', 'if ctx.has_progress:'),
    ("import re\nfrom collections.abc import Callable, Iterator, Mapping\nfrom pathlib import Path\n",
     "import re\nfrom collections.abc import Callable, Iterator, Mapping\nfrom dataclasses import replace\nfrom pathlib import Path\n"),
])
p = py + "playbooks/__init__.py"
s = open(p).read()
i = s.index("def model_sources(")
s = s[:i] + '''def model_sources(config: Any) -> list[Any]:
    """The tool sources of the config's ``workflow`` and ``playbooks`` (a playbook's ``tool`` actions call
    through the gateway the call comes in by, ``ctx.tools``).

    Raises:
        mcpipe.errors.ConfigError: listing every problem.
    """
    models, workflow, playbooks, problems = _load_all(config, None)
    if problems:
        raise ConfigError(problems)
    out: list[Any] = []
    if workflow is not None and workflow.enabled:
        from mcpipe.workflow import Workflow, WorkflowTool

        out.append(WorkflowTool(Workflow(workflow, models)))
    if playbooks:
        out.append(PlaybookTools(playbooks))
    return out
'''
open(p, "w").write(s)
edit("playbooks/_compile.py", [
    ("from mcpipe.compile import CompiledSpec, PipelinePlan\nfrom mcpipe.declared._model import StepFields\nfrom mcpipe.declared._policy import StepPolicy\nfrom mcpipe.declared._step import DeclaredStep\n",
     "from mcpipe.kinds import StepPolicy\nfrom mcpipe.plan import CompiledSpec, Leaf, Pipeline\n"),
    ("    step: DeclaredStep | None = None\n", "    step: Leaf[Any, Any] | None = None\n"),
    ("    if step is None or not isinstance(step, DeclaredStep):", "    if step is None or not isinstance(step, Leaf):"),
    ('    plan = PipelinePlan(Template({}), tuple(steps), None, False, None, pb.name or "playbook")\n    return CompiledSpec(plan, (), len(steps), len(steps))',
     '    plan = Pipeline(Template({}), tuple(steps), None, False, None, pb.name or "playbook")\n    return CompiledSpec.of(plan)'),
    ("The plan is a list of declared steps (:class:`mcpipe.declared.DeclaredStep`)", "The plan is a list of plan leaves (:class:`mcpipe.plan.Leaf`)"),
])
p = py + "playbooks/_compile.py"
s = open(p).read()
i = s.index("def _step(")
j = s.find("\n\n\ndef ", i)
tail = s[j:] if j != -1 else "\n"
s = s[:i] + '''def _step(sid: str, kind: str, location: str, plan: Any, runner: Any) -> Leaf[Any, Any]:
    return Leaf(sid, location, kind, None, None, plan, (), runner)
''' + (tail if j != -1 else "")
open(p, "w").write(s)
edit("playbooks/_run.py", [
    ("from mcpipe.declared._expr import ExpressionError\nfrom mcpipe.declared._policy import ForbiddenError\nfrom mcpipe.declared._step import StepFailure, StepOutput, call_tool\n",
     "from mcpipe.errors import ExpressionError\nfrom mcpipe.kinds import ForbiddenError\nfrom mcpipe.results import StepFailure, StepOutput\n"),
    ('''        if step.kind == "tool":
            work = call_tool(step, inputs, ctx, pb.registry if pb.registry is not None else step.plan)
        else:
            work = step.runner(step, inputs, env, ctx)''', '''        if step.kind == "tool" and pb.registry is not None:
            ctx = replace(ctx, tools=pb.registry)
        assert step.run is not None
        work = step.run(step, inputs, env, ctx)'''),
    ('''        raise StepFailure(f"{action.location}: {e}", "INTERPOLATION_FAILED" if e.missing else "TOOL_FAILED") from None''',
     '''        raise StepFailure(f"{action.location}: {e}", e.code) from None'''),
    ("    plan: ActionPlan = step.plan\n", "    plan: ActionPlan = step.built\n"),
    ("    plan: TurnPlan = step.plan\n", "    plan: TurnPlan = step.built\n"),
    ("from dataclasses import dataclass\n", "from dataclasses import dataclass, replace\n"),
])
# tests: llmkit -> kit/llm.py
tl = os.path.join(root, "tests/llm")
if os.path.exists(os.path.join(tl, "llmkit.py")):
    os.rename(os.path.join(tl, "llmkit.py"), os.path.join(root, "tests/kit/llm.py"))
for f in os.listdir(tl):
    if f.endswith(".py"):
        p = os.path.join(tl, f)
        s = open(p).read()
        s = s.replace("from llmkit import", "from kit.llm import").replace('"llmkit:counting"', '"kit.llm:counting"')
        s = s.replace("helpers live in ``llmkit``", "helpers live in ``kit.llm``")
        open(p, "w").write(s)
kp = os.path.join(root, "tests/kit/llm.py")
s = open(kp).read().replace("(imported as ``llmkit``)", "(imported as ``kit.llm``)")
open(kp, "w").write(s)
# layers
edit("scripts/check_layers.py", [
    ('''    # Step kinds: one module each, and their registry.''', '''    # Asking a language model: an OpenAI-compatible endpoint or the client's (sampling).
    ("models", ("mcpipe.models",)),
    # Step kinds: one module each, and their registry.'''),
    ('''    # The server's configuration.''', '''    # Pipelines with a model inside: playbooks (a front-end of the plan) and the workflow tool.
    ("llm", ("mcpipe.playbooks", "mcpipe.workflow")),
    # The server's configuration.'''),
], base=root + "/")
print("ported")
