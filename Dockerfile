# syntax=docker/dockerfile:1
# One image per service, each with only its own dependencies (measured with
# `python -m devkit.image_contents`: site-packages of exporter 25 MiB, adapter 174 MiB,
# rightsizer 524 MiB, against 570 MiB for one image holding all three; the exporter is pulled on
# every GPU node and needs no scipy, pandas, matplotlib, numpy or kubernetes client):
#   docker build --target exporter   -t ghcr.io/gpupilot/gpupilot-exporter:0.1.0 .
#   docker build --target adapter    -t ghcr.io/gpupilot/gpupilot-adapter:0.1.0 .
#   docker build --target rightsizer -t ghcr.io/gpupilot/gpupilot-rightsizer:0.1.0 .

# --- build: wheels for gpupilot and every dependency of every service ---------------------------
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
COPY simulator/ simulator/
RUN python -m pip wheel --wheel-dir /wheels '.[exporter,simulator,adapter,rightsizer]'

# --- the runtime every service starts from ----------------------------------------------------
FROM python:3.11-slim AS runtime
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
RUN groupadd --system --gid 65532 gpupilot \
 && useradd --system --uid 65532 --gid 65532 --home-dir /nonexistent --no-create-home \
        --shell /usr/sbin/nologin gpupilot

# --- adapter -----------------------------------------------------------------------------------
FROM runtime AS adapter
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m pip install --no-index --find-links=/wheels 'gpupilot[adapter]' \
 && gpupilot-adapter --help >/dev/null
USER 65532:65532
EXPOSE 6443
CMD ["gpupilot-adapter", "--help"]

# --- rightsizer --------------------------------------------------------------------------------
FROM runtime AS rightsizer
ENV MPLCONFIGDIR=/tmp/matplotlib
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m pip install --no-index --find-links=/wheels 'gpupilot[rightsizer]' \
 && gpupilot-rightsizer --help >/dev/null
USER 65532:65532
EXPOSE 9500
CMD ["gpupilot-rightsizer", "--help"]

# --- exporter (last: the default target) --------------------------------------------------------
FROM runtime AS exporter
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m pip install --no-index --find-links=/wheels 'gpupilot[exporter]' \
 && gpupilot-exporter --help >/dev/null
# The read-only cross-check against nvidia-smi, run in the pod to see the pod's own privileges:
#   kubectl -n gpupilot exec POD -- gpu-check
COPY --chmod=0755 scripts/gpu-check /usr/local/bin/gpu-check
# Non-root by default. The exporter's DaemonSet runs it as uid 0 (the kubelet's root-owned
# pod-resources socket) with CAP_SYS_ADMIN only (see deploy/exporter).
USER 65532:65532
EXPOSE 9400
CMD ["gpupilot-exporter", "--help"]
