# The gate service image: `gate serve` reading /etc/gate/config.yaml (a ConfigMap in Kubernetes).
# Build: docker build -t kafka-gate:0.1.0 .
ARG PYTHON_VERSION=3.12

FROM python:${PYTHON_VERSION}-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gate ./gate
COPY sdk ./sdk
# Every dependency ships binary wheels: the image needs no compiler (without setup.py, the
# SDK's engine core, which the gate does not run, installs as pure Python). Byte code is compiled
# here, so the read-only root filesystem at run time costs nothing.
RUN python -m venv /opt/gate \
    && /opt/gate/bin/pip install --only-binary=:all: . \
    && /opt/gate/bin/pip uninstall --yes pip

FROM python:${PYTHON_VERSION}-slim
LABEL org.opencontainers.image.title="kafka-gate" \
      org.opencontainers.image.description="Cross-service consumer-group dependency gate for Kafka" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 gate \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin gate
COPY --from=build /opt/gate /opt/gate
ENV PATH=/opt/gate/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    GATE_CONFIG=/etc/gate/config.yaml \
    GATE_HTTP_HOST=0.0.0.0
USER 10001:10001
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('GATE_HTTP_PORT', '8080') + '/healthz', timeout=2)"]
ENTRYPOINT ["gate", "serve"]
