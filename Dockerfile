# Hubbub image: gunicorn + uvicorn workers, locked dependencies, non-root.
#
#   docker build -t hubbub .
#   docker build --build-arg BASE_IMAGE=my-registry/python:3.11-slim -t hubbub .
#
# BASE_IMAGE must provide Python 3.11+ with venv (the official slim images do).
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
ENV UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/opt/hubbub/venv \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_SYSTEM_CERTS=1
RUN python3 -m venv /opt/uv && /opt/uv/bin/pip install --no-cache-dir uv==0.13.9
WORKDIR /src
COPY pyproject.toml uv.lock ./
# Only the runtime dependencies, exactly as locked.
RUN /opt/uv/bin/uv sync --frozen --no-dev --no-cache

FROM ${BASE_IMAGE}
RUN groupadd --system --gid 10001 hubbub \
    && useradd --system --uid 10001 --gid hubbub --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin hubbub
WORKDIR /srv/hubbub
COPY --from=build /opt/hubbub/venv /opt/hubbub/venv
COPY app/ app/
COPY deploy/gunicorn.conf.py deploy/gunicorn.conf.py
ENV PATH=/opt/hubbub/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    CHAT_HOST=0.0.0.0 \
    CHAT_PORT=8000 \
    CHAT_METRICS_HOST=0.0.0.0 \
    CHAT_METRICS_PORT=9100
USER 10001:10001
# 8000: chat (WebSocket /ws, HTTP); 9100: /metrics only, for Prometheus, never proxied.
EXPOSE 8000 9100
# Liveness of the event loop (GET /healthz on CHAT_PORT); readiness (/readyz) is the
# orchestrator's or the proxy's job.
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 \
    CMD ["python", "-m", "app.ops.healthcheck"]
# SIGTERM drains: readiness fails, sockets get 1012 over CHAT_DRAIN_WINDOW_S, then exit.
STOPSIGNAL SIGTERM
CMD ["gunicorn", "-c", "deploy/gunicorn.conf.py"]
