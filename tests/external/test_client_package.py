"""`airlock-client` is a distribution of its own that installs and imports without
Django: built and installed by pip into the OpenAI Agents SDK's environment (which has
no Django) in a folder of its own, then imported there."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.external.sdk import venv

CLIENT = Path(__file__).resolve().parents[2] / "clients" / "python"


def test_the_client_installs_with_pip_and_imports_without_django(tmp_path: Path) -> None:
    python = str(venv.python())
    target = tmp_path / "site"
    # No build isolation (the environment's own setuptools builds it) and no
    # dependencies (httpx is there already): nothing is fetched.
    subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-build-isolation",
         "--no-deps", "--target", str(target), str(CLIENT)],
        check=True, timeout=300, cwd=tmp_path, capture_output=True,
    )
    assert (target / "airlock_client" / "py.typed").exists()
    probe = (
        "import sys, airlock_client, airlock_client.openai_agents; "
        "assert 'django' not in sys.modules, 'the client imported Django'; "
        "print(airlock_client.__file__)"
    )
    out = subprocess.run(
        [python, "-c", probe], env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}, cwd=tmp_path,
        check=True, timeout=120, capture_output=True, text=True,
    ).stdout
    assert out.strip() == str(target / "airlock_client" / "__init__.py")
