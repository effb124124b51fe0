# syntax=docker/dockerfile:1
# One image for the three services; the Kubernetes manifests pick the command:
#   gpupilot-exporter   (deploy/exporter, DaemonSet)
#   gpupilot-adapter    (deploy/adapter, Deployment)
#   gpupilot-rightsizer (deploy/rightsizer, Deployment)
# Build: docker build -t ghcr.io/gpupilot/gpupilot:0.1.0 .

# --- build: wheels for gpupilot and every dependency -------------------------------------------
FROM python:3.11-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
# Only what the distribution is built from (see .dockerignore): pyproject, README, the packages.
COPY pyproject.toml README.md ./
COPY mig_geometry/ mig_geometry/
COPY gpupilot_common/ gpupilot_common/
COPY exporter/ exporter/
COPY adapter/ adapter/
COPY rightsizer/ rightsizer/
COPY devkit/ devkit/
RUN python -m pip wheel --wheel-dir /wheels .

# --- runtime ----------------------------------------------------------------------------------
FROM python:3.11-slim
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    MPLCONFIGDIR=/tmp/matplotlib
RUN groupadd --system --gid 65532 gpupilot \
 && useradd --system --uid 65532 --gid 65532 --home-dir /nonexistent --no-create-home \
        --shell /usr/sbin/nologin gpupilot
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m pip install --no-index --find-links=/wheels gpupilot \
 && gpupilot-exporter --help >/dev/null \
 && gpupilot-adapter --help >/dev/null \
 && gpupilot-rightsizer --help >/dev/null
# Non-root by default. The exporter's DaemonSet runs it as uid 0 with every capability dropped,
# only to reach the kubelet's root-owned pod-resources socket (see deploy/exporter).
USER 65532:65532
# 9400 exporter /metrics; 6443 adapter (HTTPS); 9500 rightsizer /health and /metrics.
EXPOSE 9400 6443 9500
ENTRYPOINT []
CMD ["gpupilot-exporter", "--help"]
