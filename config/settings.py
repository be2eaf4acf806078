"""Airlock settings: everything comes from the environment; the defaults make a fresh
checkout work (SQLite under var/, a broker that needs no server, demo data)."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import dj_database_url
from kombu import Queue

from .env import EnvError, env_bool, env_cidrs, env_float, env_int, env_list, env_positive_float, env_str

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
# A refused form token gets a page in the site layout that says what to do (agents/web/errors.py).
CSRF_FAILURE_VIEW = "agents.web.errors.csrf_failure"

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
    # Single sign-on (OpenID Connect, agents/accounts/sso.py): installed always, so the schema does
    # not depend on the environment; without AIRLOCK_OIDC_ISSUER there is no provider app,
    # no button, and its URLs answer 404.
    "allauth",
    "allauth.account",
    "allauth.socialaccount",
    "allauth.socialaccount.providers.openid_connect",
    "agents",
    "reviews",
]

MIDDLEWARE = [
    # /healthz, /readyz and /metrics are answered first: no session, no login, any Host
    # (agents/ops/operations.py).
    "agents.ops.operations.OperationsMiddleware",
    # A database that is down answers 503, not a 500 page (agents/ops/unavailable.py):
    # before the rest, so it also covers what the other middleware asks of the database.
    "agents.ops.unavailable.DatabaseUnavailableMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # django-allauth's (it asks for it even when only its social login is used).
    "allauth.account.middleware.AccountMiddleware",
    # The project switcher (agents/web/projects.py): which project the pages' lists show.
    "agents.web.projects.ProjectSwitchMiddleware",
    # django-csp's, with the header's text built once (agents/ops/policy_header.py).
    "agents.ops.policy_header.CSPMiddleware",
    # One log line per refused request (who, method, path), so a denial leaves a trace.
    "agents.ops.middleware.DenialLogMiddleware",
    # Last, as django-axes asks: it turns a locked-out login into its lockout response.
    "axes.middleware.AxesMiddleware",
]

# A request to /api/ that carries an Authorization header is a token's (agents/api/auth.py:
# a present header never falls back to the session), so config.wsgi and config.asgi
# answer it through MIDDLEWARE without the layers that serve only a browser's session:
# its cookie, CSRF, login, messages, htmx, allauth, the project switcher, the login
# lockout and static files. Everything else stays, in order: the database-down 503, the
# security headers, the host check, CSP and the refusal log (DenialLogMiddleware). A
# middleware added to MIDDLEWARE later is kept there too unless it is named here.
BROWSER_ONLY_MIDDLEWARE = (
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "allauth.account.middleware.AccountMiddleware",
    "agents.web.projects.ProjectSwitchMiddleware",
    "axes.middleware.AxesMiddleware",
)
TOKEN_API_MIDDLEWARE = [m for m in MIDDLEWARE if m not in BROWSER_ONLY_MIDDLEWARE]

# Login throttling (django-axes): AIRLOCK_LOGIN_FAILURE_LIMIT wrong
# passwords for one username from one address lock that pair, and only that pair, for
# AIRLOCK_LOGIN_COOLOFF_MINUTES (the right password included). Locking an address locked
# everyone behind it (a proxy: everyone) and locking a username let any stranger lock out
# the admin. The address is REMOTE_ADDR unless that is one of AIRLOCK_TRUSTED_PROXIES
# (agents/accounts/lockout.py). `manage.py axes_reset_username NAME`, or deleting the access
# attempt in /admin/, lifts a lockout sooner.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("AIRLOCK_LOGIN_FAILURE_LIMIT", 5)
if AXES_FAILURE_LIMIT < 1:
    raise EnvError("AIRLOCK_LOGIN_FAILURE_LIMIT must be at least 1")
if env_str("AIRLOCK_LOGIN_COOLOFF_HOURS", ""):
    # Its 0 meant "locked until an admin resets it"; refuse it rather than quietly change that.
    raise EnvError("AIRLOCK_LOGIN_COOLOFF_HOURS is gone: set AIRLOCK_LOGIN_COOLOFF_MINUTES (default 15)")
AXES_COOLOFF_TIME = timedelta(minutes=env_positive_float("AIRLOCK_LOGIN_COOLOFF_MINUTES", 15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
# A try while locked is refused but not counted, so the lockout ends when the page said.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False
AXES_CLIENT_IP_CALLABLE = "agents.accounts.lockout.client_ip"
AXES_USERNAME_CALLABLE = "agents.accounts.lockout.attempted_username"
AXES_LOCKOUT_CALLABLE = "agents.accounts.lockout.lockout_response"
# Proxies (addresses or CIDR networks) whose X-Forwarded-For is believed; none by default,
# so a client cannot name its own address.
AIRLOCK_TRUSTED_PROXIES = env_cidrs("AIRLOCK_TRUSTED_PROXIES")

# -- single sign-on: OpenID Connect through django-allauth (agents/accounts/sso.py, docs/teams.md) --
# Unset issuer: no SSO at all, the password login as before. The provider app is built
# from these at each request (agents/accounts/sso.py `SsoAccountAdapter.list_apps`), never stored.
AIRLOCK_OIDC_ISSUER = env_str("AIRLOCK_OIDC_ISSUER", "").rstrip("/")
AIRLOCK_OIDC_CLIENT_ID = env_str("AIRLOCK_OIDC_CLIENT_ID", "")
AIRLOCK_OIDC_CLIENT_SECRET = env_str("AIRLOCK_OIDC_CLIENT_SECRET", "")
AIRLOCK_OIDC_NAME = env_str("AIRLOCK_OIDC_NAME", "Single sign-on")
AIRLOCK_OIDC_GROUPS_CLAIM = env_str("AIRLOCK_OIDC_GROUPS_CLAIM", "groups")
# Only people whose verified email is at one of these domains may sign in (empty: any).
AIRLOCK_OIDC_DOMAINS = [d.lower().lstrip("@").rstrip(".") for d in env_list("AIRLOCK_OIDC_DOMAINS", [])]
if AIRLOCK_OIDC_ISSUER and not (AIRLOCK_OIDC_ISSUER.startswith(("https://", "http://")) and AIRLOCK_OIDC_CLIENT_ID):
    raise EnvError("AIRLOCK_OIDC_ISSUER must be an http(s) URL, and AIRLOCK_OIDC_CLIENT_ID must be set with it")
# 0: password login only for superusers (the break-glass account); the API's tokens are
# not affected. Refused while no SSO is configured: nobody but superusers could sign in.
AIRLOCK_PASSWORD_LOGIN = env_bool("AIRLOCK_PASSWORD_LOGIN", True)
if not AIRLOCK_PASSWORD_LOGIN and not AIRLOCK_OIDC_ISSUER:
    raise EnvError("AIRLOCK_PASSWORD_LOGIN=0 needs AIRLOCK_OIDC_ISSUER: otherwise only superusers could sign in")
ACCOUNT_ADAPTER = "agents.accounts.sso.AccountAdapter"
SOCIALACCOUNT_ADAPTER = "agents.accounts.sso.SsoAccountAdapter"
SOCIALACCOUNT_PROVIDERS = {
    # Ours checks the ID token's signature and nonce too (agents/accounts/sso.py says why).
    "openid_connect": {"provider_class": "agents.accounts.sso.Provider", "OAUTH_PKCE_ENABLED": True},
}
# People are made (and updated) from the verified ID token at each sign-in; no signup
# form, no email confirmation (the identity provider vouches), no provider tokens kept.
SOCIALACCOUNT_AUTO_SIGNUP = True
SOCIALACCOUNT_EMAIL_VERIFICATION = "none"
SOCIALACCOUNT_EMAIL_REQUIRED = False
SOCIALACCOUNT_STORE_TOKENS = False
SOCIALACCOUNT_LOGIN_ON_GET = False
ACCOUNT_EMAIL_VERIFICATION = "none"
# Two people may share an address in Airlock's user table (a local break-glass account
# and an SSO person); allauth would otherwise send a clash to its signup form.
ACCOUNT_UNIQUE_EMAIL = False

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
                "agents.web.context_processors.roles",
            ],
        },
    },
    # Fragments repeated many times a page (the runs list's rows), from each app's
    # jinja2/ folder: compiled, escaped by default (agents/web/jinja.py). Listed second,
    # so pages are found in the Django engine first; fragments are asked for by name
    # from engines["jinja2"].
    {
        "BACKEND": "django.template.backends.jinja2.Jinja2",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {"environment": "agents.web.jinja.environment", "autoescape": True},
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'airlock.sqlite3'}"),
        conn_max_age=env_int("DB_CONN_MAX_AGE", 60),
        conn_health_checks=True,
    )
}
# -- bounded connections: a threaded worker holds few, whatever its threads ------------
# On PostgreSQL each process shares a psycopg_pool of at most AIRLOCK_DB_POOL_MAX
# connections among its threads; a thread returns its connection whenever it waits
# (a model call, a tool, the end of a task). Size it so that
#   (worker processes + web processes) x AIRLOCK_DB_POOL_MAX + beat + headroom
#   <= PostgreSQL max_connections
# (docs/deployment.md). A pool needs CONN_MAX_AGE 0: DB_CONN_MAX_AGE applies only with
# AIRLOCK_DB_POOL=0.
AIRLOCK_DB_POOL = env_bool("AIRLOCK_DB_POOL", True)
AIRLOCK_DB_POOL_MIN = env_int("AIRLOCK_DB_POOL_MIN", 1)
AIRLOCK_DB_POOL_MAX = env_int("AIRLOCK_DB_POOL_MAX", 10)
# How long a thread waits for a free connection; also how long a request waits before
# its 503 while PostgreSQL is down (the pool keeps trying to reconnect meanwhile).
AIRLOCK_DB_POOL_TIMEOUT = env_float("AIRLOCK_DB_POOL_TIMEOUT", 5.0)
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql" and AIRLOCK_DB_POOL:
    if not 1 <= AIRLOCK_DB_POOL_MIN <= AIRLOCK_DB_POOL_MAX:
        raise EnvError("AIRLOCK_DB_POOL_MIN must be at least 1 and at most AIRLOCK_DB_POOL_MAX")
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": AIRLOCK_DB_POOL_MIN,
        "max_size": AIRLOCK_DB_POOL_MAX,
        # Past this a thread gets an OperationalError instead of hanging: a 503 on the
        # web, a failed step the sweeper retries in a worker.
        "timeout": AIRLOCK_DB_POOL_TIMEOUT,
    }
# The store's transition statement is prepared on the server (planned once per
# connection). Off for a pooler that cannot keep prepared statements: docs/deployment.md.
AIRLOCK_PREPARED_STATEMENTS = env_bool("AIRLOCK_PREPARED_STATEMENTS", True)
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql" and AIRLOCK_PREPARED_STATEMENTS:
    # Django sets psycopg's prepare_threshold to None, which turns preparing off for the
    # connection, an explicit `prepare=True` included. A threshold no query reaches keeps
    # every other query unprepared and lets the store ask for its statement.
    DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = 2**31 - 1
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"]["OPTIONS"] = {
        # WAL lets the web server read while a worker writes; IMMEDIATE takes the write
        # lock at BEGIN so two writers queue behind the busy timeout instead of failing
        # (a worker's threads are such writers: every transaction is one short write).
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
    }
    # The tests' database is a file too, not Django's default in-memory one: a shared
    # in-memory cache locks by table and fails at once ("database table is locked")
    # where a file waits its busy timeout, so concurrent tests would see a database no
    # deployment has. pytest-django suffixes the name per xdist worker.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test-airlock.sqlite3")}

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
# Where "Save as eval case" on a run's page writes its case: the deployment's own cases,
# under var/, never the shipped evals/ (whose every case the suite expects to pass);
# `manage.py run_evals var/evals` replays them.
AIRLOCK_EVALS_DIR = Path(env_str("AIRLOCK_EVALS_DIR", str(VAR_DIR / "evals")))
# On PostgreSQL, write each transition as one statement (one round trip); 0 uses the ORM.
AIRLOCK_STORE_ONE_STATEMENT = env_bool("AIRLOCK_STORE_ONE_STATEMENT", True)
# Live runs' transcripts a process keeps between a commit and the next load, in
# messages all told (0: off), and how long one unused is kept (agents/runs/store.py).
AIRLOCK_TRANSCRIPT_CACHE = env_int("AIRLOCK_TRANSCRIPT_CACHE", 20000)
AIRLOCK_TRANSCRIPT_CACHE_SECONDS = env_positive_float("AIRLOCK_TRANSCRIPT_CACHE_SECONDS", 600.0)
if AIRLOCK_TRANSCRIPT_CACHE < 0:
    raise EnvError("AIRLOCK_TRANSCRIPT_CACHE must be 0 (off) or a number of messages")
# What one MCP sync pins: the first tools by name (OpenAI takes 128 tools per request),
# each description cut to this many characters (docs/mcp.md#limits).
AIRLOCK_MCP_MAX_TOOLS = env_int("AIRLOCK_MCP_MAX_TOOLS", 128)
AIRLOCK_MCP_MAX_DESCRIPTION_CHARS = env_int("AIRLOCK_MCP_MAX_DESCRIPTION_CHARS", 4000)
if AIRLOCK_MCP_MAX_TOOLS < 1 or AIRLOCK_MCP_MAX_DESCRIPTION_CHARS < 1:
    raise EnvError("AIRLOCK_MCP_MAX_TOOLS and AIRLOCK_MCP_MAX_DESCRIPTION_CHARS must be at least 1")
# How long a kept-open session to a streamable-HTTP server trusts its last tools/list
# before a call lists again (0: list before every call). A `list_changed` notification
# or a reconnect lists at once (docs/mcp.md).
AIRLOCK_MCP_LISTING_SECONDS = env_float("AIRLOCK_MCP_LISTING_SECONDS", 30.0)
if not 0 <= AIRLOCK_MCP_LISTING_SECONDS <= 3600:
    raise EnvError("AIRLOCK_MCP_LISTING_SECONDS must be between 0 and 3600 seconds")

# LOG_FORMAT=json: one JSON object per line, with the run id and trace id where known.
LOG_FORMAT = env_str("LOG_FORMAT", "plain")
if LOG_FORMAT not in ("plain", "json"):
    raise EnvError(f"LOG_FORMAT must be plain or json, not {LOG_FORMAT!r}")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "agents.ops.logs.JsonFormatter"},
    },
    "filters": {"run": {"()": "agents.ops.logs.RunContextFilter"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT, "filters": ["run"]}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # httpx (ours) and httpx2 (the MCP SDK's) log every request URL at INFO, and
        # httpcore every connection at DEBUG: a Slack webhook URL is a credential, a
        # webhook path or a fetched URL may carry one. Not even at DEBUG.
        "httpx": {"level": "WARNING"},
        "httpx2": {"level": "WARNING"},
        "httpcore": {"level": "WARNING"},
        "httpcore2": {"level": "WARNING"},
    },
}

# -- model clients, demo tools, email ------------------------------------------------
# API keys (OPENAI_API_KEY, ANTHROPIC_API_KEY) and base URLs (OPENAI_BASE_URL,
# ANTHROPIC_BASE_URL) are read from the environment by the clients when a run is
# driven, never stored in settings, rows or logs.
AIRLOCK_ANTHROPIC_MAX_TOKENS = env_int("AIRLOCK_ANTHROPIC_MAX_TOKENS", 4096)
# Requests are not streamed: the answer comes when the whole reply is written, so the
# default timeout covers max_tokens at a slow 20 tokens/s (at least 60 s). A timed-out
# request is sent again and may be billed twice, so a short timeout costs money.
AIRLOCK_LLM_TIMEOUT = env_float("AIRLOCK_LLM_TIMEOUT", max(60.0, AIRLOCK_ANTHROPIC_MAX_TOKENS / 20))
AIRLOCK_LLM_RETRIES = env_int("AIRLOCK_LLM_RETRIES", 3)
AIRLOCK_LLM_BACKOFF = env_float("AIRLOCK_LLM_BACKOFF", 1.0)
AIRLOCK_LLM_MAX_SLEEP = env_float("AIRLOCK_LLM_MAX_SLEEP", 30.0)
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

# -- the MCP gateway (/mcp/<profile>/, docs/gateway.md) ----------------------------------
# How long a tools/call that needs a human waits for a decision before it answers
# "pending_approval" (calling it again returns the outcome). Seconds, 0 to 60.
AIRLOCK_GATEWAY_WAIT_SECONDS = env_float("AIRLOCK_GATEWAY_WAIT_SECONDS", 20.0)
if not 0 <= AIRLOCK_GATEWAY_WAIT_SECONDS <= 60:
    raise EnvError("AIRLOCK_GATEWAY_WAIT_SECONDS must be between 0 and 60 seconds")
# 2026-07-28 era: a call held for a human answers `input_required` round after round
# (each up to AIRLOCK_GATEWAY_WAIT_SECONDS) until this many seconds have passed since
# its first round, then "pending_approval" (docs/gateway.md, "Holds"). 0 to 600.
AIRLOCK_GATEWAY_HOLD_SECONDS = env_float("AIRLOCK_GATEWAY_HOLD_SECONDS", 120.0)
if not 0 <= AIRLOCK_GATEWAY_HOLD_SECONDS <= 600:
    raise EnvError("AIRLOCK_GATEWAY_HOLD_SECONDS must be between 0 and 600 seconds")
# A stream's run that ended tainted passes its taint to the stream's next run if it
# ended less than this many hours ago (exhausting a budget never launders taint).
AIRLOCK_GATEWAY_TAINT_HOURS = env_float("AIRLOCK_GATEWAY_TAINT_HOURS", 24.0)
if AIRLOCK_GATEWAY_TAINT_HOURS < 0:
    raise EnvError("AIRLOCK_GATEWAY_TAINT_HOURS must be 0 or more hours")
# A stream's run with no call for this long is finished (done) by the stream's next call,
# which continues in a new run. Seconds; 0 never ends a run for idleness.
AIRLOCK_GATEWAY_IDLE_SECONDS = env_int("AIRLOCK_GATEWAY_IDLE_SECONDS", 4 * 3600)
if AIRLOCK_GATEWAY_IDLE_SECONDS < 0:
    raise EnvError("AIRLOCK_GATEWAY_IDLE_SECONDS must be 0 or more seconds")

# -- notifications: webhooks and the reviewers' email digest -----------------------------
# Links in webhook bodies, Slack messages and emails point here (default: `make run`'s).
AIRLOCK_BASE_URL = env_str("AIRLOCK_BASE_URL", f"http://127.0.0.1:{env_str('PORT', '8000')}").rstrip("/")
# Browser origins the MCP gateway accepts besides AIRLOCK_BASE_URL's own: a request whose
# `Origin` is neither gets 403 (a page elsewhere must not drive an agent through a
# reviewer's browser; the MCP specification asks for it). Comma-separated
# `scheme://host[:port]`, e.g. https://inspector.internal:6274. No Origin is fine.
AIRLOCK_GATEWAY_ALLOWED_ORIGINS = env_list("AIRLOCK_GATEWAY_ALLOWED_ORIGINS", [])
for _origin in AIRLOCK_GATEWAY_ALLOWED_ORIGINS:
    if not re.match(r"^https?://[^/?#@\s]+$", _origin.rstrip("/"), re.IGNORECASE):
        raise EnvError(f"AIRLOCK_GATEWAY_ALLOWED_ORIGINS: {_origin!r} is not an origin (scheme://host[:port])")
# Webhook receivers on private addresses are refused (as for http_get) unless listed
# here: comma-separated host names or addresses, e.g. 127.0.0.1,hooks.internal.
AIRLOCK_WEBHOOK_ALLOWED_HOSTS = [h.lower().rstrip(".") for h in env_list("AIRLOCK_WEBHOOK_ALLOWED_HOSTS", [])]
AIRLOCK_WEBHOOK_TIMEOUT = env_float("AIRLOCK_WEBHOOK_TIMEOUT", 10.0)
# Attempt n failing waits min(MAX, BASE * 4^(n-1)) seconds, +-20% jitter: 5 s, 20 s,
# 80 s, ... 6 h; eleven attempts span about a day, then the delivery is dead.
AIRLOCK_WEBHOOK_MAX_ATTEMPTS = env_int("AIRLOCK_WEBHOOK_MAX_ATTEMPTS", 11)
AIRLOCK_WEBHOOK_RETRY_BASE_SECONDS = env_float("AIRLOCK_WEBHOOK_RETRY_BASE_SECONDS", 5.0)
AIRLOCK_WEBHOOK_RETRY_MAX_SECONDS = env_float("AIRLOCK_WEBHOOK_RETRY_MAX_SECONDS", 6 * 3600.0)
# Pending calls are emailed to reviewers as one digest once the oldest unsent one is
# this old: fifty in a minute make one email, not fifty.
AIRLOCK_EMAIL_DIGEST_SECONDS = env_float("AIRLOCK_EMAIL_DIGEST_SECONDS", 60.0)
# A reviewer's claim on a call ("I'm on it") lapses after this many minutes (fractions
# allowed); claiming it again extends it (docs/reviewing.md#claims).
AIRLOCK_CLAIM_MINUTES = env_positive_float("AIRLOCK_CLAIM_MINUTES", 10)
# Emailed decision links (/reviews/links/<token>/) die after this many hours at the latest.
AIRLOCK_EMAIL_LINK_HOURS = env_positive_float("AIRLOCK_EMAIL_LINK_HOURS", 72.0)
# The Slack app's signing secret: POST /integrations/slack/interactions answers 401 to
# every request it does not sign (and to all of them while this is unset).
AIRLOCK_SLACK_SIGNING_SECRET = env_str("AIRLOCK_SLACK_SIGNING_SECRET", "")
# How long a Slack click waits for its decision before answering "working on it" (Slack
# gives up, and retries, after 3 s); the outcome then goes to the message's response_url.
AIRLOCK_SLACK_ANSWER_SECONDS = env_positive_float("AIRLOCK_SLACK_ANSWER_SECONDS", 2.0)

# -- workers (Celery) ---------------------------------------------------------------
# The database is the truth; broker messages are only wake-ups, so losing one costs a
# sweep interval, never a run. REDIS_URL picks Redis; otherwise kombu's filesystem
# transport under var/broker lets `make run` work with no server at all.
REDIS_URL = env_str("REDIS_URL", "")
AIRLOCK_SWEEP_SECONDS = env_float("AIRLOCK_SWEEP_SECONDS", 5.0)
AIRLOCK_IDLE_SECONDS = env_float("AIRLOCK_IDLE_SECONDS", 10.0)
# A run's turn on a worker: this many transitions (or AIRLOCK_TASK_SECONDS), then it
# goes to the back of the queue. Each turn costs a lease, a read of the run and its
# transcript and a release; with quick tools 10 transitions took about as long.
AIRLOCK_TASK_TRANSITIONS = env_int("AIRLOCK_TASK_TRANSITIONS", 100)
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
    # (issue 25) Not the stock "filesystem://": its writers and readers race, and a
    # half-written file killed the worker. config/fsbroker.py writes atomically and
    # skips (into broker/bad/) any file it cannot read.
    CELERY_BROKER_URL = "airlockfs://localhost//"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR / "queue"),
        "data_folder_out": str(BROKER_DIR / "queue"),
        "control_folder": str(BROKER_DIR / "control"),
        "bad_folder": str(BROKER_DIR / "bad"),
        "polling_interval": 0.1,
        "visibility_timeout": _VISIBILITY,
    }
CELERY_RESULT_BACKEND = None  # no results are kept, so no result transport options either
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
# A run spends its life waiting on a model or a tool, so a worker is a pool
# of threads (one process, many runs in flight), not of processes; prefork stays the
# escape hatch for CPU-bound tools (AIRLOCK_WORKER_POOL=prefork, or `--pool prefork`).
# docs/deployment.md sizes both.
AIRLOCK_WORKER_POOL = env_str("AIRLOCK_WORKER_POOL", "threads")
AIRLOCK_WORKER_CONCURRENCY = env_int("AIRLOCK_WORKER_CONCURRENCY", 32)
if AIRLOCK_WORKER_POOL not in ("threads", "prefork", "solo"):
    raise EnvError(f"AIRLOCK_WORKER_POOL must be threads, prefork or solo, not {AIRLOCK_WORKER_POOL!r}")
if AIRLOCK_WORKER_CONCURRENCY < 1:
    raise EnvError("AIRLOCK_WORKER_CONCURRENCY must be at least 1")
CELERY_WORKER_POOL = AIRLOCK_WORKER_POOL
CELERY_WORKER_CONCURRENCY = AIRLOCK_WORKER_CONCURRENCY
CELERY_TASK_DEFAULT_QUEUE = "airlock"
CELERY_TASK_QUEUES = [Queue("airlock", routing_key="airlock"), Queue("airlock_sweep", routing_key="airlock_sweep")]
# Sweeps get their own queue so a backlog of runs cannot starve them.
# Notifications share it: their work per task is bounded, and a backlog of runs must
# not hold back a reviewer's "a call is waiting".
CELERY_TASK_ROUTES = {
    "agents.tasks.sweep": {"queue": "airlock_sweep"},
    "agents.tasks.deliver_notifications": {"queue": "airlock_sweep"},
    "agents.tasks.purge_runs": {"queue": "airlock_sweep"},
}
# -- retention (agents/runs/retention.py, docs/operations.md) -------------------------
# Finished runs' content is purged after this many days (a profile's retention_days
# overrides it); unset or empty keeps everything.
_retention = env_str("AIRLOCK_RETENTION_DAYS", "")
if _retention and not _retention.isdigit():
    raise EnvError(f"AIRLOCK_RETENTION_DAYS must be a whole number of days, not {_retention!r}")
AIRLOCK_RETENTION_DAYS: int | None = int(_retention) if _retention else None
# Runs purged per transaction: small batches keep locks short and the WAL steady.
AIRLOCK_PURGE_BATCH = env_int("AIRLOCK_PURGE_BATCH", 200)
if AIRLOCK_PURGE_BATCH < 1:
    raise EnvError("AIRLOCK_PURGE_BATCH must be at least 1")
# A pause between two purge batches, holding nothing, so live runs' commits get the disk
# and the CPU between them (the daily purge is background work; 0: batch after batch).
AIRLOCK_PURGE_PAUSE_MS = env_int("AIRLOCK_PURGE_PAUSE_MS", 250)
if AIRLOCK_PURGE_PAUSE_MS < 0:
    raise EnvError("AIRLOCK_PURGE_PAUSE_MS must be 0 or more")

CELERY_BEAT_SCHEDULE = {
    # The daily purge of runs past their retention (nothing when none is set).
    "purge-runs": {
        "task": "agents.tasks.purge_runs",
        "schedule": 86_400.0,
        "options": {"expires": 3_600.0},
    },
    "sweep-runs": {
        "task": "agents.tasks.sweep",
        "schedule": AIRLOCK_SWEEP_SECONDS,
        # A sweep that waited longer than two intervals is superseded by a newer one.
        "options": {"expires": AIRLOCK_SWEEP_SECONDS * 2},
    },
    # Retries that came due, events whose wake-up was lost, the email digest.
    "deliver-notifications": {
        "task": "agents.tasks.deliver_notifications",
        "schedule": AIRLOCK_SWEEP_SECONDS,
        "options": {"expires": AIRLOCK_SWEEP_SECONDS * 2},
    },
}

# -- reviewing: statistics (/reviews/stats/, docs/reviewing.md) -------------------------
# Approval fatigue: this many calls of one rule (or tool) approved unchanged in a row and
# the stats page offers a draft of a narrower allow rule (never applied by itself).
AIRLOCK_FATIGUE_STREAK = env_int("AIRLOCK_FATIGUE_STREAK", 20)
if AIRLOCK_FATIGUE_STREAK < 2:
    raise EnvError("AIRLOCK_FATIGUE_STREAK must be at least 2")

# -- operations: metrics and traces -------------------------------------------------
# GET /metrics answers only a bearer of this token; unset, the endpoint is 404.
AIRLOCK_METRICS_TOKEN = env_str("AIRLOCK_METRICS_TOKEN", "")
# A transition is folded into the counters once it is this old (agents/ops/metrics.py).
AIRLOCK_METRICS_FOLD_LAG_SECONDS = env_float("AIRLOCK_METRICS_FOLD_LAG_SECONDS", 10.0)
# OpenTelemetry traces, off unless an OTLP endpoint is set (the standard OTEL_*
# variables configure the exporter); arguments and results only with CAPTURE_CONTENT.
AIRLOCK_OTEL = bool(env_str("OTEL_EXPORTER_OTLP_ENDPOINT", "") or env_str("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", ""))
AIRLOCK_OTEL_CAPTURE_CONTENT = env_bool("AIRLOCK_OTEL_CAPTURE_CONTENT", False)
