"""Airlock settings: everything comes from the environment; the defaults make a fresh
checkout work (SQLite under var/, a broker that needs no server, demo data)."""

from __future__ import annotations

from pathlib import Path

import dj_database_url
from kombu import Queue

from .env import env_bool, env_float, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("AIRLOCK_VAR_DIR", str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)

DEBUG = env_bool("DEBUG", False)
SECRET_KEY = env_str("SECRET_KEY", "")
if not SECRET_KEY:
    # A fresh checkout gets a random key kept under var/, never a shared constant.
    key_file = VAR_DIR / "secret_key"
    if not key_file.exists():
        import secrets

        key_file.write_text(secrets.token_urlsafe(50))
        key_file.chmod(0o600)
    SECRET_KEY = key_file.read_text().strip()
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

AIRLOCK_ALLOW_SCRIPTED = env_bool("AIRLOCK_ALLOW_SCRIPTED", True)
# Modules whose TOOLS join the diagnostic tools (only with AIRLOCK_ALLOW_SCRIPTED): how
# the reliability tests give their worker processes `crash` and `hostile`.
AIRLOCK_EXTRA_TOOLS = env_list("AIRLOCK_EXTRA_TOOLS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "template_partials",
    "csp",
    "axes",
    "ninja",  # the JSON API: only for its bundled Swagger UI static files and templates
    "agents",
    "reviews",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "csp.middleware.CSPMiddleware",
    # One log line per refused request (who, method, path), so a denial leaves a trace.
    "agents.middleware.DenialLogMiddleware",
    # Last, as django-axes asks: it turns a locked-out login into its lockout response.
    "axes.middleware.AxesMiddleware",
]
# A database that is down answers 503, not a 500 page (agents/unavailable.py): first,
# so it also covers what the other middleware asks of the database.
MIDDLEWARE.insert(0, "agents.unavailable.DatabaseUnavailableMiddleware")

# Login throttling (django-axes): after AIRLOCK_LOGIN_FAILURE_LIMIT wrong passwords for a
# username, or from one address, even the right one is refused until an admin unlocks it
# (`manage.py axes_reset_username NAME`) or AIRLOCK_LOGIN_COOLOFF_HOURS pass.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("AIRLOCK_LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = env_float("AIRLOCK_LOGIN_COOLOFF_HOURS", 0) or None
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
AXES_LOCKOUT_TEMPLATE = "registration/locked.html"
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "agents.context_processors.roles",
            ],
        },
    }
]

DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'airlock.sqlite3'}"),
        conn_max_age=env_int("DB_CONN_MAX_AGE", 60),
        conn_health_checks=True,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"]["OPTIONS"] = {
        # WAL lets the web server read while a worker writes; IMMEDIATE takes the write
        # lock at BEGIN so two writers queue behind the busy timeout instead of failing.
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "static"
STATIC_ROOT.mkdir(exist_ok=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
        if not DEBUG and env_bool("AIRLOCK_MANIFEST_STATIC", False)
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}

SESSION_COOKIE_HTTPONLY = True
# Behind TLS in production (AIRLOCK_HTTPS=1): secure cookies, HSTS, redirect to https.
AIRLOCK_HTTPS = env_bool("AIRLOCK_HTTPS", False)
SESSION_COOKIE_SECURE = AIRLOCK_HTTPS
CSRF_COOKIE_SECURE = AIRLOCK_HTTPS
if AIRLOCK_HTTPS:
    SECURE_SSL_REDIRECT = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31_536_000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"

CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
        "base-uri": ["'none'"],
        "object-src": ["'none'"],
    }
}

# -- the engine ---------------------------------------------------------------------
AIRLOCK_LEASE_SECONDS = env_float("AIRLOCK_LEASE_SECONDS", 60.0)
AIRLOCK_JOURNAL_MAX_CHARS = env_int("AIRLOCK_JOURNAL_MAX_CHARS", 1_000_000)
# On PostgreSQL, write each transition as one statement (one round trip); 0 uses the ORM.
AIRLOCK_STORE_ONE_STATEMENT = env_bool("AIRLOCK_STORE_ONE_STATEMENT", True)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}

# -- model clients, demo tools, email ------------------------------------------------
# API keys (OPENAI_API_KEY, ANTHROPIC_API_KEY) and base URLs (OPENAI_BASE_URL,
# ANTHROPIC_BASE_URL) are read from the environment by the clients when a run is
# driven, never stored in settings, rows or logs.
AIRLOCK_LLM_TIMEOUT = env_float("AIRLOCK_LLM_TIMEOUT", 60.0)
AIRLOCK_LLM_RETRIES = env_int("AIRLOCK_LLM_RETRIES", 3)
AIRLOCK_LLM_BACKOFF = env_float("AIRLOCK_LLM_BACKOFF", 1.0)
AIRLOCK_LLM_MAX_SLEEP = env_float("AIRLOCK_LLM_MAX_SLEEP", 30.0)
AIRLOCK_ANTHROPIC_MAX_TOKENS = env_int("AIRLOCK_ANTHROPIC_MAX_TOKENS", 4096)
# Hosts http_get may fetch (`.example.com` allows subdomains too). The built-in demo
# site's reserved host is answered in-process; private addresses are always refused.
AIRLOCK_HTTP_ALLOWED_HOSTS = env_list("AIRLOCK_HTTP_ALLOWED_HOSTS", ["demo.airlock.internal"])
AIRLOCK_DEMO_USERS_FILE = Path(env_str("AIRLOCK_DEMO_USERS_FILE", str(VAR_DIR / "demo-users.txt")))

