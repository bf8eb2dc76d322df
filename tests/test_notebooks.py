"""Every notebook in notebooks/ runs offline, top to bottom, without an error."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks_to_run() -> None:
    assert NOTEBOOKS


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> dict[Path, Any]:
    """Each notebook run top to bottom, or the error that stopped it, by path.

    Each runs in its own kernel (a fresh process) and its own folder, as a reader runs
    it; the kernels run at the same time, so one notebook's waits (its servers' scripted
    hangs, a kernel starting) overlap another's work.
    """
    import nbformat
    from jupyter_client.manager import AsyncKernelManager
    from nbclient import NotebookClient

    async def run(path: Path) -> Any:
        notebook = nbformat.read(path, as_version=4)
        folder = tmp_path_factory.mktemp(path.stem)
        # The kernel's channels on Unix sockets in its folder, not on TCP ports: a port
        # the kernel manager picked free may be taken before the kernel binds it (the
        # suite's other worker opens servers on free ports all the time), and the
        # kernel then dies before it answers.
        kernel = AsyncKernelManager(
            kernel_name="python3", transport="ipc", ip=str(folder / "kernel")
        )
        client = NotebookClient(
            notebook,
            km=kernel,
            timeout=120,
            kernel_name="python3",
            resources={"metadata": {"path": str(folder)}},
        )
        try:
            await client.async_execute()
        except Exception as error:  # CellExecutionError names the cell
            return error
        return notebook

    async def run_all() -> list[Any]:
        return await asyncio.gather(*(run(path) for path in NOTEBOOKS))

    return dict(zip(NOTEBOOKS, asyncio.run(run_all()), strict=True))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.name)
def test_the_notebook_runs_offline_without_errors(path: Path, executed: dict[Path, Any]) -> None:
    result = executed[path]
    if isinstance(result, BaseException):
        raise result
    outputs = [output for cell in result.cells for output in cell.get("outputs", [])]
    assert not [output for output in outputs if output.get("output_type") == "error"]
