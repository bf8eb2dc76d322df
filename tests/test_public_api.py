"""Each package face lists its public names once, sorted, and exports exactly them (as httpx
pins its own): the core's lazy face and the two adapters' top levels."""

from __future__ import annotations

import ast
import subprocess
import sys
from importlib import import_module
from importlib.metadata import version
from pathlib import Path
from types import ModuleType

import pytest

FACES = ["llm_resilience", "langchain_llm_resilience", "llama_index.resilience"]


def _imported_names(face: ModuleType) -> dict[str, str]:
    """Every public name the face's source imports from its own package (the core's
    ``TYPE_CHECKING`` block included), and the module it comes from."""
    tree = ast.parse(Path(face.__file__ or "").read_text(encoding="utf-8"))
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(face.__name__):
            for alias in node.names:
                name = alias.asname or alias.name
                if not name.startswith("_"):
                    found[name] = str(node.module)
    return found


@pytest.mark.parametrize("name", FACES)
def test_a_face_lists_its_names_sorted(name: str) -> None:
    face = import_module(name)
    assert face.__all__ == sorted(face.__all__)
    assert len(set(face.__all__)) == len(face.__all__)


@pytest.mark.parametrize("name", FACES)
def test_a_face_lists_exactly_the_names_it_imports(name: str) -> None:
    face = import_module(name)
    assert set(face.__all__) - {"__version__"} == set(_imported_names(face))


@pytest.mark.parametrize("name", FACES)
def test_every_listed_name_is_the_object_its_module_defines(name: str) -> None:
    face = import_module(name)
    for listed, module in _imported_names(face).items():
        assert getattr(face, listed) is getattr(import_module(module), listed), listed


def test_the_core_face_says_its_version_and_nothing_it_does_not_list() -> None:
    import llm_resilience

    assert llm_resilience.__version__ == version("llm-resilience")
    assert dir(llm_resilience) == llm_resilience.__all__
    with pytest.raises(AttributeError, match="no attribute 'FallbackChatModel'"):
        llm_resilience.FallbackChatModel  # noqa: B018


def test_importing_the_core_face_loads_none_of_its_modules() -> None:
    probe = (
        "import sys, llm_resilience; "
        "loaded = sorted(m for m in sys.modules if m.startswith('llm_resilience.')); "
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", probe], check=True)


def test_to_dataframe_is_on_the_core_face_and_loads_pandas_only_when_called() -> None:
    probe = (
        "import sys, llm_resilience, llm_resilience.frames; "
        "from llm_resilience import to_dataframe; "
        "assert to_dataframe is llm_resilience.frames.to_dataframe; "
        "assert 'pandas' not in sys.modules, 'imported pandas'; "
        "to_dataframe([]); "
        "assert 'pandas' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60)