# Email (send_email): the file backend under var/mail by default, SMTP in production
# (EMAIL_BACKEND=django.core.mail.backends.smtp.EmailBackend plus EMAIL_HOST...).
EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.filebased.EmailBackend")
EMAIL_FILE_PATH = VAR_DIR / "mail"
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 30)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "helpdesk@airlock.local")

# -- workers (Celery) ---------------------------------------------------------------
# The database is the truth; broker messages are only wake-ups, so losing one costs a
# sweep interval, never a run. REDIS_URL picks Redis; otherwise kombu's filesystem
# transport under var/broker lets `make run` work with no server at all.
REDIS_URL = env_str("REDIS_URL", "")
AIRLOCK_SWEEP_SECONDS = env_float("AIRLOCK_SWEEP_SECONDS", 5.0)
AIRLOCK_IDLE_SECONDS = env_float("AIRLOCK_IDLE_SECONDS", 10.0)
AIRLOCK_TASK_TRANSITIONS = env_int("AIRLOCK_TASK_TRANSITIONS", 10)
AIRLOCK_TASK_SECONDS = env_float("AIRLOCK_TASK_SECONDS", 60.0)
AIRLOCK_MAX_DEAD_CLAIMS = env_int("AIRLOCK_MAX_DEAD_CLAIMS", 3)
# A task stops starting steps after AIRLOCK_TASK_SECONDS; one step may still take the
# longest tool timeout (sleep: 610 s) plus a slow model call, so the limits sit above.
CELERY_TASK_SOFT_TIME_LIMIT = env_int("AIRLOCK_TASK_SOFT_LIMIT", int(AIRLOCK_TASK_SECONDS) + 900)
CELERY_TASK_TIME_LIMIT = CELERY_TASK_SOFT_TIME_LIMIT + 60
# Redis hands an unacknowledged message to another worker after this; well above the
# hard limit so a slow task is never run twice by the broker (the lease would refuse it
# anyway). Set wherever Celery reads it.
_VISIBILITY = CELERY_TASK_TIME_LIMIT * 4
# -- fault injection: the reliability tests force redeliveries with a short
# visibility timeout and a quick restore cycle; never lower these in production.
_VISIBILITY = env_float("AIRLOCK_VISIBILITY_TIMEOUT", _VISIBILITY)
_RESTORE_INTERVAL = env_float("AIRLOCK_UNACKED_RESTORE_INTERVAL", 10.0)
_RESTORE_THROTTLE = env_int("AIRLOCK_UNACKED_RESTORE_THROTTLE", 10)
if REDIS_URL:
    CELERY_BROKER_URL = REDIS_URL
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "visibility_timeout": _VISIBILITY,
        "unacked_restore_interval": _RESTORE_INTERVAL,
        "unacked_restore_throttle": _RESTORE_THROTTLE,
        "socket_connect_timeout": 3,
        # Publishing (a wake-up inside a web request) tries the broker briefly and gives
        # up; the worker's own reconnect loop is configured apart and keeps trying.
        "max_retries": 1,
        "interval_start": 0,
        "interval_step": 0.2,
        "interval_max": 0.5,
    }
else:
    BROKER_DIR = VAR_DIR / "broker"
    for _folder in ("queue", "control"):
        (BROKER_DIR / _folder).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_URL = "filesystem://localhost//"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR / "queue"),
        "data_folder_out": str(BROKER_DIR / "queue"),
        "control_folder": str(BROKER_DIR / "control"),
        "polling_interval": 0.1,
        "visibility_timeout": _VISIBILITY,
    }
CELERY_RESULT_BACKEND = None
CELERY_RESULT_BACKEND_TRANSPORT_OPTIONS = {"visibility_timeout": _VISIBILITY}
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_CONNECTION_TIMEOUT = 3
CELERY_WORKER_HIJACK_ROOT_LOGGER = False  # the worker logs through LOGGING above
# Celery's fixup would close the database connection around every task (a fifth of a
# busy worker's time went to reconnecting, measured by `make bench`);
# config/celery.py applies Django's CONN_MAX_AGE and health checks instead.
CELERY_DB_REUSE_MAX = 2**62
CELERY_TASK_DEFAULT_QUEUE = "airlock"
CELERY_TASK_QUEUES = [Queue("airlock", routing_key="airlock"), Queue("airlock_sweep", routing_key="airlock_sweep")]
# Sweeps get their own queue so a backlog of runs cannot starve them.
CELERY_TASK_ROUTES = {"agents.tasks.sweep": {"queue": "airlock_sweep"}}
CELERY_BEAT_SCHEDULE = {
    "sweep-runs": {
        "task": "agents.tasks.sweep",
        "schedule": AIRLOCK_SWEEP_SECONDS,
        # A sweep that waited longer than two intervals is superseded by a newer one.
        "options": {"expires": AIRLOCK_SWEEP_SECONDS * 2},
    }
}
