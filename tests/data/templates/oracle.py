#!/usr/bin/env python3
"""Reference renderer for tests/test_template.c: jinja2 in the environment
transformers' apply_chat_template uses (transformers/utils/chat_template_utils.py:
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with
loopcontrols and the {% generation %} tag, the tojson filter replaced by
json.dumps(ensure_ascii=False, ...), globals raise_exception and strftime_now).

Usage: oracle.py JOBS.json RESULTS.json
JOBS: a JSON list of {"template": source, "context": {...}}.
RESULTS: a JSON list, per job {"ok": true, "out": text} or
{"ok": false, "kind": "raise"|"error", "type": name, "msg": text}
("raise": the template called raise_exception(msg)).
"""
import json
import sys
from datetime import datetime

import jinja2
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment


class RaisedByTemplate(jinja2.exceptions.TemplateError):
    pass


class AssistantTracker(Extension):
    """transformers' {% generation %} block, rendering its body unchanged."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def raise_exception(message):
    raise RaisedByTemplate(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(format):
    return datetime.now().strftime(format)


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    jobs = json.load(open(sys.argv[1], encoding="utf-8"))
    env = make_env()
    cache = {}
    results = []
    for job in jobs:
        try:
            src = job["template"]
            if src not in cache:
                cache[src] = env.from_string(src)
            out = cache[src].render(**job["context"])
            results.append({"ok": True, "out": out})
        except RaisedByTemplate as e:
            results.append({"ok": False, "kind": "raise", "type": "TemplateError", "msg": str(e)})
        except Exception as e:  # everything else jinja2 or Python raised
            results.append({"ok": False, "kind": "error", "type": type(e).__name__, "msg": str(e)})
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(results, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
