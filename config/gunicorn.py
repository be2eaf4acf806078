"""gunicorn's settings for the web service: `gunicorn -c config/gunicorn.py config.wsgi:application`
(what the image and docker-compose.yml run; docs/deployment.md, "The web service").

Some requests wait by design: a decision API long poll (`?wait=`, up to 30 s) and an MCP
gateway call held for a human (up to AIRLOCK_GATEWAY_WAIT_SECONDS, 20 s). Under
gunicorn's default sync worker each of them holds a whole worker process, so three
agents waiting on three workers stopped every page, the review queue where the human
would answer included: /healthz took 14 s behind three long polls. The threaded
worker gives each waiting request a thread instead (it holds no database connection
while it waits), and keeps HTTP connections alive between an agent's requests.

WEB_BIND (0.0.0.0:8000), WEB_CONCURRENCY (processes, 3) and WEB_THREADS (threads a
process, 32) size it; each process shares AIRLOCK_DB_POOL_MAX connections among its
threads.
"""

import sys
from pathlib import Path

# gunicorn reads this file before it puts the working directory on the path.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from config.env import EnvError, env_int, env_str  # noqa: E402 - after the path

bind = env_str("WEB_BIND", "0.0.0.0:8000")
workers = env_int("WEB_CONCURRENCY", 3)
worker_class = "gthread"
threads = env_int("WEB_THREADS", 32)
if workers < 1 or threads < 1:
    raise EnvError("WEB_CONCURRENCY and WEB_THREADS must be at least 1")
# The worker's heartbeat, not a request's limit: a waiting request is bounded by its own wait.
timeout = 60
accesslog = "-"
