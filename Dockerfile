# syntax=docker/dockerfile:1
# One image per service, each with only its own dependencies (measured with
# `python -m devkit.image_contents`: the exporter is pulled on every GPU node and holds no scipy,
# pandas, matplotlib, numpy, aiohttp or kubernetes client). `make images` builds all three without a
# Docker engine (buildah, see devkit/images.py); by hand, with any builder:
#   python -m pip wheel --wheel-dir dist/images/wheels '.[exporter,adapter,rightsizer]'
#   buildah build --build-arg BASE=IMAGE --target exporter -t gpupilot-exporter:0.1.0 .
# BASE: a Debian bookworm root file system with python3, python3-venv and ca-certificates
# (`make images` builds it with mmdebstrap from Debian's packages; debian:bookworm-slim plus those
# three packages is the same thing from a registry).
# The wheels come from the build host's own pip settings (its index, mirror or proxy): the image
# build needs no network and no index settings, and none are left in the image.
ARG BASE=localhost/gpupilot-base:bookworm

# --- the runtime every service starts from ----------------------------------------------------
FROM ${BASE} AS runtime
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    PATH=/opt/gpupilot/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
RUN echo 'gpupilot:x:65532:65532:gpupilot:/nonexistent:/usr/sbin/nologin' >> /etc/passwd \
 && echo 'gpupilot:x:65532:' >> /etc/group \
 && python3 -m venv /opt/gpupilot

# --- adapter -----------------------------------------------------------------------------------
FROM runtime AS adapter
RUN --mount=type=bind,source=dist/images/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels 'gpupilot[adapter]' \
 && pip uninstall --yes pip \
 && gpupilot-adapter --help >/dev/null
USER 65532:65532
EXPOSE 6443
ENTRYPOINT ["gpupilot-adapter"]
CMD ["--help"]

# --- rightsizer --------------------------------------------------------------------------------
FROM runtime AS rightsizer
ENV MPLCONFIGDIR=/tmp/matplotlib
RUN --mount=type=bind,source=dist/images/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels 'gpupilot[rightsizer]' \
 && pip uninstall --yes pip \
 && gpupilot-rightsizer --help >/dev/null
USER 65532:65532
EXPOSE 9500
ENTRYPOINT ["gpupilot-rightsizer"]
CMD ["--help"]

# --- exporter (last: the default target) --------------------------------------------------------
FROM runtime AS exporter
RUN --mount=type=bind,source=dist/images/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels 'gpupilot[exporter]' \
 && pip uninstall --yes pip \
 && gpupilot-exporter --help >/dev/null
# The read-only cross-check against nvidia-smi, run in the pod to see the pod's own privileges:
#   kubectl -n gpupilot exec POD -- gpu-check
COPY --chmod=0755 scripts/gpu-check /usr/local/bin/gpu-check
# Non-root by default. The exporter's DaemonSet runs it as uid 0 (the kubelet's root-owned
# pod-resources socket) with CAP_SYS_ADMIN only (see deploy/exporter).
USER 65532:65532
EXPOSE 9400
ENTRYPOINT ["gpupilot-exporter"]
CMD ["--help"]
