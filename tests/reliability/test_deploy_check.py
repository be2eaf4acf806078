from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_check_deploy_passes_with_production_settings(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "DEBUG": "0",
        "AIRLOCK_HTTPS": "1",
        "SECURE_HSTS_PRELOAD": "1",
        "SECRET_KEY": secrets.token_urlsafe(60),
        "ALLOWED_HOSTS": "airlock.example.com",
        "AIRLOCK_VAR_DIR": str(tmp_path),
    }
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)  # set for the browser tests' process only
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout
