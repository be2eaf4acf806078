# Airlock: one image for web (gunicorn + whitenoise), worker and beat (celery).
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    AIRLOCK_VAR_DIR=/app/var

WORKDIR /app
RUN useradd --create-home --uid 10001 airlock

# Editable, because settings find templates/ and static/ next to the code (BASE_DIR).
COPY . .
RUN pip install -e '.[deploy]'
RUN mkdir -p /app/var && chown -R airlock:airlock /app/var
USER airlock

EXPOSE 8000
# docker-compose.yml runs migrate + collectstatic before gunicorn, and starts the worker
# and beat from the same image with other commands.
# config/gunicorn.py: threaded workers, so agents waiting on held calls never stop the pages.
CMD ["gunicorn", "-c", "config/gunicorn.py", "config.wsgi:application"]
