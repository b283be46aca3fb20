"""The JSON Schemas (draft 2020-12) of every command's --json output, contract "ncclprobe/2": one file
per command, common.json for the shared parts, error.json for a document that is only an error.
validate() needs the jsonschema package (the `test` extra); nothing else here does."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DIR = Path(__file__).resolve().parent
# the JSON "command" of each document -> its schema file; any other command (a usage error names
# what was typed) can only be an error document
FILES = {"inspect": "inspect.json", "report": "report.json", "run": "run.json", "demo": "demo.json",
         "bench": "bench.json", "topo": "topo.json", "explain": "explain.json",
         "inject install": "inject.json", "inject status": "inject.json", "inject uninstall": "inject.json"}
FALLBACK = "error.json"


def load(name: str) -> dict[str, Any]:
    """One schema file by name, e.g. common.json."""
    return json.loads((DIR / name).read_text(encoding="utf-8"))


def schema_for(command: str) -> dict[str, Any]:
    """The schema of the document a command prints under --json."""
    return load(FILES.get(command, FALLBACK))


def validate(doc: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError where doc breaks the schema of its command: the deepest error
    of the shape it comes closest to (a oneOf's own message would only repeat the whole document)."""
    import jsonschema
    from referencing import Registry, Resource
    # the files refer to each other by name ("common.json#/$defs/finding"), as they lie side by side
    registry = Registry().with_resources((p.name, Resource.from_contents(load(p.name))) for p in DIR.glob("*.json"))
    command = doc.get("command") if isinstance(doc, dict) else None
    schema = schema_for(command if isinstance(command, str) else "")
    errors = list(jsonschema.Draft202012Validator(schema, registry=registry).iter_errors(doc))
    while errors:
        error = max(errors, key=lambda e: len(e.absolute_path))
        if not error.context:
            raise error
        errors = _closest(error)


def _closest(error) -> list:
    """A oneOf's errors of the branch doc was meant for: preferably one where no required key is
    missing and no constant (command, installed) differs, and of those the one with the fewest errors."""
    branches: dict[Any, list] = {}
    for e in error.context:
        branches.setdefault(e.relative_schema_path[0], []).append(e)
    depth = len(error.absolute_path)
    return min(branches.values(), key=lambda es: (
        any(e.validator == "const" or (e.validator == "required" and len(e.absolute_path) == depth) for e in es),
        len(es)))
