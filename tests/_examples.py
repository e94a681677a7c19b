"""Loading a script of examples/ as a module for the tests that run it."""

import importlib.util
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load_example(name: str):
    """Yields examples/<name>.py as module `name` (registered in sys.modules while in use: dataclasses look
    their module up there), removed afterwards. For `yield from` in a pytest fixture."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)
